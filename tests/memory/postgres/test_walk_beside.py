"""A recall's vector search on a second read connection beside its keyword step (recall/beside.py),
on the real server: both ran, at the same time, on two connections, and the recall found what the
one-connection recall finds; a walk that has not begun is withdrawn, never waited for."""
from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

from bot.memory.engine import Engine
from bot.memory.recall.beside import WalkBeside
from bot.memory.records import NewMemory
from bot.memory.scope import Viewer
from bot.memory.vectors.index import IndexInfo

ME = Viewer(user_id=7, dm=True)
QUESTIONS = ("where did the kayak trip go", "what did we eat for lunch", "the cold lake", "paddle")
SLOW_S = 0.3  # the keyword step made this much longer, by the server itself (pg_sleep)


# No vector cache: every key is searched in the server, as a key too big for the cache is (with
# every key held, a search is this process's own work and nothing is handed over).
NO_CACHE = {"MUNINN_VECTOR_CACHE_MB": "0"}


@pytest.fixture
async def pg_engine(fake_ollama, make_settings, postgres_url):
    async with Engine(make_settings(fake_ollama.url, MUNINN_DATABASE_URL=postgres_url, **NO_CACHE)) as engine:
        for n, text in enumerate(("the kayak trip went down the river", "a kayak needs a paddle",
                                  "the trip to the lake was cold", "lunch was soup", "soup again for lunch",
                                  "the river was fast", "we ate at the lake")):
            await engine.remember(NewMemory(f"{text} ({n})", "personal", owner_id=7))
            await engine.remember(NewMemory(f"{text}, said in the channel", "global"))
        yield engine


class Timed:
    """Wraps the storage's keyword step and vector search (the real ones, run as they are): when
    each ran, on which server connection; the keyword step waits SLOW_S in the server first."""

    def __init__(self, storage, slow: bool) -> None:
        self.runs: list[tuple[str, int, float, float]] = []  # (step, backend pid, start, end)
        self.lock = threading.Lock()
        keyword, vector = storage.keyword_step, storage.vector_candidates

        def keyword_step(conn, *args, **kwargs):
            return self._timed("keyword", conn, keyword, conn, *args, slow=slow, **kwargs)

        def vector_candidates(conn, *args, **kwargs):
            return self._timed("vector", conn, vector, conn, *args, **kwargs)
        storage.keyword_step, storage.vector_candidates = keyword_step, vector_candidates
        self.storage = storage

    def _timed(self, step, conn, fn, *args, slow=False, **kwargs):
        started = time.perf_counter()
        if slow:
            conn.pg.execute("SELECT pg_sleep(%s)", (SLOW_S,))
        try:
            return fn(*args, **kwargs)
        finally:
            with self.lock:
                self.runs.append((step, conn.pg.info.backend_pid, started, time.perf_counter()))

    def undo(self) -> None:
        del self.storage.keyword_step, self.storage.vector_candidates

    def overlapped(self) -> bool:
        (_, kpid, k0, k1), = [run for run in self.runs if run[0] == "keyword"]
        (_, vpid, v0, v1), = [run for run in self.runs if run[0] == "vector"]
        return kpid != vpid and v0 < k1 and k0 < v1


async def _recall(engine, question, **kwargs) -> tuple[list[int], str]:
    result = await engine.recall(question, ME, touch=False, **kwargs)
    return result.ids, result.vector_status


async def test_the_vector_search_runs_beside_the_keyword_step_and_finds_the_same(pg_engine, fake_ollama):
    assert pg_engine.walk_beside  # PostgreSQL, three readers by default
    for question in QUESTIONS:
        vector = fake_ollama.embed_text(question)
        pg_engine.walk_beside = False
        alone = await _recall(pg_engine, question, query_vector=vector)
        pg_engine.walk_beside = True
        timed, before = Timed(pg_engine.storage, slow=True), pg_engine.side_reads
        try:
            beside = await _recall(pg_engine, question, query_vector=vector)
        finally:
            timed.undo()
        assert pg_engine.side_reads == before + 1
        assert timed.overlapped()  # two connections, at the same time
        assert beside == alone and alone[1] == "ok" and alone[0]


async def test_an_embedding_that_answers_during_the_keyword_step_starts_the_walk(pg_engine, fake_ollama):
    question = QUESTIONS[0]
    pg_engine.walk_beside = False
    alone = await _recall(pg_engine, question)
    pg_engine.walk_beside = True
    fake_ollama.mode, fake_ollama.delay = "slow", SLOW_S / 3  # answers while the keyword step waits
    timed = Timed(pg_engine.storage, slow=True)
    try:
        before_jobs, before_side = pg_engine.read_jobs, pg_engine.side_reads
        beside = await _recall(pg_engine, question)
    finally:
        timed.undo()
    assert (pg_engine.read_jobs - before_jobs, pg_engine.side_reads - before_side) == (1, 1)
    assert timed.overlapped()
    assert beside == alone and alone[1] == "ok"


async def test_an_embedding_slower_than_the_keyword_step_adds_no_walk(pg_engine, fake_ollama):
    fake_ollama.mode, fake_ollama.delay = "slow", 0.3
    before = pg_engine.side_reads
    ids, status = await _recall(pg_engine, QUESTIONS[0])
    assert pg_engine.side_reads == before and status == "ok" and ids  # searched in its own job, as before


async def test_many_recalls_in_flight_on_few_readers_finish_with_the_same_memories(
        fake_ollama, make_settings, postgres_url):
    async with Engine(make_settings(fake_ollama.url, MUNINN_DATABASE_URL=postgres_url, MUNINN_DB_READERS="2",
                                     **NO_CACHE)) as engine:
        for n in range(30):
            await engine.remember(NewMemory(f"kayak trip number {n} down the river to the lake", "global"))
        vectors = {q: fake_ollama.embed_text(q) for q in QUESTIONS}
        engine.walk_beside = False
        alone = [await _recall(engine, q, query_vector=vectors[q]) for q in QUESTIONS]
        engine.walk_beside = True
        together = await asyncio.wait_for(asyncio.gather(
            *(_recall(engine, q, query_vector=vectors[q]) for _ in range(5) for q in QUESTIONS)), 30)
        assert together == alone * 5  # every reader busy: walks queued behind them were withdrawn, none waited


def _index(dim: int = 3) -> IndexInfo:
    return IndexInfo("m", dim)


class Searches:
    """What WalkBeside hands over: the storage's search, never run by these tests' submit."""

    def vector_candidates(self, *args):
        raise AssertionError("the test's submit runs nothing")


def test_a_walk_is_taken_only_for_the_index_vector_and_keys_it_searched():
    pool = ThreadPoolExecutor(1)
    try:
        submitted: list[tuple] = []

        def submit(fn, *args) -> Future:
            submitted.append((fn, *args))
            return pool.submit(lambda: ["hits"])
        vector, keys = [0.1, 0.2, 0.3], ["g"]
        storage = Searches()
        walk = WalkBeside(submit, storage=storage, model="m", depth=30, as_of=None)  # type: ignore[arg-type]
        walk.vector_known(vector)
        assert walk.future is None  # the keys are not known yet
        walk.keys_known(keys)
        walk.future.result()
        assert submitted == [(storage.vector_candidates, _index(), vector, keys, 30, None)]
        assert walk.take(_index(), vector, keys) == ["hits"]
        other = WalkBeside(submit, storage, "m", 30, None)  # type: ignore[arg-type]
        other.keys_known(keys)
        other.vector_known(vector)
        other.future.result()
        assert other.take(IndexInfo("another model", 3), vector, keys) is None  # the check dropped the vector
        late = WalkBeside(submit, storage, "m", 30, None)  # type: ignore[arg-type]
        late.keys_known(keys)
        late.no_more()
        late.vector_known(vector)
        assert late.future is None and late.take(_index(), vector, keys) is None
    finally:
        pool.shutdown()


def test_a_walk_still_queued_is_withdrawn_not_waited_for():
    pool, gate = ThreadPoolExecutor(1), threading.Event()
    try:
        pool.submit(gate.wait)  # the only reader is busy
        walk = WalkBeside(lambda fn, *args: pool.submit(lambda: ["hits"]), Searches(), "m", 30, None)  # type: ignore[arg-type]
        walk.keys_known(["g"])
        walk.vector_known([0.1, 0.2, 0.3])
        assert walk.take(_index(), walk._vector, ["g"]) is None and walk.future.cancelled()
    finally:
        gate.set()
        pool.shutdown()


async def test_keys_the_vector_cache_holds_are_searched_in_the_same_job(fake_ollama, make_settings, postgres_url):
    async with Engine(make_settings(fake_ollama.url, MUNINN_DATABASE_URL=postgres_url)) as engine:
        await engine.remember(NewMemory("the kayak trip went down the river", "personal", owner_id=7))
        question = QUESTIONS[0]
        vector = fake_ollama.embed_text(question)
        await _recall(engine, question, query_vector=vector)  # the cache loads the viewer's keys
        before = engine.side_reads
        ids, status = await _recall(engine, question, query_vector=vector)
        assert engine.side_reads == before and status == "ok" and ids  # searched in memory, not handed over
