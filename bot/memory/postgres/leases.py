"""The `meta` rows of several processes on PostgreSQL: leases (who does a periodic job) and when
each job last ran. A lease is taken under an advisory transaction lock, so two processes that
read it free at once cannot both take it."""
from __future__ import annotations

import json
import time

from bot.memory.postgres.connection import PgConnection

LEASE_LOCK = 7_277_403      # advisory lock: taking a lease (read-check-write of one meta row)


def meta_value(conn: PgConnection, key: str) -> str | None:
    """A `meta` row's value, or None."""
    row = conn.pg.execute("SELECT value FROM meta WHERE key = %s", (key,)).fetchone()
    return None if row is None else str(row[0])


def set_meta_value(conn: PgConnection, key: str, value: str) -> None:
    """Set a `meta` row's value (inside the caller's transaction, if any)."""
    conn.pg.execute("INSERT INTO meta (key, value) VALUES (%s, %s) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                    (key, value))


def take_lease(conn: PgConnection, name: str, holder: str, seconds: float) -> bool:
    """Take or renew the lease (a JSON row of `meta`) under an advisory
    transaction lock; False if another holder has it and it has not expired."""
    now = time.time()
    with conn.pg.transaction():
        conn.pg.execute("SELECT pg_advisory_xact_lock(%s)", (LEASE_LOCK,))
        raw = meta_value(conn, f"lease.{name}")
        if raw is not None:
            lease = json.loads(raw)
            if lease.get("holder") != holder and float(lease.get("expires", 0)) >= now:
                return False
        set_meta_value(conn, f"lease.{name}", json.dumps({"holder": holder, "expires": now + seconds}))
    return True

def release_lease(conn: PgConnection, name: str, holder: str) -> bool:
    """Delete the lease's row if `holder` has it (True), so another process may take it at once."""
    return conn.pg.execute("DELETE FROM meta WHERE key = %s AND (value::jsonb ->> 'holder') = %s",
                           (f"lease.{name}", holder)).rowcount == 1

def lease_holder(conn: PgConnection, name: str) -> str | None:
    """Who holds the lease now, or None (nobody, or it expired)."""
    raw = meta_value(conn, f"lease.{name}")
    if raw is None:
        return None
    lease = json.loads(raw)
    return lease["holder"] if lease["expires"] >= time.time() else None

def last_run(conn: PgConnection, job: str) -> float | None:
    """When `job` last finished, in unix seconds, from its `meta` row, or None."""
    raw = meta_value(conn, f"{job}.last_run")
    return float(raw) if raw is not None else None

def record_run(conn: PgConnection, job: str, at: float) -> None:
    """Record in `meta` that `job` finished at `at` (unix seconds)."""
    set_meta_value(conn, f"{job}.last_run", repr(at))
