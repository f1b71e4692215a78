"""How each setting's text becomes its value: the parsers the settings table (bot/settings.py)
names, each raising SettingsError with one line that names the setting."""
from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlparse
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from bot.redact import redact_url


class SettingsError(ValueError):
    """A setting has a value Muninn cannot use; the message names it."""


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


def _optional_int(lo: int, hi: int):
    """A whole number in [lo, hi], or empty for "decide automatically" (None)."""
    number = _int(lo, hi)

    def parse(name: str, raw: str) -> int | None:
        return None if raw.strip() == "" else number(name, raw.strip())
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
        raise SettingsError(f"{name}={redact_url(raw)!r} must be an http(s) URL such as http://localhost:11434 "
                            "(or empty to disable)")
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


def _token(name: str, raw: str) -> str:
    """A login token: empty (one is made at start), or 16 characters or more without spaces."""
    token = raw.strip()
    if token and (len(token) < 16 or any(c.isspace() for c in token)):
        raise SettingsError(f"{name} must be 16 characters or more without spaces (or empty: a random one each start)")
    return token


def _choice(*allowed: str, why: str = ""):
    """One of `allowed`, case-insensitive; the error lists them ("a or b" for two), then `why`."""
    def parse(name: str, raw: str) -> str:
        value = raw.strip().lower()
        if value not in allowed:
            options = " or ".join(allowed) if len(allowed) == 2 else "one of " + ", ".join(allowed)
            raise SettingsError(f"{name}={raw.strip()!r} must be {options}{why}")
        return value
    return parse


def check_api_keys(values: dict[str, Any]) -> None:
    """An API key and a URL with a user name and password cannot both go to one server: a request
    carries one Authorization header."""
    for purpose, url_key, api_key in (("CHAT", "chat_url", values["llm_api_key"]),
                                      ("EMBED", "embed_url", values["embed_api_key"] or values["llm_api_key"])):
        if values[f"{purpose.lower()}_kind"] != "openai" or not api_key:
            continue
        name = f"MUNINN_{purpose}_URL" if values[url_key] else "OLLAMA_URL"
        if any(urlparse(url).username or urlparse(url).password for url in (values[url_key] or values["ollama_url"]).split(",")):
            raise SettingsError(f"{name} has a user name or password and an API key is set for it: a request carries "
                                "one Authorization, so keep only one of them")


def _path(name: str, raw: str, base: Path | None = None) -> Path:
    """A file path; a relative one is taken from `base` (default: the working directory)."""
    if not raw.strip():
        raise SettingsError(f"{name} is empty; give a file path such as data/muninn.db")
    path = Path(raw).expanduser()
    if not path.is_absolute():
        path = ((base or Path.cwd()) / path).resolve()
    return path


def _timezone(name: str, raw: str) -> ZoneInfo:
    try:
        return ZoneInfo(raw)
    except (ZoneInfoNotFoundError, ValueError):
        raise SettingsError(f"{name}={raw!r} is not an IANA time zone such as Europe/Oslo or UTC") from None


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


def _optional_port(name: str, raw: str) -> int | None:
    """A TCP port (1-65535), or empty for "off" (None)."""
    if raw.strip() == "":
        return None
    return _int(1, 65535)(name, raw.strip())


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
