"""The one way to write: `with write_transaction(conn):`.

SQLite's default (deferred) transaction takes the write lock only at the first write.
When a transaction reads first and another process has written meanwhile, SQLite
answers BUSY at once instead of waiting: the busy timeout never applies, and two
processes on one file (the bot and an import, say) fail each other's writes. BEGIN
IMMEDIATE takes the write lock up front, where the busy timeout does wait; if the other
writer holds it longer than that, we wait again a few times with backoff, then raise
DatabaseBusy with a message saying so. Inside `Engine.write` there is one wait only
(`single_lock_wait`): the engine retries off its database thread, so other writes of the
bot are not held up behind a lock wait, and the retry policy lives at one depth.

Nested use (a store function called inside a larger transaction) becomes a savepoint.
A failure to roll back (a full disk can cause it) never hides the error that caused it.
`after_commit(conn, job)` runs a job once the outermost transaction has committed (dropped when
it rolls back): what must follow a removal, such as forgetting cached word counts, must not run
while a recall on another connection can still see the removed rows.
"""
from __future__ import annotations

import logging
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator

import apsw

from bot.memory.connection import Connection
from bot.memory.errors import DatabaseBusy, DatabaseError, explain

log = logging.getLogger(__name__)

LOCK_RETRIES = 3            # further waits of the busy timeout after the first one
BACKOFF_S = (0.05, 0.2, 0.5)

_here = threading.local()  # per database thread: how many further lock waits BEGIN may make
_after_commit: dict[int, list[Callable[[], None]]] = {}  # SQLite connection (id) -> jobs for its commit


def after_commit(conn: Connection, job: Callable[[], None]) -> None:
    """Run `job` once what `conn` has written is committed: now, outside a transaction; else
    after the outermost `write_transaction` commits (never if it rolls back). PostgreSQL's
    connection keeps its own list (PgConnection.after_commit)."""
    own = getattr(conn, "after_commit", None)
    if own is not None:
        own(job)
    elif not conn.get_autocommit():
        _after_commit.setdefault(id(conn), []).append(job)
    else:
        _run_jobs([job])


def _run_jobs(jobs: list[Callable[[], None]]) -> None:
    for job in jobs:
        try:
            job()
        except Exception as exc:  # the write is committed: report, never fail it now
            log.warning("after a commit: %s failed (%s); the write itself is stored",
                        getattr(job, "__name__", job), exc)


@contextmanager
def single_lock_wait() -> Iterator[None]:
    """Within the block, on this thread, a write transaction waits for the lock for one busy
    timeout and then raises DatabaseBusy: the caller retries later, off this thread."""
    before = getattr(_here, "retries", None)
    _here.retries = 0
    try:
        yield
    finally:
        _here.retries = before


@contextmanager
def write_transaction(conn: Connection) -> Iterator[None]:
    """Run the block as one write transaction holding the write lock from the start."""
    pg_transaction = getattr(conn, "transaction", None)
    if pg_transaction is not None:  # PostgreSQL (postgres/connection.py): row locks, nesting = savepoints
        with pg_transaction():
            yield
        return
    assert isinstance(conn, apsw.Connection), conn  # the SQLite connection: BEGIN IMMEDIATE, savepoints
    if conn.in_transaction:
        with conn:  # a savepoint inside the caller's transaction
            yield
        return
    _begin_immediate(conn)
    try:
        yield
    except BaseException:
        _rollback_quietly(conn)
        _after_commit.pop(id(conn), None)
        raise
    try:
        conn.execute("COMMIT")
    except apsw.Error as exc:
        _rollback_quietly(conn)
        _after_commit.pop(id(conn), None)
        message = explain(exc)
        if message is None:
            raise
        raise DatabaseError(message) from exc
    _run_jobs(_after_commit.pop(id(conn), []))


def _begin_immediate(conn: apsw.Connection) -> None:
    started = time.monotonic()
    retries = getattr(_here, "retries", None)
    retries = LOCK_RETRIES if retries is None else retries
    for attempt in range(retries + 1):
        try:
            conn.execute("BEGIN IMMEDIATE")
            return
        except apsw.BusyError as exc:
            if attempt == retries:
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
