"""The one way to write: `with write_transaction(conn):`.

SQLite's default (deferred) transaction takes the write lock only at the first write.
When a transaction reads first and another process has written meanwhile, SQLite
answers BUSY at once instead of waiting: the busy timeout never applies, and two
processes on one file (the bot and an import, say) fail each other's writes. BEGIN
IMMEDIATE takes the write lock up front, where the busy timeout does wait; if the other
writer holds it longer than that, we wait again a few times with backoff, then raise
DatabaseBusy with a message saying so.

Nested use (a store function called inside a larger transaction) becomes a savepoint.
A failure to roll back (a full disk can cause it) never hides the error that caused it.
"""
from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from typing import Iterator

import apsw

from bot.memory.files import DatabaseBusy, DatabaseError, explain

log = logging.getLogger(__name__)

LOCK_RETRIES = 3            # further waits of the busy timeout after the first one
BACKOFF_S = (0.05, 0.2, 0.5)


@contextmanager
def write_transaction(conn: apsw.Connection) -> Iterator[None]:
    """Run the block as one write transaction holding the write lock from the start."""
    pg_transaction = getattr(conn, "transaction", None)
    if pg_transaction is not None:  # PostgreSQL (postgres/connection.py): row locks, nesting = savepoints
        with pg_transaction():
            yield
        return
    if conn.in_transaction:
        with conn:  # a savepoint inside the caller's transaction
            yield
        return
    _begin_immediate(conn)
    try:
        yield
    except BaseException:
        _rollback_quietly(conn)
        raise
    try:
        conn.execute("COMMIT")
    except apsw.Error as exc:
        _rollback_quietly(conn)
        message = explain(exc)
        if message is None:
            raise
        raise DatabaseError(message) from exc


def _begin_immediate(conn: apsw.Connection) -> None:
    started = time.monotonic()
    for attempt in range(LOCK_RETRIES + 1):
        try:
            conn.execute("BEGIN IMMEDIATE")
            return
        except apsw.BusyError as exc:
            if attempt == LOCK_RETRIES:
                raise DatabaseBusy(
                    f"the database stayed locked by another process for {time.monotonic() - started:.1f} s "
                    "(an import or maintain?): try again when it is done") from exc
            log.debug("database locked; waiting again (attempt %d)", attempt + 2)
            time.sleep(BACKOFF_S[min(attempt, len(BACKOFF_S) - 1)])
        except apsw.Error as exc:
            message = explain(exc)
            if message is None:
                raise
            raise DatabaseError(message) from exc


def _rollback_quietly(conn: apsw.Connection) -> None:
    """Roll back if SQLite has not already done so; a failure here must not mask the cause."""
    if not conn.in_transaction:
        return
    try:
        conn.execute("ROLLBACK")
    except apsw.Error as exc:  # e.g. "cannot rollback - no transaction is active" after a full disk
        log.debug("rollback failed after an error: %s", exc)
