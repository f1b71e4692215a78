"""Typed settings from the environment and `.env`, checked once at start.

Every setting is declared once in `SETTINGS` (name, type, default, one-line help);
`.env.example` is generated from the same table, so the two cannot drift apart.
A bad value raises `SettingsError` with one line naming the setting.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Callable
from urllib.parse import urlparse
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from bot.redact import redact_url, secrets_in, shown


class SettingsError(ValueError):
    """A setting has a value Muninn cannot use; the message names it."""


@dataclass(frozen=True)
class Spec:
    """One setting: its environment variable, default (as text), help line and parser (name, raw) -> value;
    `kind` "secret" (never printed) or "url" (printed without its credentials: bot/redact.py)."""
    env: str
    default: str
    help: str
    parse: Callable[[str, str], Any]
    kind: str = ""


def _float(lo: float | None = None, hi: float | None = None, *, positive: bool = False):
    def parse(name: str, raw: str) -> float:
        try:
            value = float(raw)
        except ValueError:
            raise SettingsError(f"{name}={raw!r} is not a number") from None
        if positive and value <= 0:
            raise SettingsError(f"{name}={raw!r} must be greater than 0")
        if lo is not None and value < lo or hi is not None and value > hi:
            raise SettingsError(f"{name}={raw!r} must be between {lo} and {hi}")
        return value
    return parse


def _optional_float(lo: float, hi: float):
    """A number in [lo, hi], or empty for "decide automatically" (None)."""
    number = _float(lo, hi)

    def parse(name: str, raw: str) -> float | None:
        return None if raw.strip() == "" else number(name, raw)
    return parse


def _int(lo: int = 0, hi: int | None = None):
    def parse(name: str, raw: str) -> int:
        try:
            value = int(raw)
        except ValueError:
            raise SettingsError(f"{name}={raw!r} is not a whole number") from None
        if value < lo or (hi is not None and value > hi):
            bound = f"between {lo} and {hi}" if hi is not None else f"at least {lo}"
            raise SettingsError(f"{name}={raw!r} must be {bound}")
        return value
    return parse


def _str(name: str, raw: str) -> str:
    return raw


def _url(name: str, raw: str) -> str:
    raw = raw.strip()
    if not raw:
        return ""  # explicitly disabled
    parsed = urlparse(raw)
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise SettingsError(f"{name}={redact_url(raw)!r} must be an http(s) URL such as http://localhost:11434 (or empty to disable)")
    return raw.rstrip("/")


def _urls(name: str, raw: str) -> str:
    """One URL, or several separated by commas (several Ollama hosts); kept as one string."""
    parts = [part.strip() for part in raw.split(",")]
    if len(parts) > 1 and not all(parts):
        raise SettingsError(f"{name}={redact_url(raw)!r} has an empty entry; separate the URLs with single commas")
    return ",".join(dict.fromkeys(_url(name, part) for part in parts))


def _database_url(name: str, raw: str) -> str:
    """Empty (SQLite at MUNINN_DB_PATH) or a postgresql:// URL (the PostgreSQL backend)."""
    raw = raw.strip()
    if not raw:
        return ""
    parsed = urlparse(raw)
    if parsed.scheme not in ("postgresql", "postgres") or not (parsed.netloc or parsed.query):
        raise SettingsError(f"{name} must be a postgresql:// URL such as postgresql://muninn@localhost/muninn "
                            "(or empty for SQLite at MUNINN_DB_PATH)")
    return raw


def _path(name: str, raw: str) -> Path:
    if not raw.strip():
        raise SettingsError(f"{name} is empty; give a file path such as data/muninn.db")
    path = Path(raw).expanduser()
    if not path.is_absolute():
        path = (Path.cwd() / path).resolve()
    return path


def _timezone(name: str, raw: str) -> ZoneInfo:
    try:
        return ZoneInfo(raw)
    except (ZoneInfoNotFoundError, ValueError):
        raise SettingsError(f"{name}={raw!r} is not an IANA time zone such as Europe/Oslo or UTC") from None


def _fusion(name: str, raw: str) -> str:
    low = raw.strip().lower()
    if low not in ("scores", "ranks"):
        raise SettingsError(f"{name}={raw!r} must be scores or ranks")
    return low


def _bool(name: str, raw: str) -> bool:
    low = raw.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off", ""):
        return False
    raise SettingsError(f"{name}={raw!r} must be true or false")


def _id_list(name: str, raw: str) -> frozenset[int]:
    out = set()
    for part in raw.replace(";", ",").split(","):
        part = part.strip()
        if not part:
            continue
        if not part.isdigit():
            raise SettingsError(f"{name}: {part!r} is not a Discord id (digits only)")
        out.add(int(part))
    return frozenset(out)


def _shard_list(name: str, raw: str) -> tuple[int, ...]:
    out: list[int] = []
    for part in raw.replace(";", ",").split(","):
        part = part.strip()
        if not part:
            continue
        if not part.isdigit():
            raise SettingsError(f"{name}: {part!r} is not a shard id (a whole number from 0)")
        out.append(int(part))
    return tuple(sorted(set(out)))


SETTINGS: dict[str, Spec] = {
    "discord_token": Spec("DISCORD_TOKEN", "", "Bot token from https://discord.com/developers/applications (Bot > Reset Token).", _str, "secret"),
    "db_path": Spec("MUNINN_DB_PATH", "data/muninn.db", "SQLite file holding all memories; created on first start.", _path),
    "database_url": Spec("MUNINN_DATABASE_URL", "", "PostgreSQL instead of SQLite: postgresql://user:password@host/dbname (needs pgvector and `pip install muninn[postgres]`); empty = SQLite at MUNINN_DB_PATH.", _database_url, "url"),
    "ollama_url": Spec("OLLAMA_URL", "http://localhost:11434", "Ollama server address, or several separated by commas (each call goes to the least busy healthy one); empty disables embeddings and chat (FTS-only recall).", _urls, "url"),
    "chat_model": Spec("OLLAMA_CHAT_MODEL", "llama3.2", "Ollama model that writes replies and extracts facts (ollama pull it first).", _str),
    "embed_model": Spec("OLLAMA_EMBED_MODEL", "nomic-embed-text", "Ollama embedding model; changing it needs `muninn reindex`.", _str),
    "embed_timeout": Spec("OLLAMA_EMBED_TIMEOUT", "2.0", "Seconds to wait for one embedding call before recall falls back to FTS-only.", _float(positive=True)),
    "chat_timeout": Spec("OLLAMA_CHAT_TIMEOUT", "60", "Seconds to wait for a chat reply before Muninn says it cannot think right now.", _float(positive=True)),
    "ollama_retries": Spec("OLLAMA_RETRIES", "1", "Extra attempts after a connection error or 5xx (0 = no retry).", _int(0, 5)),
    "ollama_cooldown": Spec("OLLAMA_COOLDOWN", "15", "Seconds to skip a kind of Ollama call (embeddings, replies, background work, each on its own) after it failed; replies probe Ollama after 1 s and go through as soon as it answers again.", _float(0)),
    "ollama_concurrency": Spec("OLLAMA_MAX_CONCURRENCY", "2", "Most chat requests sent to Ollama at once.", _int(1, 64)),
    "recall_limit": Spec("MUNINN_RECALL_LIMIT", "5", "Memories recalled per message before graph augmentation.", _int(1, 100)),
    "graph_limit": Spec("MUNINN_GRAPH_LIMIT", "3", "Most linked memories added by the 1-hop graph walk.", _int(0, 50)),
    "rrf_k": Spec("MUNINN_RRF_K", "3", "Reciprocal Rank Fusion constant k, with MUNINN_FUSION=ranks (small = trust the top ranks).", _float(positive=True)),
    "rrf_weight_fts": Spec("MUNINN_RRF_WEIGHT_FTS", "1.0", "Weight of the keyword (FTS5) path in rank fusion (MUNINN_FUSION=ranks).", _float(0)),
    "rrf_weight_vec": Spec("MUNINN_RRF_WEIGHT_VEC", "0.8", "Weight of the vector path in rank fusion (MUNINN_FUSION=ranks).", _float(0)),
    "neighbour_share": Spec("MUNINN_NEIGHBOUR_SHARE", "0.5", "Share of a hit's fusion score lent to the memories stored just before and after it (0 = off).", _float(0, 2)),
    "time_weight": Spec("MUNINN_TIME_WEIGHT", "0.02", "Ranking: how much retention and importance may lift a memory (score = relevance x (1 + weight x vitality)); small, so time breaks near-ties and never buries relevance (README, Ranking).", _float(0, 10)),
    "date_boost": Spec("MUNINN_DATE_BOOST", "1.0", "Ranking: lift for memories stored on a day or in a month the question names (\"on 7 July\", \"in August\"): score x (1 + boost).", _float(0, 10)),
    "keyword_lead": Spec("MUNINN_KEYWORD_LEAD", "1.1", "Ranking: the best keyword (BM25) match goes first when it beats the runner-up keyword match by this factor (0 = off).", _float(0, 100)),
    "touch_min_cosine": Spec("MUNINN_TOUCH_MIN_COSINE", "", "Cosine to the query a recalled memory needs to be strengthened (touched); empty = the floor measured for the embedding model, or half the best hit's cosine for a model not measured (bot/memory/recall/ranking.py).", _optional_float(-1.0, 1.0)),
    "fusion": Spec("MUNINN_FUSION", "scores", "Recall: how the keyword and vector paths become one list: scores (each memory's BM25 relative to the best keyword hit and its cosine, weighed by how well the two paths agree, with a share of rank fusion) or ranks (Reciprocal Rank Fusion alone, MUNINN_RRF_*) (bot/memory/recall/fusion.py).", _fusion),
    "fusion_vector_share": Spec("MUNINN_FUSION_VECTOR_SHARE", "0.6", "Recall, score fusion: the vector path's share of the fused score (0 = keywords only, 1 = meaning only); chosen by cross-validation over LoCoMo and BEAM conversations (bench/README.md).", _float(0, 1)),
    "inject_min_cosine": Spec("MUNINN_INJECT_MIN_COSINE", "", "Relevance floor: the cosine to the message a recalled memory needs to be put into the prompt, so a question about something never discussed gets no memories; empty = the floor measured for the embedding model (none for a model not measured); -1 = off.", _optional_float(-1.0, 1.0)),
    "base_stability_days": Spec("MUNINN_BASE_STABILITY_DAYS", "7", "Decay: days until an unimportant, never-recalled memory falls to 37% retention.", _float(positive=True)),
    "stability_growth": Spec("MUNINN_STABILITY_GROWTH", "1.5", "Decay: factor by which each recall multiplies a memory's stability.", _float(1.0, 10.0)),
    "timezone": Spec("MUNINN_TIMEZONE", "UTC", "Time zone for the timestamps shown to the LLM.", _timezone),
    "persona": Spec("MUNINN_PERSONA", "You are Muninn, a friendly assistant with a long-term memory.", "First line of the system prompt.", _str),
    "history_limit": Spec("MUNINN_HISTORY_LIMIT", "10", "Recent channel messages put into the prompt.", _int(0, 100)),
    "history_keep": Spec("MUNINN_HISTORY_KEEP", "200", "Messages kept per channel in the local history; older ones are deleted.", _int(100, 1_000_000)),
    "token_budget": Spec("MUNINN_TOKEN_BUDGET", "4000", "Approximate prompt size limit in tokens; oldest history is cut first.", _int(256)),
    "owner_ids": Spec("MUNINN_OWNER_IDS", "", "Comma-separated Discord user ids allowed to manage global memories (default: the application owner).", _id_list),
    "always_answer_channels": Spec("MUNINN_ALWAYS_ANSWER_CHANNELS", "", "Comma-separated channel ids where Muninn answers every message without being mentioned (admins can also toggle it with /always-answer).", _id_list),
    "reply_queue_limit": Spec("MUNINN_REPLY_QUEUE_LIMIT", "20", "Most messages waiting for an answer in one channel; beyond it messages are only recorded, so a flood cannot pile up work.", _int(1, 1000)),
    "rate_per_minute": Spec("MUNINN_RATE_PER_MINUTE", "6", "Fair share: messages a minute Muninn answers from one person, over all channels and DMs together (after a quick run of MUNINN_RATE_BURST); the others are kept as context, not answered, and get a quiet sign (a 🐢 reaction) at most once a minute; 0 = no limit.", _int(0, 10_000)),
    "rate_burst": Spec("MUNINN_RATE_BURST", "4", "Fair share: messages one person may send in a quick run before MUNINN_RATE_PER_MINUTE holds them back.", _int(1, 1000)),
    "learn_per_day": Spec("MUNINN_LEARN_PER_DAY", "30", "Fair share: most new memories Muninn learns from one person in one channel (or DM) in 24 hours; their further facts are dropped until then (a fact repeated still strengthens the memory that holds it); 0 = no cap.", _int(0, 1_000_000)),
    "stream_replies": Spec("MUNINN_STREAM_REPLIES", "true", "Show replies on Discord as they are written (one message, edited about once a second) instead of all at once.", _bool),
    "shutdown_seconds": Spec("MUNINN_SHUTDOWN_SECONDS", "10", "On SIGTERM or Ctrl-C: seconds to finish replies in flight, then as many to save facts waiting for extraction, before stopping.", _float(0, 600)),
    "shard_count": Spec("MUNINN_SHARD_COUNT", "0", "Several bot processes on one database: the total number of Discord shards (0 = one process, no sharding; docs in README, Scaling out).", _int(0, 100_000)),
    "shard_ids": Spec("MUNINN_SHARD_IDS", "", "With MUNINN_SHARD_COUNT: the comma-separated shard ids this process serves (e.g. 0,1); empty = all of them.", _shard_list),
    "extraction": Spec("MUNINN_EXTRACTION", "true", "Extract facts to remember from each exchange.", _bool),
    "dedup_cosine": Spec("MUNINN_DEDUP_COSINE", "0.92", "Lifecycle: cosine at or above which a new fact (same scope and owner) reinforces an existing memory instead of being stored; also the consolidation threshold (docs/lifecycle.md).", _float(0.0, 1.0)),
    "update_cosine": Spec("MUNINN_UPDATE_COSINE", "0.5", "Lifecycle: cosine at or above which an older memory of the same subject is shown to the LLM to decide whether the new fact replaces it.", _float(0.0, 1.0)),
    "link_cosine": Spec("MUNINN_LINK_COSINE", "0.6", "Lifecycle: cosine at or above which two memories of the same scope and owner get a semantic link.", _float(0.0, 1.0)),
    "archive_retention": Spec("MUNINN_ARCHIVE_RETENTION", "0.05", "Decay: maintenance archives a memory whose retention fell below this (and whose importance is low).", _float(0.0, 1.0)),
    "archive_importance": Spec("MUNINN_ARCHIVE_IMPORTANCE", "0.4", "Decay: only memories with importance below this are ever archived by decay.", _float(0.0, 1.0)),
    "maintenance_hours": Spec("MUNINN_MAINTENANCE_HOURS", "6", "Hours between automatic maintenance runs in the bot (decay, embeddings, links, consolidation); 0 = never.", _float(0)),
    "guild_retention_days": Spec("MUNINN_GUILD_RETENTION_DAYS", "30", "Days Muninn keeps what it learned in a server after being removed from it (its room and personal memories, history, channel options); maintenance purges it then, unless Muninn was added back. 0 = at the next maintenance run.", _float(0, 36500)),
    "db_readers": Spec("MUNINN_DB_READERS", "3", "Database connections that serve recalls beside the one writer (WAL lets readers run while it writes).", _int(1, 32)),
    "vector_cache_mb": Spec("MUNINN_VECTOR_CACHE_MB", "4096", "Most memory for the vectors kept in RAM for fast search (float32, per visibility key; it takes only what the vectors need: ~3.2 GB for 1M 768-dim vectors, ~390 MB for 100k); keys beyond it are searched inside sqlite-vec, much slower. Lower it on a small host.", _int(0)),
    "vector_codes_min": Spec("MUNINN_VECTOR_CODES_MIN", "20000", "A viewer who sees at least this many vectors (over all their visibility keys) has them searched by sign-bit codes first (1 bit per dimension), then the best ~2 % of them (at least 256) are scored exactly (about 0.98 of the exact top 10 on real embeddings, measured on 4.4k MiniLM turns, at a fraction of the cost); viewers who see fewer and searches as of a past moment stay exact; 0 = always exact.", _int(0)),
    "log_level": Spec("MUNINN_LOG_LEVEL", "INFO", "Logging level: DEBUG, INFO, WARNING or ERROR.", _str),
}


@dataclass(frozen=True)
class Settings:
    """All settings, parsed and checked (load_settings); one field per entry of SETTINGS."""
    discord_token: str
    db_path: Path
    database_url: str
    ollama_url: str
    chat_model: str
    embed_model: str
    embed_timeout: float
    chat_timeout: float
    ollama_retries: int
    ollama_cooldown: float
    ollama_concurrency: int
    recall_limit: int
    graph_limit: int
    rrf_k: float
    rrf_weight_fts: float
    rrf_weight_vec: float
    neighbour_share: float
    time_weight: float
    date_boost: float
    keyword_lead: float
    touch_min_cosine: float | None
    fusion: str
    fusion_vector_share: float
    inject_min_cosine: float | None
    base_stability_days: float
    stability_growth: float
    timezone: ZoneInfo
    persona: str
    history_limit: int
    history_keep: int
    token_budget: int
    owner_ids: frozenset[int]
    always_answer_channels: frozenset[int]
    reply_queue_limit: int
    rate_per_minute: int
    rate_burst: int
    learn_per_day: int
    stream_replies: bool
    shutdown_seconds: float
    shard_count: int
    shard_ids: tuple[int, ...]
    extraction: bool
    dedup_cosine: float
    update_cosine: float
    link_cosine: float
    archive_retention: float
    archive_importance: float
    maintenance_hours: float
    guild_retention_days: float
    db_readers: int
    vector_cache_mb: int
    vector_codes_min: int
    log_level: str

    def shown(self, key: str) -> str:
        """The setting `key` as it may be printed: tokens and URL credentials as `***` (bot/redact.py)."""
        return shown(SETTINGS[key].kind, getattr(self, key))

    def secrets(self) -> set[str]:
        """Every value that must never be printed: the token, the passwords inside the URLs."""
        return {secret for key, spec in SETTINGS.items() for secret in secrets_in(spec.kind, str(getattr(self, key)))}

    def replace(self, **changes: Any) -> "Settings":
        """A copy with `changes` applied; the new values are not checked again."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values.update(changes)
        return Settings(**values)


def load_settings(env: dict[str, str] | None = None, *, dotenv: bool = True, **overrides: Any) -> Settings:
    """Read settings from `env` (default: os.environ after loading `.env`)."""
    if env is None:
        if dotenv:
            from dotenv import load_dotenv
            load_dotenv(Path.cwd() / ".env", override=False)
        env = dict(os.environ)
    values: dict[str, Any] = {}
    for key, spec in SETTINGS.items():
        raw = env.get(spec.env, spec.default)
        values[key] = spec.parse(spec.env, raw)
    level = str(values["log_level"]).upper()
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise SettingsError(f"MUNINN_LOG_LEVEL={values['log_level']!r} must be DEBUG, INFO, WARNING or ERROR")
    values["log_level"] = level
    if values["shard_ids"] and not values["shard_count"]:
        raise SettingsError("MUNINN_SHARD_IDS is set but MUNINN_SHARD_COUNT is not; set the total number of shards")
    if any(shard >= values["shard_count"] for shard in values["shard_ids"]):
        raise SettingsError(f"MUNINN_SHARD_IDS={','.join(map(str, values['shard_ids']))} must be below "
                            f"MUNINN_SHARD_COUNT={values['shard_count']} (shards count from 0)")
    values.update(overrides)
    if isinstance(values["db_path"], str):
        values["db_path"] = _path("MUNINN_DB_PATH", values["db_path"])
    check_db_path(values["db_path"])
    return Settings(**values)


def check_db_path(path: Path, name: str = "MUNINN_DB_PATH") -> None:
    """Fail early, in one line, when the database file cannot be created or opened."""
    if path.exists():
        if path.is_dir():
            raise SettingsError(f"{name}={str(path)!r} is a directory; give a file path such as data/muninn.db")
        if not os.access(path, os.R_OK | os.W_OK):
            raise SettingsError(f"{name}={str(path)!r} is not readable and writable by this user")
        return
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise SettingsError(f"{name}={str(path)!r}: cannot create the file there (folder {str(parent)!r} is not writable)")


def env_example() -> str:
    """The text of `.env.example`: every setting with its default and what it does."""
    lines = ["# Muninn settings. Copy to .env and edit; every line shows the default.", ""]
    for spec in SETTINGS.values():
        lines.append(f"# {spec.help}")
        lines.append(f"{spec.env}={spec.default}")
        lines.append("")
    return "\n".join(lines)
