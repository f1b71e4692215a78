"""Recall as the engine runs it: the embedding call beside the reads, the touch, the result (a part of Engine).

A recall is few jobs on the engine's threads: the keyword step on a read connection while the
question is embedded, then the search step (in the same job when the vector is ready by then:
recall/steps.py, `read_steps`), then the touch on the writer, shared with the recalls in flight
(recall/touches.py). Background work asks `yield_to_recalls` to wait for the recalls in flight.
"""
from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any, Callable, Sequence, TypeVar

from bot.llm.ollama import usable_vector
from bot.memory import records
from bot.memory.recall import dates, ranking, retrieval, steps, touches
from bot.memory.recall.beside import WalkBeside
from bot.memory.recall.retrieval import VectorStatus
from bot.memory.scope import Viewer
from bot.memory.sql import transactions
from bot.memory.storage import Connection, Storage
from bot.memory.vectors.cache import VectorCache
from bot.settings import Settings
from bot.validate import FUTURE_SLACK_S, MAX_RECALL_LIMIT

T = TypeVar("T")

# Background work (maintenance) waits for the recalls in flight to end before each of its steps,
# at most this long, so a bot that never stops talking still gets its maintenance done.
YIELD_MAX_S = 2.0


def waiting_once(conn: Connection, job: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`job` on the writer, its lock waits limited to one busy timeout (Engine.write retries)."""
    with transactions.single_lock_wait():
        return job(conn, *args, **kwargs)


def _given(vector: list[float]) -> steps.Question:
    return (vector, VectorStatus.OK) if usable_vector(vector) else (None, VectorStatus.BAD_RESPONSE)


class Recalling:
    """Engine's recall (mixed into bot/memory/engine.py's Engine)."""

    storage: Storage[Any]
    settings: Settings
    _touches: touches.TouchBatcher
    _recalls_in_flight: int
    _no_recall: asyncio.Event | None
    vector_cache: VectorCache
    walk_beside: bool

    async def _run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        raise NotImplementedError

    async def _read(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        raise NotImplementedError

    async def _query_vector(self, query: str) -> steps.Question:
        raise NotImplementedError

    def _beside(self, fn: Callable[..., Any], *args: Any) -> Any:
        raise NotImplementedError

    def _warn_once(self, key: str, message: str, every: float = 60.0) -> None:
        raise NotImplementedError

    async def recall(self, query: str, viewer: Viewer, *, limit: int | None = None, as_of: float | None = None,
                     touch: bool = True, query_vector: Sequence[float] | None = None) -> retrieval.RecallResult:
        """Hybrid retrieval for `viewer`: FTS5 + vector KNN fused (recall/fusion.py), then the graph, then touch.
        `query_vector` (an embedding of `query` made earlier) skips the embedding call."""
        self._recalls_in_flight += 1
        if self._no_recall is not None:
            self._no_recall.clear()
        try:
            return await self._recall(query, viewer, limit=limit, as_of=as_of, touch=touch, query_vector=query_vector)
        finally:
            self._recalls_in_flight -= 1
            if self._recalls_in_flight == 0 and self._no_recall is not None:
                self._no_recall.set()

    async def yield_to_recalls(self, longest: float = YIELD_MAX_S) -> None:
        """For background work (maintenance), between its steps: wait until no recall of this
        process is in flight, `longest` seconds at most (other processes' recalls are not seen).
        A step that overlaps a recall takes cores, the GIL and the writer from it."""
        if self._recalls_in_flight == 0:
            return
        if self._no_recall is None:
            self._no_recall = asyncio.Event()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._no_recall.wait(), longest)

    async def _recall(self, query: str, viewer: Viewer, *, limit: int | None, as_of: float | None,
                      touch: bool, query_vector: Sequence[float] | None) -> retrieval.RecallResult:
        # Callers validate their limit (bot/validate.py); the cap here keeps vec0's k (3 x limit) legal.
        limit = min(limit or self.settings.recall_limit, MAX_RECALL_LIMIT)
        now = as_of if as_of is not None else time.time()
        started = time.perf_counter()
        hints = dates.hints(query, now, self.settings.timezone)
        embedding: asyncio.Task[steps.Question] | None = None
        beside = (WalkBeside(self._beside, self.storage, self.settings.embed_model, limit * steps.VECTOR_DEPTH, as_of,
                             self.vector_cache.answers_alone) if self.walk_beside else None)
        if query_vector is not None:
            slot = steps.VectorSlot(_given(list(query_vector)), beside)
        else:
            slot = steps.VectorSlot(beside=beside)
            embedding = asyncio.create_task(self._query_vector(query))
            embedding.add_done_callback(slot.take)
        try:
            reading = await self._read(steps.read_steps, self.storage, self.settings, query, viewer, limit, now, as_of,
                                       hints, slot, not touch)
        except BaseException:
            if embedding is not None:
                embedding.cancel()
            if beside is not None:
                beside.cancel()
            raise
        fts_done = embed_done = reading.keyword_done
        if reading.searched is None:  # the embedding was still under way when the keyword step ended
            assert embedding is not None  # a given vector is in the slot from the start
            question = await embedding
            if embedding.cancelling():
                # our cancellation went to the embedding, and a client library turned it into a
                # timeout it handled: the caller still asked to stop (a Ctrl-C, a shutdown)
                raise asyncio.CancelledError
            embed_done = time.perf_counter()
            try:
                reading = await self._read(steps.search_into, self.storage, self.settings, reading, question, limit,
                                           now, as_of, hints, not touch)
            except BaseException:
                if beside is not None:
                    beside.cancel()
                raise
        searched, vector, status = reading.searched, reading.vector, reading.status
        assert searched is not None
        if reading.warning is not None:
            self._warn_once(*reading.warning)
        candidates, mode, finish = searched.chosen, searched.mode, searched.timings_ms
        t0 = time.perf_counter()
        ids = [c.memory_id for c in candidates]
        if touch and ids:  # only what was relevant counts as recalled (ranking.py: the touch floor)
            floor = ranking.touch_floor(self.settings.embed_model, self.settings.touch_min_cosine)
            relevant = ranking.worth_touching(candidates, vector_ran=vector is not None, floor=floor)
            for cand in candidates:
                cand.touched = cand.memory_id in relevant
            # never stamp a future recall time: it would pin the memories so they never fade
            memories = await self._touches.touch_and_load(relevant, ids, min(now, time.time() + FUTURE_SLACK_S))
        elif reading.loaded is not None:
            memories = reading.loaded
        else:
            memories = await self._read(self.storage.get_many, ids)
        finish["fuse_graph_touch"] += (time.perf_counter() - t0) * 1000
        # a memory archived (or forgotten) since the search is not returned: archived ones never are
        result = retrieval.RecallResult(query=query, mode=mode, vector_status=status,
                                        memories=[retrieval.Recalled(memories[c.memory_id], c) for c in candidates
                                                  if c.memory_id in memories and memories[c.memory_id].archived_at is None],
                                        floor=None if vector is None else ranking.inject_floor(
                                            self.settings.embed_model, self.settings.inject_min_cosine))
        result.timings_ms = {"fts": (fts_done - started) * 1000, "embed_wait": (embed_done - fts_done) * 1000,
                             **finish, "total": (time.perf_counter() - started) * 1000}
        return result

    async def _touch_batch(self, requests: list[tuple[list[int], list[int], float]]) -> list[dict[int, records.Memory]]:
        """The touches of the recalls waiting for one (touches.TouchBatcher), in one writer job."""
        # One wait for the lock, not write_transaction's four: a reply does not wait 20 s for bookkeeping
        # (a touch that fails is retried alone or skipped: touches.TouchBatcher).
        return await self._run(waiting_once, touches.touch_and_load_all, self.storage, requests,
                               self.settings.stability_growth)

    async def _load_untouched(self, ids: list[int]) -> dict[int, records.Memory]:
        """A recall's memories when its touch failed: read as they are."""
        return await self._read(self.storage.get_many, ids)
