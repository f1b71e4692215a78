"""Typed settings from the environment and `.env`, checked once at start.

Every setting is declared once in `SETTINGS` (name, type, default, one-line help);
`.env.example` is generated from the same table, so the two cannot drift apart.
A bad value raises `SettingsError` with one line naming the setting.
"""
from __future__ import annotations

import os
import textwrap
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Callable
from zoneinfo import ZoneInfo

from bot.redact import secrets_in, shown
from bot.setting_values import (  # noqa: F401  (SettingsError: every caller imports it from here)
    SettingsError,
    _bool,
    _choice,
    _database_url,
    _float,
    _id_list,
    _int,
    _optional_float,
    _optional_int,
    _optional_port,
    _path,
    _shard_list,
    _str,
    _timezone,
    _token,
    _url,
    _urls,
    check_api_keys,
)

# The sections of `.env.example`, in the order it lists them. A row names its section; one that
# names none lands under OTHER, and every row that is not `essential` is written commented out.
DISCORD, OLLAMA, DATABASE = "Discord", "LLM servers (Ollama, or OpenAI-compatible)", "Database"
CONVERSATION, RECALL, LIFECYCLE = "Conversation", "Recall and ranking", "Memory lifecycle"
FAIR_SHARE, SCALING, LOGGING, OTHER = "Fair share", "Scaling out", "Logging", "Other"
OPERATIONS = "Health, metrics and the console"
SECTIONS = (DISCORD, OLLAMA, DATABASE, CONVERSATION, RECALL, LIFECYCLE, FAIR_SHARE, SCALING, OPERATIONS, LOGGING, OTHER)


@dataclass(frozen=True)
class Spec:
    """One setting: its environment variable, default (as text), help line and parser (name, raw) -> value;
    `kind` "secret" (never printed) or "url" (printed without its credentials: bot/redact.py).
    `.env.example` lists it under `section`: uncommented at the top when `essential` (what every
    install sets), else commented out under "Advanced", so copying the file pins no tuning default."""
    env: str
    default: str
    help: str
    parse: Callable[[str, str], Any]
    kind: str = ""
    section: str = OTHER
    essential: bool = False


SETTINGS: dict[str, Spec] = {
    "discord_token": Spec("DISCORD_TOKEN", "", "Bot token from https://discord.com/developers/applications (Bot > Reset Token); only the Discord bot needs it, not `muninn chat`.", _str, "secret", section=DISCORD, essential=True),
    "db_path": Spec("MUNINN_DB_PATH", "data/muninn.db", "SQLite file holding all memories, created (private) at first use; a relative path is taken from the folder of the .env that sets it.", _path, section=DATABASE, essential=True),
    "database_url": Spec("MUNINN_DATABASE_URL", "", "PostgreSQL instead of SQLite: postgresql://user:password@host/dbname (needs pgvector and `pip install 'muninn-bot[postgres]'`); empty = SQLite at MUNINN_DB_PATH.", _database_url, "url", section=DATABASE),
    "ollama_url": Spec("OLLAMA_URL", "http://localhost:11434", "Ollama server address, or several separated by commas (each call goes to the least busy healthy one); empty disables embeddings and chat (keyword-only recall).", _urls, "url", section=OLLAMA, essential=True),
    "chat_model": Spec("OLLAMA_CHAT_MODEL", "llama3.2", "Model that writes replies and extracts facts (ollama pull it first; on an openai-kind server, a model /v1/models lists).", _str, section=OLLAMA, essential=True),
    "embed_model": Spec("OLLAMA_EMBED_MODEL", "nomic-embed-text", "Embedding model (on an openai-kind server, a model /v1/models lists); changing it needs `muninn reindex`.", _str, section=OLLAMA, essential=True),
    "embed_timeout": Spec("OLLAMA_EMBED_TIMEOUT", "2.0", "Seconds to wait for one embedding call before recall falls back to FTS-only.", _float(positive=True), section=OLLAMA),
    "chat_timeout": Spec("OLLAMA_CHAT_TIMEOUT", "60", "Seconds to wait for a chat reply before Muninn says it cannot think right now.", _float(positive=True), section=OLLAMA),
    "ollama_retries": Spec("OLLAMA_RETRIES", "1", "Extra attempts after a connection error or 5xx (0 = no retry).", _int(0, 5), section=OLLAMA),
    "ollama_cooldown": Spec("OLLAMA_COOLDOWN", "15", "Seconds to skip a kind of Ollama call (embeddings, replies, background work, each on its own) after it failed; replies probe Ollama after 1 s and go through as soon as it answers again.", _float(0), section=OLLAMA),
    "ollama_concurrency": Spec("OLLAMA_MAX_CONCURRENCY", "2", "Most chat requests sent to Ollama at once.", _int(1, 64), section=OLLAMA),
    "recall_limit": Spec("MUNINN_RECALL_LIMIT", "5", "Memories recalled per message before graph augmentation.", _int(1, 100), section=RECALL),
    "graph_limit": Spec("MUNINN_GRAPH_LIMIT", "3", "Most linked memories added by the 1-hop graph walk.", _int(0, 50), section=RECALL),
    "rrf_k": Spec("MUNINN_RRF_K", "3", "Reciprocal Rank Fusion constant k, with MUNINN_FUSION=ranks (small = trust the top ranks).", _float(positive=True), section=RECALL),
    "rrf_weight_fts": Spec("MUNINN_RRF_WEIGHT_FTS", "1.0", "Weight of the keyword (FTS5) path in rank fusion (MUNINN_FUSION=ranks).", _float(0), section=RECALL),
    "rrf_weight_vec": Spec("MUNINN_RRF_WEIGHT_VEC", "0.8", "Weight of the vector path in rank fusion (MUNINN_FUSION=ranks).", _float(0), section=RECALL),
    "neighbour_share": Spec("MUNINN_NEIGHBOUR_SHARE", "0.5", "Share of a hit's fusion score lent to the memories stored just before and after it (0 = off).", _float(0, 2), section=RECALL),
    "time_weight": Spec("MUNINN_TIME_WEIGHT", "0.02", "Ranking: how much retention and importance may lift a memory (score = relevance x (1 + weight x vitality)); small, so time breaks near-ties and never buries relevance (docs/architecture.md, Ranking).", _float(0, 10), section=RECALL),
    "date_boost": Spec("MUNINN_DATE_BOOST", "1.0", "Ranking: lift for memories stored on a day or in a month the question names (\"on 7 July\", \"in August\"): score x (1 + boost).", _float(0, 10), section=RECALL),
    "keyword_lead": Spec("MUNINN_KEYWORD_LEAD", "1.1", "Ranking: the best keyword (BM25) match goes first when it beats the runner-up keyword match by this factor (0 = off).", _float(0, 100), section=RECALL),
    "touch_min_cosine": Spec("MUNINN_TOUCH_MIN_COSINE", "", "Cosine to the query a recalled memory needs to be strengthened (touched); empty = the floor measured for the embedding model, or half the best hit's cosine for a model not measured (bot/memory/recall/ranking.py).", _optional_float(-1.0, 1.0), section=RECALL),
    "base_stability_days": Spec("MUNINN_BASE_STABILITY_DAYS", "7", "Decay: days until an unimportant, never-recalled memory falls to 37% retention.", _float(positive=True), section=LIFECYCLE),
    "stability_growth": Spec("MUNINN_STABILITY_GROWTH", "1.5", "Decay: factor by which each recall multiplies a memory's stability.", _float(1.0, 10.0), section=LIFECYCLE),
    "timezone": Spec("MUNINN_TIMEZONE", "UTC", "Time zone for the timestamps shown to the LLM.", _timezone, section=CONVERSATION),
    "persona": Spec("MUNINN_PERSONA", "You are Muninn, a friendly assistant with a long-term memory.", "First line of the system prompt.", _str, section=CONVERSATION),
    "history_limit": Spec("MUNINN_HISTORY_LIMIT", "10", "Recent channel messages put into the prompt.", _int(0, 100), section=CONVERSATION),
    "history_keep": Spec("MUNINN_HISTORY_KEEP", "200", "Messages kept per channel in the local history; older ones are deleted.", _int(100, 1_000_000), section=CONVERSATION),
    "token_budget": Spec("MUNINN_TOKEN_BUDGET", "4000", "Approximate prompt size limit in tokens; oldest history is cut first.", _int(256), section=CONVERSATION),
    "owner_ids": Spec("MUNINN_OWNER_IDS", "", "Comma-separated Discord user ids allowed to manage global memories (default: the application owner).", _id_list, section=DISCORD),
    "always_answer_channels": Spec("MUNINN_ALWAYS_ANSWER_CHANNELS", "", "Comma-separated channel ids where Muninn answers every message without being mentioned (a channel manager can change it with /settings set answer).", _id_list, section=DISCORD),
    "reply_queue_limit": Spec("MUNINN_REPLY_QUEUE_LIMIT", "20", "Most messages waiting for an answer in one channel; beyond it messages are only recorded, so a flood cannot pile up work.", _int(1, 1000), section=DISCORD),
    "rate_per_minute": Spec("MUNINN_RATE_PER_MINUTE", "6", "Fair share: messages a minute Muninn answers from one person, over all channels and DMs together (after a quick run of MUNINN_RATE_BURST); the others are kept as context, not answered, and get a quiet sign (a 🐢 reaction) at most once a minute; 0 = no limit.", _int(0, 10_000), section=FAIR_SHARE),
    "rate_burst": Spec("MUNINN_RATE_BURST", "4", "Fair share: messages one person may send in a quick run before MUNINN_RATE_PER_MINUTE holds them back.", _int(1, 1000), section=FAIR_SHARE),
    "learn_per_day": Spec("MUNINN_LEARN_PER_DAY", "30", "Fair share: most new memories Muninn learns from one person in one channel (or DM) in 24 hours; their further facts are dropped until then (a fact repeated still strengthens the memory that holds it); 0 = no cap.", _int(0, 1_000_000), section=FAIR_SHARE),
    "stream_replies": Spec("MUNINN_STREAM_REPLIES", "true", "Show replies on Discord as they are written (one message, edited about once a second) instead of all at once.", _bool, section=DISCORD),
    "shutdown_seconds": Spec("MUNINN_SHUTDOWN_SECONDS", "10", "On SIGTERM or Ctrl-C: seconds to finish replies in flight, then as many to save facts waiting for extraction, before stopping.", _float(0, 600), section=DISCORD),
    "shard_count": Spec("MUNINN_SHARD_COUNT", "0", "Several bot processes on one database: the total number of Discord shards (0 = one process, no sharding; docs/operations.md, Several bot processes).", _int(0, 100_000), section=SCALING),
    "shard_ids": Spec("MUNINN_SHARD_IDS", "", "With MUNINN_SHARD_COUNT: the comma-separated shard ids this process serves (e.g. 0,1); empty = all of them.", _shard_list, section=SCALING),
    "extraction": Spec("MUNINN_EXTRACTION", "true", "Extract facts to remember from each exchange.", _bool, section=LIFECYCLE),
    "dedup_cosine": Spec("MUNINN_DEDUP_COSINE", "0.92", "Lifecycle: cosine at or above which a new fact (same scope and owner) reinforces an existing memory instead of being stored; also the consolidation threshold (docs/lifecycle.md).", _float(0.0, 1.0), section=LIFECYCLE),
    "update_cosine": Spec("MUNINN_UPDATE_COSINE", "0.5", "Lifecycle: cosine at or above which an older memory of the same subject is shown to the LLM to decide whether the new fact replaces it.", _float(0.0, 1.0), section=LIFECYCLE),
    "link_cosine": Spec("MUNINN_LINK_COSINE", "0.6", "Lifecycle: cosine at or above which two memories of the same scope and owner get a semantic link.", _float(0.0, 1.0), section=LIFECYCLE),
    "archive_retention": Spec("MUNINN_ARCHIVE_RETENTION", "0.05", "Decay: maintenance archives a memory whose retention fell below this (and whose importance is low).", _float(0.0, 1.0), section=LIFECYCLE),
    "archive_importance": Spec("MUNINN_ARCHIVE_IMPORTANCE", "0.4", "Decay: only memories with importance below this are ever archived by decay.", _float(0.0, 1.0), section=LIFECYCLE),
    "maintenance_hours": Spec("MUNINN_MAINTENANCE_HOURS", "6", "Hours between automatic maintenance runs in the bot (decay, embeddings, links, consolidation); 0 = never.", _float(0), section=LIFECYCLE),
    "guild_retention_days": Spec("MUNINN_GUILD_RETENTION_DAYS", "30", "Days Muninn keeps what it learned in a server after being removed from it (its room and personal memories, history, channel options); maintenance purges it then, unless Muninn was added back. 0 = at the next maintenance run.", _float(0, 36500), section=LIFECYCLE),
    "db_readers": Spec("MUNINN_DB_READERS", "", "Database connections (each a thread) that serve recalls beside the one writer (WAL lets readers run while it writes); empty = 2 on SQLite, 1 on SQLite in a process serving only some of the shards (MUNINN_SHARD_IDS a part of MUNINN_SHARD_COUNT: the other shards' processes share the machine's cores), 3 on PostgreSQL (where reads wait on the server). Set it to override (docs/operations.md, Read threads and shard processes).", _optional_int(1, 32), section=DATABASE),
    "vector_cache_mb": Spec("MUNINN_VECTOR_CACHE_MB", "4096", "Most memory for the vectors kept in RAM for fast search (per visibility key, in MUNINN_VECTOR_FORM; it takes only what the vectors need: int8 about a quarter of float32, docs/performance.md, Memory); keys beyond it are searched inside the database, much slower. Lower it on a small host.", _int(0), section=DATABASE),
    "vector_codes_min": Spec("MUNINN_VECTOR_CODES_MIN", "20000", "A viewer who sees at least this many vectors (over all their visibility keys) has them ranked first by sign-bit codes (1 bit per dimension), and only the best of them (at least 256) are scored in full (the best of those rescored exactly: MUNINN_VECTOR_FORM): nearly the exact top results at a fraction of the cost (docs/performance.md); viewers who see fewer, and searches as of a past moment, stay exact; 0 = always exact.", _int(0), section=DATABASE),
    "metrics_port": Spec("MUNINN_METRICS_PORT", "", "Health and metrics: the port of /healthz and Prometheus /metrics, served by the bot (docs/deployment.md); empty = off. With several processes, one port each.", _optional_port, section=OPERATIONS),
    "metrics_host": Spec("MUNINN_METRICS_HOST", "127.0.0.1", "Health and metrics: the address /healthz and /metrics listen on; 0.0.0.0 in a container whose port you publish (they show no memories, but counts and host names).", _str, section=OPERATIONS),
    "web_host": Spec("MUNINN_WEB_HOST", "127.0.0.1", "Console (`muninn web`): the address it listens on; it shows everything Muninn keeps, so keep it on the loopback interface and reach it through an SSH tunnel or a reverse proxy with TLS.", _str, section=OPERATIONS),
    "web_port": Spec("MUNINN_WEB_PORT", "8377", "Console (`muninn web`): the port it listens on.", _int(1, 65535), section=OPERATIONS),
    "web_token": Spec("MUNINN_WEB_TOKEN", "", "Console (`muninn web`): the login token (16 characters or more); empty = a new random token printed at each start.", _token, "secret", section=OPERATIONS),
    "web_changes": Spec("MUNINN_WEB_CHANGES", "false", "Console (`muninn web`): allow forgetting, restoring, approving and rejecting memories and exporting or forgetting a person (each recorded); false = read-only.", _bool, section=OPERATIONS),
    "answer_mode": Spec("MUNINN_ANSWER_MODE", "mentions", "When Muninn answers in server channels unless a server or channel sets it (/settings set answer): mentions (a mention or a reply to it), every (every message) or never. DMs are always answered (MUNINN_ALLOW_DMS).", _choice("mentions", "every", "never"), section=CONVERSATION),
    "language": Spec("MUNINN_LANGUAGE", "", "Language Muninn answers in when a message does not make it plain, unless a server or channel sets one (/settings set language); empty = the language of the message.", _str, section=CONVERSATION),
    "auto_thread": Spec("MUNINN_AUTO_THREAD", "false", "A mention in a server channel opens a thread for the answer, where Muninn then answers every message, unless a server or channel sets it (/settings set auto_thread).", _bool, section=CONVERSATION),
    "allow_dms": Spec("MUNINN_ALLOW_DMS", "true", "Answer direct messages; false = DMs are neither answered nor kept.", _bool, section=DISCORD),
    "blocked_users": Spec("MUNINN_BLOCKED_USERS", "", "Comma-separated Discord user ids Muninn neither answers nor remembers anywhere (servers add their own lists with /settings access).", _id_list, section=DISCORD),
    "message_content": Spec("MUNINN_MESSAGE_CONTENT", "auto", "The Message Content intent: auto (use it when the Developer Portal grants it), on (require it) or off (run on DMs, mentions and replies to Muninn only; no passive history, no every-message channels).", _choice("auto", "on", "off"), section=DISCORD),
    "chat_kind": Spec("MUNINN_CHAT_KIND", "ollama", "Kind of server that writes replies and extracts facts: ollama (its native API) or openai (any OpenAI-compatible server: llama-server, vLLM, LM Studio, OpenRouter). The OLLAMA_* models, timeouts, retries, cooldown and concurrency apply to either kind.", _choice("ollama", "openai", why=" (any OpenAI-compatible server)"), section=OLLAMA),
    "chat_url": Spec("MUNINN_CHAT_URL", "", "Chat server address (several separated by commas); empty = OLLAMA_URL. For openai, the API's base URL such as http://localhost:8000/v1 (a bare address gets /v1).", _urls, "url", section=OLLAMA),
    "embed_kind": Spec("MUNINN_EMBED_KIND", "ollama", "Kind of server that computes embeddings: ollama or openai (its /v1/embeddings).", _choice("ollama", "openai", why=" (any OpenAI-compatible server)"), section=OLLAMA),
    "embed_url": Spec("MUNINN_EMBED_URL", "", "Embedding server address (several separated by commas); empty = OLLAMA_URL. May differ from the chat server in address and kind; its vectors must have the size the database holds (else `muninn reindex`).", _urls, "url", section=OLLAMA),
    "llm_api_key": Spec("MUNINN_LLM_API_KEY", "", "API key sent (as a Bearer token) to openai-kind servers: OpenRouter, a vLLM or llama-server started with --api-key; never to Ollama-kind servers; empty = none.", _str, "secret", section=OLLAMA),
    "embed_api_key": Spec("MUNINN_EMBED_API_KEY", "", "API key for an openai-kind embedding server that needs a different one; empty = MUNINN_LLM_API_KEY.", _str, "secret", section=OLLAMA),
    "vector_form": Spec("MUNINN_VECTOR_FORM", "int8", "How the vectors in RAM are held: int8 (a quarter of the memory; the best matches are rescored exactly from the database, recall unchanged on real embeddings) or float32 (as stored, exact without the rescoring reads).", _choice("int8", "float32"), section=DATABASE),
    "vector_snapshot": Spec("MUNINN_VECTOR_SNAPSHOT", "auto", "One copy of the vectors per machine: every process serving the database (shards, commands) maps one read-only snapshot file of the cached vectors instead of holding its own (docs/operations.md, Shared vector snapshot). auto = beside the SQLite file (muninn.db.vectors/), or for PostgreSQL in MUNINN_DB_PATH's folder; a folder path = there; off = each process keeps its own copy.", _str, section=DATABASE),
    "fusion": Spec("MUNINN_FUSION", "scores", "Recall: how the keyword and vector paths become one list: scores (each memory's BM25 relative to the best keyword hit and its cosine, weighed by how well the two paths agree, with a share of rank fusion) or ranks (Reciprocal Rank Fusion alone, MUNINN_RRF_*) (bot/memory/recall/fusion.py).", _choice("scores", "ranks"), section=RECALL),
    "fusion_vector_share": Spec("MUNINN_FUSION_VECTOR_SHARE", "0.6", "Recall, score fusion: the vector path's share of the fused score (0 = keywords only, 1 = meaning only); chosen by cross-validation over LoCoMo and BEAM conversations (bench/README.md).", _float(0, 1), section=RECALL),
    "inject_min_cosine": Spec("MUNINN_INJECT_MIN_COSINE", "", "Relevance floor: the cosine to the message a recalled memory needs to be put into the prompt, so a question about something never discussed gets no memories; empty = the floor measured for the embedding model (none for a model not measured); -1 = off.", _optional_float(-1.0, 1.0), section=RECALL),
    "changed_value_first": Spec("MUNINN_CHANGED_VALUE_FIRST", "true", "Recall: when a message asks for a value as it stands (\"how many sources are in my library?\", \"when is my call?\"), a recalled memory saying that value changed (\"I've added 52 sources\", \"the call moved to April 22\") goes before the older one holding it, which the prompt shows as an earlier note; English wording only (bot/memory/recall/changes.py); false = only memories saying nearly the same thing with a value changed are put in time order.", _bool, section=RECALL),
    # The indexes made for the big visibility keys that the vector caches may not hold (postgres/ann.py).
    "vector_index_min": Spec("MUNINN_VECTOR_INDEX_MIN", "2000", "PostgreSQL: maintenance gives each visibility key of at least this many vectors that the vector cache would not hold (beyond MUNINN_VECTOR_CACHE_MB) an approximate (HNSW) index of its own, so its search takes milliseconds instead of a scan of every vector (each write into the key costs more); dropped once the key falls under half of it or fits the cache; 0 = no such indexes (docs/operations.md, Recall past the memory limit). SQLite ignores it.", _int(0, 100_000_000), section=DATABASE),
    "vector_partial_min": Spec("MUNINN_VECTOR_PARTIAL_MIN", "5000", "SQLite: a visibility key of at least this many vectors that MUNINN_VECTOR_CACHE_MB cannot hold whole is held partially (an id and a 1-bit-per-dimension code a vector, about an eighth of its int8 rows): its search ranks the codes, then reads the best few hundred vectors back from the database and scores them exactly, milliseconds instead of a scan of every vector, nearly the exact top results on real embeddings (docs/performance.md, Keys held partially); 0 = such keys are scanned whole in the database. PostgreSQL ignores it (MUNINN_VECTOR_INDEX_MIN).", _int(0), section=DATABASE),
    "vector_index_build_mb": Spec("MUNINN_VECTOR_INDEX_BUILD_MB", "0", "PostgreSQL: maintenance_work_mem for building those indexes (an index builds far faster when its graph fits: about 4 kB per 768-dimensional vector); 0 = the server's own setting.", _int(0, 1_000_000), section=DATABASE),
    "log_level": Spec("MUNINN_LOG_LEVEL", "INFO", "Logging level: DEBUG, INFO, WARNING or ERROR.", _str, section=LOGGING),
}


@dataclass(frozen=True)
class Settings:
    """All settings, parsed and checked (load_settings): `env_file`, the `.env` they were read
    from (None: none was), then one field per entry of SETTINGS."""
    env_file: Path | None
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
    db_readers: int | None
    vector_cache_mb: int
    vector_codes_min: int
    vector_partial_min: int
    metrics_port: int | None
    metrics_host: str
    web_host: str
    web_port: int
    web_token: str
    web_changes: bool
    answer_mode: str
    language: str
    auto_thread: bool
    allow_dms: bool
    blocked_users: frozenset[int]
    message_content: str
    chat_kind: str
    chat_url: str
    embed_kind: str
    embed_url: str
    llm_api_key: str
    embed_api_key: str
    vector_form: str
    vector_snapshot: str
    fusion: str
    fusion_vector_share: float
    inject_min_cosine: float | None
    changed_value_first: bool
    vector_index_min: int
    vector_index_build_mb: int
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
    """Read settings from `env` (default: os.environ over the `.env` that `find_env_file`
    finds: the environment wins; the `.env` is read, never copied into os.environ). A relative MUNINN_DB_PATH from that
    `.env` (or the default) is taken from the `.env`'s folder, so a command run from elsewhere
    opens the project's database; SettingsError when there is no `.env`, nothing in the
    environment and no database where the default points (a stray empty database otherwise)."""
    env_file, base, from_process = None, Path.cwd(), True
    if env is None:
        from_process = SETTINGS["db_path"].env in os.environ
        env = dict(os.environ)
        if dotenv:
            env_file = find_env_file()
            if env_file is not None:
                from dotenv import dotenv_values
                env = {**{k: v for k, v in dotenv_values(env_file).items() if v is not None}, **env}
                base = env_file.parent
            elif not any(spec.env in env for spec in SETTINGS.values()) and "db_path" not in overrides \
                    and not _path("MUNINN_DB_PATH", SETTINGS["db_path"].default).exists():
                raise SettingsError(no_env_file())
    values: dict[str, Any] = {"env_file": env_file}
    for key, spec in SETTINGS.items():
        raw = env.get(spec.env, spec.default)
        values[key] = spec.parse(spec.env, raw)
    if not from_process:  # from the .env or the default: beside the .env, wherever the command runs
        values["db_path"] = _path(SETTINGS["db_path"].env, env.get(SETTINGS["db_path"].env, SETTINGS["db_path"].default), base)
    level = str(values["log_level"]).upper()
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise SettingsError(f"MUNINN_LOG_LEVEL={values['log_level']!r} must be DEBUG, INFO, WARNING or ERROR")
    values["log_level"] = level
    if values["shard_ids"] and not values["shard_count"]:
        raise SettingsError("MUNINN_SHARD_IDS is set but MUNINN_SHARD_COUNT is not; set the total number of shards")
    if any(shard >= values["shard_count"] for shard in values["shard_ids"]):
        raise SettingsError(f"MUNINN_SHARD_IDS={','.join(map(str, values['shard_ids']))} must be below "
                            f"MUNINN_SHARD_COUNT={values['shard_count']} (shards count from 0)")
    check_api_keys(values)
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


# A checkout's own folder (the one holding bot/ and pyproject.toml): its `.env` is found from anywhere.
PROJECT_ROOT = Path(__file__).resolve().parent.parent
ENV_FILE = ".env"


def find_env_file(start: Path | None = None) -> Path | None:
    """The `.env` to read: the nearest one holding a Muninn setting in `start` (default: the working
    directory) or a folder above it, else the project's own (PROJECT_ROOT); None when neither exists.
    A `.env` without Muninn's settings above the working directory is another program's: skipped."""
    folder = (start or Path.cwd()).resolve()
    for candidate in (folder, *folder.parents):
        if _holds_our_settings(candidate / ENV_FILE):
            return candidate / ENV_FILE
    own = PROJECT_ROOT / ENV_FILE
    return own if own.is_file() else None


def _holds_our_settings(path: Path) -> bool:
    """Whether `path` is a readable file that sets at least one of Muninn's settings."""
    if not path.is_file():
        return False
    from dotenv import dotenv_values
    try:
        names = set(dotenv_values(path))
    except (OSError, UnicodeDecodeError):
        return False
    return any(spec.env in names for spec in SETTINGS.values())


def no_env_file() -> str:
    """The one line that refuses to start without any configuration."""
    return (f"no {ENV_FILE} in {Path.cwd()} or a folder above it, nor in {PROJECT_ROOT}: run muninn in its "
            f"folder, or copy .env.example to {ENV_FILE} there (or set MUNINN_DB_PATH, or pass --db)")


def new_database_notice(path: Path, env_file: Path | None) -> str:
    """The line a command prints when it creates a new database: which file, and which `.env` it read."""
    source = f"settings from {env_file}" if env_file else f"no {ENV_FILE}: settings from the environment"
    return f"muninn: created a new database {path} ({source})"


def env_example() -> str:
    """The text of `.env.example`: the essentials to fill in, then every other setting commented
    out under "Advanced", by section, each with its default and what it does."""
    lines = ["# Muninn's settings. Copy this file to .env (cp -n .env.example .env && chmod 600 .env)",
             "# and fill in the essentials. The settings under Advanced are commented out: each keeps",
             "# its default (the value shown) until you uncomment it, so a later Muninn's defaults",
             "# reach you.", "", "# ===== Essentials =====", ""]
    for spec in SETTINGS.values():
        if spec.essential:
            lines += _entry(spec, commented=False)
    lines += ["# ===== Advanced: uncomment a line to change it =====", ""]
    named = [spec.section for spec in SETTINGS.values() if not spec.essential]
    for section in [*(s for s in SECTIONS if s in named), *dict.fromkeys(s for s in named if s not in SECTIONS)]:
        lines += [f"# --- {section} ---", ""]
        for spec in SETTINGS.values():
            if not spec.essential and spec.section == section:
                lines += _entry(spec, commented=True)
    return "\n".join(lines)


def _entry(spec: Spec, *, commented: bool) -> list[str]:
    """One setting in `.env.example`: its help wrapped as comments, then NAME=default."""
    helps = textwrap.wrap(spec.help, width=88, break_long_words=False, break_on_hyphens=False)
    return [*(f"# {line}" for line in helps), f"{'# ' if commented else ''}{spec.env}={spec.default}", ""]
