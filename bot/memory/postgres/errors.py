"""What a PostgreSQL error means for the operator, when it hits the whole database.

`bot.memory.errors.explain` asks here for psycopg's errors (only once psycopg is imported: it is an
optional dependency). An error listed here fails every request alike until someone acts
(the server is gone or stopping, its disk is full, it refuses writes, its files are damaged),
so callers stop retrying request by request (bot/memory/recall/touches.py) and log one line saying
what to fix. Errors of one transaction (a deadlock, a serialization failure, a lock or
statement timeout, a refused row) are not listed: running another request may well work.
"""
from __future__ import annotations

import psycopg
from psycopg import errors

_FIXES: tuple[tuple[tuple[type[BaseException], ...], str], ...] = (
    ((errors.DiskFull,),
     "the PostgreSQL server's disk is full: free space where its data directory (or WAL) lives, then try again"),
    ((errors.OutOfMemory, errors.InsufficientResources),
     "the PostgreSQL server is out of memory or other resources: check the server, then try again"),
    ((errors.TooManyConnections,),
     "the PostgreSQL server has no connection slot left: raise max_connections or close other clients"),
    ((errors.AdminShutdown, errors.CrashShutdown, errors.CannotConnectNow),
     "the PostgreSQL server is shutting down or restarting: start it (or wait for it), then try again"),
    ((errors.ReadOnlySqlTransaction,),
     "PostgreSQL refuses writes (a read-only standby, or default_transaction_read_only is on): "
     "point MUNINN_DATABASE_URL at the primary server"),
    ((errors.DataCorrupted, errors.IndexCorrupted),
     "PostgreSQL reports damaged data: stop Muninn, check the server's log, REINDEX or restore a backup"),
    ((errors.IoError,),
     "the PostgreSQL server could not read or write its files: check the server's disk"),
    ((errors.InsufficientPrivilege,),
     "the PostgreSQL role in MUNINN_DATABASE_URL lacks a privilege on Muninn's tables: grant it "
     "(or use the role that created them)"),
)


def explain(exc: BaseException) -> str | None:
    """One line for a psycopg error that hits the whole database, or None."""
    if not isinstance(exc, psycopg.Error):
        return None
    for kinds, fix in _FIXES:
        if isinstance(exc, kinds):
            return fix
    if _connection_lost(exc):
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return (f"the connection to PostgreSQL was lost ({first}): check that the server is running "
                "and reachable at MUNINN_DATABASE_URL")
    return None


def _connection_lost(exc: psycopg.Error) -> bool:
    """A connection that died (no SQLSTATE: libpq's own error) or a connection-class SQLSTATE (08)."""
    if isinstance(exc, psycopg.OperationalError) and exc.sqlstate is None:
        return not isinstance(exc, errors.PipelineAborted)  # that one: an earlier statement of a pipeline failed
    return bool(exc.sqlstate and exc.sqlstate.startswith("08"))
