"""The memory engine: one object that the bot, the command line and the benchmarks share.

All database work runs on one dedicated thread (apsw releases the GIL), so a slow
disk or a large search never blocks the event loop; network calls to Ollama run on
the loop. `recall` is the one retrieval function of the project.
"""
from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Sequence, TypeVar

import apsw

from bot.llm.ollama import (
    OllamaBadResponse,
    OllamaClient,
    OllamaDisabled,
    OllamaError,
    OllamaModelMissing,
    OllamaUnavailable,
    usable_vector,
)
from bot.logs import Throttle
from bot.memory import dates, db, ranking, retrieval, store, vectors
from bot.memory.scope import Viewer, visible_keys
from bot.settings import Settings

log = logging.getLogger(__name__)
T = TypeVar("T")

EMBED_BATCH = 32


async def _given(vector: list[float]) -> tuple[list[float] | None, str]:
    return (vector, "ok") if usable_vector(vector) else (None, "bad-response")


class Engine:
    def __init__(self, settings: Settings, ollama: OllamaClient | None = None):
        self.settings = settings
        self.ollama = ollama or OllamaClient.from_settings(settings)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="muninn-db")
        self._conn: apsw.Connection | None = None
        self._throttle = Throttle()

    # -- lifecycle -----------------------------------------------------------

    async def start(self) -> "Engine":
        """Open the database (running migrations) and warn if the embedding model changed."""
        await self.run(lambda conn: None)
        info = await self.run(vectors.index_info)
        if info is not None:  # databases made before the index existed get it now
            await self.run(lambda conn: vectors.index_partitions(conn))
        if info is not None and info.model != self.settings.embed_model:
            log.warning("the vectors were made with %r but OLLAMA_EMBED_MODEL is %r: vector recall is off "
                        "until you run `muninn reindex`", info.model, self.settings.embed_model)
        return self

    async def close(self) -> None:
        await self.ollama.close()
        if self._conn is not None:
            conn, self._conn = self._conn, None
            await asyncio.get_running_loop().run_in_executor(self._executor, conn.close)
        self._executor.shutdown(wait=True)

    async def __aenter__(self) -> "Engine":
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.close()

    def _connection(self) -> apsw.Connection:
        if self._conn is None:
            self._conn = db.connect(self.settings.db_path)
        return self._conn

    async def run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run `fn(conn, *args, **kwargs)` on the database thread."""
        def call():
            return fn(self._connection(), *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    # -- writes --------------------------------------------------------------

    async def remember(self, memory: store.NewMemory) -> int:
        return (await self.remember_many([memory]))[0]

    async def remember_many(self, memories: Sequence[store.NewMemory], *, now: float | None = None) -> list[int]:
        """Embed (if Ollama can) and store memories in one transaction; a failed embedding
        stores them without vectors, for the backfill to finish later."""
        vecs = await self.embed_or_none([m.text for m in memories])
        return await self.run(self._insert, list(memories), vecs, now)

    def _insert(self, conn: apsw.Connection, memories: list[store.NewMemory],
                vecs: list[list[float]] | None, now: float | None) -> list[int]:
        with conn:
            info = self.index_for(conn, len(vecs[0])) if vecs else None
            return store.insert_many(conn, memories, base_stability_days=self.settings.base_stability_days,
                                     vector_info=info, vectors_=vecs if info else None, now=now)

    def index_for(self, conn: apsw.Connection, dim: int) -> vectors.IndexInfo | None:
        """The index these vectors belong in, creating it on the first embedding ever."""
        info = vectors.index_info(conn)
        if info is None:
            return vectors.create_index(conn, self.settings.embed_model, dim)
        if info.model != self.settings.embed_model:
            return None  # reindex pending; the backfill embeds these later
        if info.dim != dim:
            self._warn_once("dim", f"{self.settings.embed_model} returned {dim}-dimensional vectors but the index "
                                   f"holds {info.dim}: run `muninn reindex`")
            return None
        return info

    def current_index(self, conn: apsw.Connection) -> vectors.IndexInfo | None:
        """The vector index if it belongs to the configured embedding model (else None)."""
        info = vectors.index_info(conn)
        return info if info is not None and info.model == self.settings.embed_model else None

    async def forget(self, memory_ids: Sequence[int], *, scrub: bool = False) -> int:
        """Hard-delete memories; with `scrub`, also rewrite the indexes and the WAL so that no
        trace of their text stays recoverable on disk (slower: for forget-all, not routine)."""
        removed = await self.run(store.delete, list(memory_ids))
        if scrub:
            await self.run(store.scrub)
        return removed

    async def archive(self, memory_id: int, reason: str) -> None:
        await self.run(store.archive, memory_id, reason)

    async def restore(self, memory_id: int) -> None:
        """Bring an archived memory back, re-embedding it now if Ollama can (else the backfill will)."""
        await self.run(store.restore, memory_id)
        memory = await self.run(store.get, memory_id)
        vecs = await self.embed_or_none([memory.text])
        if vecs is not None:
            await self.run(self._store_vectors, [memory_id], vecs)

    async def backfill(self, *, batch: int = EMBED_BATCH, progress: Callable[[int], None] | None = None) -> int:
        """Embed active memories that have no vector yet; returns how many were embedded.
        Stops quietly (returning the count so far) when Ollama is unavailable."""
        done = 0
        while True:
            pending = await self.run(store.unembedded_ids, batch)
            if not pending:
                return done
            vecs = await self.embed_or_none([text for _, text in pending])
            if vecs is None:
                return done
            stored = await self.run(self._store_vectors, [mid for mid, _ in pending], vecs)
            if stored == 0:
                return done
            done += stored
            if progress:
                progress(stored)

    def _store_vectors(self, conn: apsw.Connection, ids: list[int], vecs: list[list[float]]) -> int:
        with conn:
            info = self.index_for(conn, len(vecs[0]))
            if info is None:
                return 0
            for memory_id, vector in zip(ids, vecs):
                if len(vector) == info.dim:
                    store.set_vector(conn, info, memory_id, vector)
        return len(ids)

    async def reindex(self, *, progress: Callable[[int, int], None] | None = None) -> int:
        """Drop every vector and re-embed all active memories with the configured model."""
        probe = await self.ollama.embed(["muninn reindex probe"])  # fails loudly before anything is dropped
        total = await self.run(lambda conn: db.query_value(
            conn, "SELECT count(*) FROM memories WHERE archived_at IS NULL"))

        def reset(conn: apsw.Connection) -> None:
            with conn:
                vectors.drop_index(conn)
                vectors.create_index(conn, self.settings.embed_model, len(probe[0]))
        await self.run(reset)
        done = 0

        def step(n: int) -> None:
            nonlocal done
            done += n
            if progress:
                progress(done, total)
        count = await self.backfill(progress=step)
        if count < total:
            raise OllamaUnavailable(f"re-indexed {count} of {total} memories; Ollama stopped answering. "
                                    "Run `muninn reindex` again (or let maintenance backfill the rest).")
        return count

    # -- reads ---------------------------------------------------------------

    async def recall(self, query: str, viewer: Viewer, *, limit: int | None = None, as_of: float | None = None,
                     touch: bool = True, query_vector: Sequence[float] | None = None) -> retrieval.RecallResult:
        """Hybrid retrieval for `viewer`: FTS5 + vector KNN fused by RRF, then the graph, then touch.
        `query_vector` (an embedding of `query` made earlier) skips the embedding call."""
        limit = limit or self.settings.recall_limit
        now = as_of if as_of is not None else time.time()
        started = time.perf_counter()
        embedding = asyncio.create_task(self._query_vector(query) if query_vector is None
                                        else _given(list(query_vector)))
        try:
            keys, fts_hits, info = await self.run(self._fts_step, query, viewer, limit * 3, now, as_of)
        except BaseException:
            embedding.cancel()
            raise
        fts_done = time.perf_counter()
        vector, status = await embedding
        embed_done = time.perf_counter()
        if vector is not None:
            if info is None:
                vector, status = None, "no-embeddings"
            elif info.model != self.settings.embed_model:
                vector, status = None, "model-mismatch"
                self._warn_once("mismatch", f"vectors were made with {info.model!r}, OLLAMA_EMBED_MODEL is "
                                            f"{self.settings.embed_model!r}: run `muninn reindex`")
            elif len(vector) != info.dim:
                self._warn_once("wrong-size", f"{self.settings.embed_model} returned a {len(vector)}-dimensional "
                                              f"vector, the index holds {info.dim}: run `muninn reindex`")
                vector, status = None, "wrong-size"
        memories, candidates, mode, finish = await self.run(
            self._finish_step, keys, fts_hits, info, vector, limit, now, as_of, touch, dates.hints(query))
        result = retrieval.RecallResult(query=query, mode=mode, vector_status=status,
                                        memories=[retrieval.Recalled(memories[c.memory_id], c)
                                                  for c in candidates if c.memory_id in memories])
        result.timings_ms = {"fts": (fts_done - started) * 1000, "embed_wait": (embed_done - fts_done) * 1000,
                             **finish, "total": (time.perf_counter() - started) * 1000}
        return result

    def _fts_step(self, conn, query, viewer, candidates, now, as_of):
        keys = visible_keys(conn, viewer)
        hits = retrieval.fts_candidates(conn, query, keys, candidates, now, as_of)
        return keys, hits, vectors.index_info(conn)

    def _finish_step(self, conn, keys, fts_hits, info, vector, limit, now, as_of, touch, date_hints=()):
        t0 = time.perf_counter()
        vector_hits = (retrieval.vector_candidates(conn, info, vector, keys, limit * 3, as_of)
                       if vector is not None else [])
        t1 = time.perf_counter()
        fused = retrieval.fuse(fts_hits, vector_hits, k=self.settings.rrf_k, limit=len(fts_hits) + len(vector_hits),
                               weight_fts=self.settings.rrf_weight_fts, weight_vector=self.settings.rrf_weight_vec)
        fused = retrieval.spread_to_neighbours(conn, fused, keys, self.settings.neighbour_share, as_of)
        fused = ranking.final_order(conn, fused, now, time_weight=self.settings.time_weight, date_hints=date_hints,
                                    date_boost=self.settings.date_boost, tz=self.settings.timezone)
        if self.settings.rrf_weight_fts > 0:
            fused = ranking.keyword_winner_first(fused, self.settings.keyword_lead)
        fused = fused[:limit]
        linked = retrieval.graph_neighbours(conn, fused, keys, self.settings.graph_limit, as_of)
        chosen = fused + linked
        ids = [c.memory_id for c in chosen]
        if vector is not None and ids:
            ranking.measure_similarity(conn, vector, chosen)
        if touch and ids:
            floor = ranking.touch_floor(self.settings.embed_model, self.settings.touch_min_cosine)
            relevant = ranking.worth_touching(chosen, vector_ran=vector is not None, floor=floor)
            store.touch(conn, relevant, growth=self.settings.stability_growth, now=now)
            for cand in chosen:
                cand.touched = cand.memory_id in relevant
        memories = store.get_many(conn, ids)
        t2 = time.perf_counter()
        return (memories, chosen, retrieval.mode_of(vector is not None, fts_hits),
                {"vector": (t1 - t0) * 1000, "fuse_graph_touch": (t2 - t1) * 1000})

    async def _query_vector(self, query: str) -> tuple[list[float] | None, str]:
        if not self.ollama.enabled:
            return None, "disabled"
        if not any(ch.isalnum() for ch in query):
            return None, "empty-query"
        vecs, status = await self.embed_with_status([query])
        return (vecs[0] if vecs else None), status

    async def embed_or_none(self, texts: list[str]) -> list[list[float]] | None:
        """Embeddings, or None when Ollama cannot give them (the reason is logged)."""
        return (await self.embed_with_status(texts))[0]

    async def embed_with_status(self, texts: list[str]) -> tuple[list[list[float]] | None, str]:
        """(embeddings, "ok"), or (None, why not) — the vector_status values of RecallResult."""
        if not texts or not self.ollama.enabled:
            return None, "disabled"
        try:
            return await self.ollama.embed(texts), "ok"
        except OllamaDisabled:
            status = "disabled"
        except OllamaModelMissing as exc:
            self._warn_once("missing", str(exc))
            status = "model-missing"
        except OllamaUnavailable:
            status = "unreachable"  # the client has logged it, once per cooldown
        except OllamaBadResponse as exc:
            self._warn_once("bad", f"{exc}; recall uses keywords only")
            status = "bad-response"
        except OllamaError as exc:  # pragma: no cover - future subclasses
            self._warn_once("other", str(exc))
            status = "unreachable"
        return None, status

    def _warn_once(self, key: str, message: str, every: float = 60.0) -> None:
        if self._throttle.ready(key, every):
            log.warning(message)

    # -- inspection (never touches) -----------------------------------------

    async def list_visible(self, viewer: Viewer, *, scope: str | None = None, limit: int = 50, offset: int = 0):
        return await self.run(store.list_visible, viewer, scope=scope, limit=limit, offset=offset)

    async def get_visible(self, viewer: Viewer, memory_id: int) -> store.Memory:
        return await self.run(store.get_visible, viewer, memory_id)

    async def stats(self) -> dict:
        return await self.run(store.stats)
