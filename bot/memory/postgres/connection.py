"""Opening PostgreSQL connections, and running the project's portable SQL on them.

`PgConnection` wraps one psycopg (sync, autocommit) connection. Its `execute(sql, params)`
takes the same statements as apsw: `?` and `:name` placeholders, and `CAST(x AS BLOB)`
(store.COLUMNS reads free text as bytes, to survive bad UTF-8 in a SQLite file) becomes
`convert_to(x, 'UTF8')`. That lets the backend-neutral reads (store's listings and the
scope-filtered gets, scope.personal_keys, retrieval's neighbour walk and graph step,
ranking's decay rows) run unchanged on both backends: one code path, one scope rule.
Everything dialect-specific (writes, FTS, vectors, leases) is explicit SQL in backend.py
with psycopg's own `%s` placeholders, run through `.pg`.
"""
from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlparse

import psycopg

from bot.memory.files import DatabaseError

_BLOB = re.compile(r"CAST\((\w+(?:\.\w+)?) AS BLOB\)", re.IGNORECASE)
_TOKEN = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|\?|:[A-Za-z_]\w*|%|::")


def translate(sql: str) -> str:
    """apsw-style SQL -> psycopg's: placeholders outside quoted text, literal % doubled."""
    sql = _BLOB.sub(r"convert_to(\1, 'UTF8')", sql)

    def replace(match: re.Match[str]) -> str:
        token = match.group(0)
        if token == "?":
            return "%s"
        if token == "%":
            return "%%"
        if token.startswith(":") and token != "::":
            return f"%({token[1:]})s"
        return token
    return _TOKEN.sub(replace, sql)


class PgConnection:
    """One psycopg connection used by one thread at a time (the engine's writer or a reader)."""

    def __init__(self, pg: psycopg.Connection) -> None:
        self.pg = pg
        self.filename = ""  # fts.doc_count keys its cache by this (SQLite only)

    def execute(self, sql: str, params: Any = ()) -> psycopg.Cursor:
        return self.pg.execute(translate(sql).encode(), params or None)

    def close(self) -> None:
        self.pg.close()


def where(url: str) -> str:
    """host:port/dbname of a URL, without the user or password (for messages)."""
    parsed = urlparse(url)
    host = parsed.hostname or "localhost"
    return f"{host}{':' + str(parsed.port) if parsed.port else ''}{parsed.path or ''}"


def connect(url: str) -> PgConnection:
    """An autocommit connection (each write opens its own transaction); a bad URL, a server
    that is down or refuses us becomes one line of DatabaseError."""
    try:
        pg = psycopg.connect(url, autocommit=True, connect_timeout=10)
    except psycopg.Error as exc:
        reason = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        raise DatabaseError(f"cannot connect to PostgreSQL at {where(url)}: {reason}") from exc
    except Exception as exc:  # psycopg raises ProgrammingError/ValueError for malformed URLs
        raise DatabaseError(f"MUNINN_DATABASE_URL is not a usable PostgreSQL URL: {exc}") from exc
    return PgConnection(pg)
