"""Opening PostgreSQL connections, and running the project's portable SQL on them.

`PgConnection` wraps one psycopg (sync, autocommit) connection. Its `execute(sql, params)`
takes the same statements as apsw: `?` and `:name` placeholders, `CAST(x AS BLOB)`
(records.COLUMNS reads free text as bytes, to survive bad UTF-8 in a SQLite file) becomes
`convert_to(x, 'UTF8')` and `LIMIT -1` (no limit) `LIMIT ALL`; `changes()` and
`transaction()` stand in for apsw's (transactions.write_transaction uses the latter).
So the backend-neutral SQL (store's listings and scope-filtered gets, scope.personal_keys,
retrieval's neighbour walk and graph step, ranking's decay rows, the conversation history
and channel settings) runs unchanged on both backends: one code path, one scope rule.
Everything dialect-specific (writes of memories, FTS, vectors, leases) is explicit SQL in
backend.py with psycopg's own `%s` placeholders, run through `.pg`.
"""
from __future__ import annotations

import logging
import re
from contextlib import contextmanager
from typing import Any, Callable, Iterator
from urllib.parse import urlparse

import psycopg

from bot.memory.errors import DatabaseError
from bot.redact import redact, secrets_in

log = logging.getLogger(__name__)

_NO_LIMIT = re.compile(r"\bLIMIT -1\b", re.IGNORECASE)
_BLOB = re.compile(r"CAST\((\w+(?:\.\w+)?) AS BLOB\)", re.IGNORECASE)
_TOKEN = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|\?|:[A-Za-z_]\w*|%|::")


def translate(sql: str) -> str:
    """apsw-style SQL -> psycopg's: placeholders outside quoted text, literal % doubled."""
    sql = _NO_LIMIT.sub("LIMIT ALL", _BLOB.sub(r"convert_to(\1, 'UTF8')", sql))

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

    def __init__(self, pg: psycopg.Connection, storage: Any = None) -> None:
        self.pg = pg
        self.storage = storage  # the backend it belongs to (storage.storage_of)
        self.filename = ""  # fts.doc_count keys its cache by this (SQLite only)
        self._changes = 0
        self._after_commit: list[Callable[[], None]] = []

    def execute(self, sql: str, params: Any = ()) -> psycopg.Cursor:
        """Run apsw-style SQL (`translate`d) with `params`; returns
        psycopg's cursor and records the rows it changed for `changes()`."""
        cursor = self.pg.execute(translate(sql).encode(), params or None)
        self._changes = max(cursor.rowcount, 0)
        return cursor

    def get_autocommit(self) -> bool:
        """Outside any transaction (apsw's `get_autocommit()`): the vector cache applies only
        committed changes, and scores an open transaction's own ones for that search alone."""
        return self.pg.info.transaction_status == psycopg.pq.TransactionStatus.IDLE

    def changes(self) -> int:
        """Rows changed by the last statement run through `execute` (apsw's `changes()`)."""
        return self._changes

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """One transaction (a savepoint inside another); commits at the end of the block, then
        runs what `after_commit` deferred to that commit (dropped when it rolls back)."""
        outermost = self.pg.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        try:
            with self.pg.transaction():
                yield
        except BaseException:
            if outermost:
                self._after_commit.clear()
            raise
        if outermost:
            self._run_after_commit()

    def after_commit(self, job: Callable[[], None]) -> None:
        """Run `job` once what this connection has written is committed: now when no transaction
        is open, else after the outermost `transaction()` commits (the removals counter: a
        statement on one shared row, which inside a caller's transaction would hold that row's
        lock until its commit and queue every process's removals behind it)."""
        if self.pg.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
            self._after_commit.append(job)
            self._run_after_commit()
        else:
            self._after_commit.append(job)

    def _run_after_commit(self) -> None:
        from bot.memory.sql.transactions import _run_jobs  # late: transactions imports files, as this does
        jobs, self._after_commit = self._after_commit, []
        _run_jobs(jobs)

    def close(self) -> None:
        """Close the psycopg connection."""
        self.pg.close()


def where(url: str) -> str:
    """host:port/dbname of a URL, without the user or password (for messages)."""
    parsed = urlparse(url)
    host = parsed.hostname or "localhost"
    return f"{host}{':' + str(parsed.port) if parsed.port else ''}{parsed.path or ''}"


def connect(url: str, storage: Any = None) -> PgConnection:
    """An autocommit connection (each write opens its own transaction); a bad URL, a server
    that is down or refuses us becomes one line of DatabaseError."""
    try:
        pg = psycopg.connect(url, autocommit=True, connect_timeout=10)
    except psycopg.Error as exc:
        reason = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        raise DatabaseError(f"cannot connect to PostgreSQL at {where(url)}: {redact(reason, secrets_in('url', url))}") from exc
    except Exception as exc:  # psycopg raises ProgrammingError/ValueError for malformed URLs
        # ... and may quote the part it could not read: the password, when its %-escape is bad
        raise DatabaseError("MUNINN_DATABASE_URL is not a usable PostgreSQL URL: "
                            f"{redact(str(exc).strip(), secrets_in('url', url))}") from exc
    return PgConnection(pg, storage)
