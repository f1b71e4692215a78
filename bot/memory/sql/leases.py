"""Leases: which one of several processes sharing the database does a job (periodic maintenance).

A lease is a row of `meta` (key `lease.<name>`, value `{"holder": ..., "expires": unix s}`),
taken or renewed by ONE upsert whose WHERE lets it through only when the lease is free, has
expired, or is already the caller's. SQLite runs a statement atomically under its write lock,
so two processes can never both hold a lease. The holder renews it well before it expires;
a holder that stops releases it (another process takes over at its next try), one that dies
simply lets it expire; one that died on this machine (kill -9 of `muninn maintain`) is seen
dead at once (`abandoned`), so running the command again need not wait for the expiry.

Why a row and not an OS file lock beside the database: a lock file would be released by the
kernel at once when a process dies, but it is a second file to deploy and clean up, flock
semantics differ on network and Windows file systems, and nothing outside the process could
see who holds it. The row is inside the one file Muninn already shares, `muninn doctor` and
the logs can name its holder, and it maps one to one onto the PostgreSQL backend
(`pg_try_advisory_lock`, or the same row under `SELECT ... FOR UPDATE`).
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import socket
import time
import uuid
from pathlib import Path

from bot.memory.connection import Connection
from bot.memory.sql.queries import get_meta, set_meta

_TAKE = """
INSERT INTO meta(key, value) VALUES(:key, json_object('holder', :holder, 'expires', :expires))
ON CONFLICT(key) DO UPDATE SET value = excluded.value
WHERE json_extract(meta.value, '$.holder') = :holder OR json_extract(meta.value, '$.expires') < :now
"""


def new_holder() -> str:
    """A name for this process that no other process (here or on another machine) shares:
    host:pid:random@place, where `place` says in which boot and pid namespace the pid is valid."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}@{_place()}"


_HOLDER = re.compile(r"^(?P<host>.*):(?P<pid>\d+):[0-9a-f]{6}@(?P<place>[0-9a-f]{8})$")


@functools.cache  # one boot, one pid namespace per process: read /proc once
def _place() -> str:
    """This boot of this machine and this pid namespace (a container sharing the host name has its
    own pids: a pid of another namespace is never judged from here). What cannot be read (no
    /proc) is a random value of this process, so an unknown place matches no other process's:
    two containers sharing the host name and kernel would otherwise match, and a live holder of
    the other one could be taken for dead."""
    parts = [socket.gethostname()]
    for where in ("/proc/sys/kernel/random/boot_id", "/proc/self/ns/pid"):
        try:
            parts.append(Path(where).read_text().strip() if "boot_id" in where else str(os.stat(where).st_ino))
        except OSError:
            parts.append(uuid.uuid4().hex)
    return hashlib.sha1(":".join(parts).encode()).hexdigest()[:8]


def abandoned(holder: str) -> bool:
    """True only when `holder` is a process of this machine, boot and pid namespace that is no
    longer running (killed, crashed): its lease may be taken at once instead of after it expires.
    Anything else (another machine, a name of another form, a live or unknown process) is False."""
    found = _HOLDER.match(holder)
    if found is None or os.name != "posix" or found["place"] != _place():
        return False
    pid = int(found["pid"])
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # it exists (another user's)
    try:  # exists, but a zombie (dead, its parent has not collected it yet) is dead all the same
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def take(conn: Connection, name: str, holder: str, seconds: float, now: float | None = None) -> bool:
    """Take the lease for `seconds`, or renew it if `holder` has it; False if another holds it."""
    now = time.time() if now is None else now
    conn.execute(_TAKE, {"key": f"lease.{name}", "holder": holder, "expires": now + seconds, "now": now})
    return conn.changes() == 1


def release(conn: Connection, name: str, holder: str) -> bool:
    """Give the lease up (only if `holder` has it), so another process may take it at once."""
    conn.execute("DELETE FROM meta WHERE key = ? AND json_extract(value, '$.holder') = ?", (f"lease.{name}", holder))
    return conn.changes() == 1


def holder_of(conn: Connection, name: str, now: float | None = None) -> str | None:
    """Who holds the lease now (None: nobody, or it expired)."""
    raw = get_meta(conn, f"lease.{name}")
    if raw is None:
        return None
    lease = json.loads(raw)
    return lease["holder"] if lease["expires"] >= (time.time() if now is None else now) else None


def last_run(conn: Connection, job: str) -> float | None:
    """When `job` last finished, in unix seconds, whichever process ran it."""
    raw = get_meta(conn, f"{job}.last_run")
    return float(raw) if raw is not None else None


def record_run(conn: Connection, job: str, at: float) -> None:
    """Record that `job` finished at `at` (unix seconds), for every process to see (last_run)."""
    set_meta(conn, f"{job}.last_run", repr(at))
