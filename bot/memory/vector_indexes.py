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
from bot.memory.vectors import codes as vector_codes
from bot.memory.vectors.arrays import KeyVectors
from bot.memory.vectors.keys import CODES_KEY_MIN

log = logging.getLogger(__name__)

# The share of the cache's budget that the keys counted as held may fill: a key near the edge of
# the budget is held after the start-up warm, but the keys that other viewers' recalls load evict
# it, and a recall that then finds it cold scans all of its vectors in the server, the slowest part
# of a busy recall's tail; counted at half the budget, such keys get an index instead.
HELD_SHARE = 0.5


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


def held_by_cache(cache: Any, dim: int, sizes: list[tuple[str, int]], share: float | None = None) -> set[str]:
    """The keys a vector cache with `cache`'s budget and form would hold after its start-up warm
    (biggest first, each that still fits: VectorCache.warm), within `share` of the budget (HELD_SHARE
    unless given: a key at its edge is evicted now and then); none without a cache."""
    if cache is None:
        return set()
    row = KeyVectors.row_bytes(dim, cache.form)
    coded = min(CODES_KEY_MIN, cache.codes_min) if cache.codes_min > 0 else None
    budget, used, held = cache.budget_bytes * (HELD_SHARE if share is None else share), 0, set()
    for key, count in sorted(sizes, key=lambda item: (-item[1], item[0])):
        need = count * (row + (vector_codes.words_for(dim) * 8 if coded is not None and count >= coded else 0))
        if used + need <= budget:
            used += need
            held.add(key)
    return held


def planned(conn: Connection, min_vectors: int) -> IndexJob | None:
    """On a read connection: which ANN indexes to make and drop (None: the backend has none). Keys
    that this process's vector cache would hold get none: searched in memory, an index there
    would only cost every write into them."""
    storage = storage_of(conn)
    if getattr(storage, "ann", None) is None:
        return None
    from bot.memory.postgres import ann
    info = storage.index_info(conn)
    cache = getattr(storage, "vector_cache", None)
    plan = ann.plan(conn, info, min_vectors,  # type: ignore[arg-type]
                    None if info is None else lambda sizes: held_by_cache(cache, info.dim, sizes))
    return IndexJob(storage, info, plan)


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
