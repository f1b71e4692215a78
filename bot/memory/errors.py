"""The database's errors as the engine and the command line see them, whatever the backend.

`DatabaseError` carries a message that says what to do; `explain` turns a driver's error that
hits the whole database (a full disk, a damaged file, a lock held too long, a server gone) into
such a line, or None for an error of one request (a constraint, a deadlock) that another try
may well survive.
"""
from __future__ import annotations

import sys


class DatabaseError(RuntimeError):
    """The database cannot be opened or used; the message says what to do."""


class DatabaseBusy(DatabaseError):
    """Another process held the write lock for longer than we wait."""


def explain(exc: BaseException) -> str | None:
    """One line saying what a database error means for the operator, or None if it is not one
    of the failures of the whole database (bot/memory/sqlite/errors.py,
    bot/memory/postgres/errors.py)."""
    if isinstance(exc, DatabaseError):
        return str(exc)
    psycopg = sys.modules.get("psycopg")   # optional: never imported here; none of its errors exist before it is
    if psycopg is not None and isinstance(exc, psycopg.Error):
        from bot.memory.postgres.errors import explain as explain_postgres
        return explain_postgres(exc)
    from bot.memory.sqlite.errors import explain as explain_sqlite
    return explain_sqlite(exc)
