"""Maintenance of the indexes made for the big visibility keys the vector caches may not hold.

PostgreSQL: one partial HNSW index per key of at least MUNINN_VECTOR_INDEX_MIN vectors
(postgres/ann.py), built on a connection of its own so that neither the writer nor a reader
waits for it. SQLite has none: vec0 partitions its vectors by key already.
"""
from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any

from bot.memory.connection import Connection
from bot.memory.storage import storage_of

log = logging.getLogger(__name__)


@dataclass
class IndexJob:
    """What a maintenance run found to do, and where to do it (a backend with ANN indexes)."""
    storage: Any
    info: Any
    plan: Any
    stop: threading.Event = field(default_factory=threading.Event)
    _conn: Any = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def empty(self) -> bool:
        """Nothing to make or drop."""
        return not self.plan.create and not self.plan.drop

    def cancel(self) -> None:
        """From another thread: build no more, and cancel the build running now (it leaves an invalid
        index, which the next run drops and makes again). The bot stopping does not wait for a build."""
        self.stop.set()
        with self._lock:
            conn = self._conn
        if conn is not None:
            try:
                conn.pg.cancel_safe(timeout=5.0)
            except Exception as exc:  # the server is gone: the build is over anyway
                log.debug("cancelling a vector index build: %s", exc)


def planned(conn: Connection, min_vectors: int) -> IndexJob | None:
    """On a read connection: which ANN indexes to make and drop (None: the backend has none)."""
    storage = storage_of(conn)
    if getattr(storage, "ann", None) is None:
        return None
    from bot.memory.postgres import ann
    info = storage.index_info(conn)
    return IndexJob(storage, info, ann.plan(conn, info, min_vectors))  # type: ignore[arg-type]


def carried_out(job: IndexJob, build_mb: int) -> tuple[int, int]:
    """Make and drop them on a connection opened for it (builds take long; CONCURRENTLY lets writes
    go on); (made, dropped). Run off the event loop and off the engine's own connections;
    `job.cancel()` from another thread stops it."""
    from bot.memory.postgres import ann
    conn = job.storage.open_reader()
    with job._lock:
        job._conn = conn
    try:
        return ann.carry_out(conn, job.info, job.plan, build_mb, job.stop)
    finally:
        with job._lock:
            job._conn = None
        job.storage.ann.forget()
        job.storage.close(conn)
