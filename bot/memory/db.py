"""Opening the SQLite file: apsw (bundled SQLite with FTS5 and extension loading), sqlite-vec, WAL.

apsw is used instead of the stdlib `sqlite3` because many Pythons (this machine's,
macOS system Python, some pyenv builds) cannot load extensions. Never load vec0
through a second SQLite library in the same process: it crashes.
"""
from __future__ import annotations

import importlib.util
import logging
import os
from pathlib import Path

import apsw

from bot.memory.migrations import migrate

log = logging.getLogger(__name__)

BUSY_TIMEOUT_MS = 5000


class DatabaseError(RuntimeError):
    """The database cannot be opened or used; the message says what to do."""


class Connection(apsw.Connection):
    """`with conn:` begins IMMEDIATE at the outermost level (nested blocks stay savepoints).

    Several bot processes (shards) may share the file. A deferred transaction that reads and
    then writes (the duplicate check before a fact is stored, the lease) would either act on a
    read another process has made stale, or fail with SQLITE_BUSY_SNAPSHOT when it tries to
    write. Taking the write lock first makes every such block see the latest data; waiting for
    the lock is bounded by the busy timeout. Reads outside `with conn:` never wait (WAL)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._began: list[bool] = []

    def __enter__(self) -> "Connection":
        outermost = not self.in_transaction
        if outermost:
            self.execute("BEGIN IMMEDIATE")
        self._began.append(outermost)
        try:
            super().__enter__()
        except BaseException:
            self._began.pop()
            if outermost:
                self.execute("ROLLBACK")
            raise
        return self

    def __exit__(self, etype, evalue, etb) -> bool:
        outermost = self._began.pop()
        try:
            result = super().__exit__(etype, evalue, etb)
            if outermost and self.in_transaction:
                self.execute("COMMIT" if etype is None else "ROLLBACK")
        except BaseException:
            if outermost and self.in_transaction:
                self.execute("ROLLBACK")
            raise
        return bool(result)


def connect(path: Path | str, *, migrate_schema: bool = True) -> apsw.Connection:
    """Open (creating if needed) the memory database, load sqlite-vec, apply migrations."""
    path = str(path)
    if path != ":memory:":
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    try:
        conn = Connection(path)
    except apsw.Error as exc:
        raise DatabaseError(f"cannot open database {path!r}: {exc}") from exc
    conn.set_busy_timeout(BUSY_TIMEOUT_MS)
    load_vec(conn)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA foreign_keys=ON")
        conn.execute("PRAGMA secure_delete=ON")  # forgotten memories must not linger in free pages
        conn.execute("PRAGMA mmap_size=268435456")
        if migrate_schema:
            migrate(conn)
    except apsw.NotADBError as exc:
        raise DatabaseError(f"{path!r} is not a SQLite database; point MUNINN_DB_PATH (or --db) at another file") from exc
    return conn


def vec_path() -> str:
    """Where the sqlite-vec wheel keeps its loadable library (`import sqlite_vec` would pull numpy
    in, which costs a command-line call 150 ms)."""
    spec = importlib.util.find_spec("sqlite_vec")
    if spec is None or not spec.submodule_search_locations:
        raise DatabaseError("sqlite-vec is not installed: run `pip install sqlite-vec`")
    return os.path.join(list(spec.submodule_search_locations)[0], "vec0")


def load_vec(conn: apsw.Connection) -> None:
    try:
        conn.enable_load_extension(True)
        conn.load_extension(vec_path())
        conn.enable_load_extension(False)
    except apsw.Error as exc:
        raise DatabaseError(
            f"cannot load sqlite-vec from {vec_path()!r}: {exc}; "
            "reinstall it with `pip install --force-reinstall sqlite-vec`") from exc


def query_one(conn: apsw.Connection, sql: str, params=()):
    for row in conn.execute(sql, params):
        return row
    return None


def query_value(conn: apsw.Connection, sql: str, params=(), default=None):
    row = query_one(conn, sql, params)
    return default if row is None else row[0]


def get_meta(conn: apsw.Connection, key: str, default: str | None = None) -> str | None:
    return query_value(conn, "SELECT value FROM meta WHERE key = ?", (key,), default)


def set_meta(conn: apsw.Connection, key: str, value: str) -> None:
    conn.execute("INSERT INTO meta(key, value) VALUES(?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                 (key, value))
