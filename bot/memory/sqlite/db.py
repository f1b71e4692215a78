"""Opening the SQLite file: apsw (bundled SQLite with FTS5 and extension loading), sqlite-vec, WAL.

apsw is used instead of the stdlib `sqlite3` because many Pythons (this machine's,
macOS system Python, some pyenv builds) cannot load extensions. Never load vec0
through a second SQLite library in the same process: it crashes.
"""
from __future__ import annotations

import importlib.util
import logging
import os
import time
from pathlib import Path

import apsw

from bot.memory.errors import DatabaseError, explain
from bot.memory.sql.transactions import write_transaction
from bot.memory.sqlite import files, fts
from bot.memory.sqlite.migrations import migrate

__all__ = ["DatabaseError", "explain", "write_transaction", "connect"]

log = logging.getLogger(__name__)

BUSY_TIMEOUT_MS = 5000


def _enable_wal(conn: apsw.Connection) -> None:
    """Switch to WAL. SQLite does not call the busy handler for this switch, so a second
    process opening a new file while the first creates it gets BUSY at once: wait here,
    within the busy timeout, as for any other lock."""
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL").fetchall()
            return
        except apsw.BusyError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def connect(path: Path | str, *, migrate_schema: bool = True) -> apsw.Connection:
    """Open (creating if needed, private to this user) the memory database, load sqlite-vec,
    apply migrations. A file that is not Muninn's, or is newer than this code, is refused
    before a byte of it changes (files.check_before_open)."""
    path = str(path)
    if path != ":memory:":
        files.prepare(Path(path))
    try:
        conn = apsw.Connection(path)
    except apsw.Error as exc:
        raise DatabaseError(f"cannot open database {path!r}: {explain(exc) or exc}") from exc
    conn.set_busy_timeout(BUSY_TIMEOUT_MS)
    load_vec(conn)
    try:
        _enable_wal(conn)
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA foreign_keys=ON")
        conn.execute("PRAGMA secure_delete=ON")  # forgotten memories must not linger in free pages
        conn.execute("PRAGMA mmap_size=268435456")
        if migrate_schema:
            migrate(conn)
            files.mark(conn)
        # after WAL and the schema: fetching FTS5's API runs a statement, which a new file being
        # migrated by another process could refuse
        fts.register_scorer(conn)
    except apsw.NotADBError as exc:
        conn.close()
        raise DatabaseError(f"{path!r} is not a SQLite database; point MUNINN_DB_PATH (or --db) at another file") from exc
    except apsw.Error as exc:
        conn.close()
        message = explain(exc)
        if message is None:
            raise
        raise DatabaseError(f"{path}: {message}") from exc
    return conn


def vec_path() -> str:
    """Where the sqlite-vec wheel keeps its loadable library (`import sqlite_vec` would pull numpy
    in, which slows every command-line call noticeably)."""
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
