"""What `muninn doctor` reads of a SQLite database: sqlite-vec's version and the file's integrity."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import apsw

from bot.memory.sqlite import db


@contextmanager
def opened(path: Path | str) -> Iterator[apsw.Connection]:
    """The database as the bot opens it (created and migrated if need be), closed after the
    block. Failing to open it raises before the block: for the doctor, that is the finding."""
    conn = db.connect(path)
    try:
        yield conn
    finally:
        conn.close()


def vec_version(conn: apsw.Connection) -> str:
    """The version of the sqlite-vec extension loaded into `conn`."""
    return str(conn.execute("SELECT vec_version()").fetchall()[0][0])


def quick_check(conn: apsw.Connection) -> str:
    """SQLite's quick integrity check: "ok", or the first problem it found (the check runs to
    the end: every row is read)."""
    return str(conn.execute("PRAGMA quick_check").fetchall()[0][0])
