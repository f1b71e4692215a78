"""Leases: which one of several processes sharing the database does a job (periodic maintenance).

A lease is a row of `meta` (key `lease.<name>`, value `{"holder": ..., "expires": unix s}`),
taken or renewed by ONE upsert whose WHERE lets it through only when the lease is free, has
expired, or is already the caller's. SQLite runs a statement atomically under its write lock,
so two processes can never both hold a lease. The holder renews it well before it expires;
a holder that stops releases it (another process takes over at its next try), one that dies
simply lets it expire.

Why a row and not an OS file lock beside the database: a lock file would be released by the
kernel at once when a process dies, but it is a second file to deploy and clean up, flock
semantics differ on network and Windows file systems, and nothing outside the process could
see who holds it. The row is inside the one file Muninn already shares, `muninn doctor` and
the logs can name its holder, and it maps one to one onto the PostgreSQL backend of issue 13
(`pg_try_advisory_lock`, or the same row under `SELECT ... FOR UPDATE`).
"""
from __future__ import annotations

import json
import os
import socket
import time
import uuid

import apsw

from bot.memory.db import get_meta, set_meta

_TAKE = """
INSERT INTO meta(key, value) VALUES(:key, json_object('holder', :holder, 'expires', :expires))
ON CONFLICT(key) DO UPDATE SET value = excluded.value
WHERE json_extract(meta.value, '$.holder') = :holder OR json_extract(meta.value, '$.expires') < :now
"""


def new_holder() -> str:
    """A name for this process that no other process (here or on another machine) shares."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def take(conn: apsw.Connection, name: str, holder: str, seconds: float, now: float | None = None) -> bool:
    """Take the lease for `seconds`, or renew it if `holder` has it; False if another holds it."""
    now = time.time() if now is None else now
    conn.execute(_TAKE, {"key": f"lease.{name}", "holder": holder, "expires": now + seconds, "now": now})
    return conn.changes() == 1


def release(conn: apsw.Connection, name: str, holder: str) -> bool:
    """Give the lease up (only if `holder` has it), so another process may take it at once."""
    conn.execute("DELETE FROM meta WHERE key = ? AND json_extract(value, '$.holder') = ?", (f"lease.{name}", holder))
    return conn.changes() == 1


def holder_of(conn: apsw.Connection, name: str, now: float | None = None) -> str | None:
    """Who holds the lease now (None: nobody, or it expired)."""
    raw = get_meta(conn, f"lease.{name}")
    if raw is None:
        return None
    lease = json.loads(raw)
    return lease["holder"] if lease["expires"] >= (time.time() if now is None else now) else None


def last_run(conn: apsw.Connection, job: str) -> float | None:
    """When `job` last finished, in unix seconds, whichever process ran it."""
    raw = get_meta(conn, f"{job}.last_run")
    return float(raw) if raw is not None else None


def record_run(conn: apsw.Connection, job: str, at: float) -> None:
    set_meta(conn, f"{job}.last_run", repr(at))
