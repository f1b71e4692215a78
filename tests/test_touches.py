"""Concurrent recalls share their touch (bot/memory/touches.py): fewer writer jobs, and every
memory's access_count, last_accessed and stability exactly as if each touch had been its own."""
from __future__ import annotations

import asyncio

import pytest

from bot.memory import decay, store, touches
from bot.memory.scope import Viewer
from bot.memory.store import NewMemory

ME = Viewer(user_id=7, dm=True)

pytestmark = pytest.mark.usefixtures("backend")  # on both storage backends


async def test_concurrent_recalls_count_every_touch_in_fewer_writer_jobs(fts_engine):
    ids = [await fts_engine.remember(NewMemory(f"the kayak trip number {i} on the lake", "personal", owner_id=7))
           for i in range(3)]
    before = {i: await fts_engine.get(i) for i in ids}
    jobs = fts_engine._touches.jobs
    results = await asyncio.gather(*(fts_engine.recall("kayak lake", ME) for _ in range(12)))
    assert all(set(r.ids) == set(ids) for r in results)
    growth = fts_engine.settings.stability_growth
    for memory_id in ids:
        after = await fts_engine.get(memory_id)
        assert after.access_count == before[memory_id].access_count + 12
        assert after.stability == pytest.approx(min(before[memory_id].stability * growth ** 12, decay.MAX_STABILITY_DAYS))
        assert after.last_accessed is not None  # its exact value: the next test (never goes back)
    assert fts_engine._touches.jobs - jobs < 12  # shared: one job took the touches queued while another ran
    for result in results:  # each recall returns its memories as read after its own touch
        assert all(r.memory.access_count >= before[r.memory.id].access_count + 1 for r in result.memories)


async def test_touches_of_one_job_end_as_if_each_was_its_own_transaction(fts_engine):
    a = await fts_engine.remember(NewMemory("alpha", "personal", owner_id=7))
    b = await fts_engine.remember(NewMemory("beta", "personal", owner_id=7))
    requests = [([a, b], [a, b], 1000.0), ([a], [a], 900.0), ([], [b], 950.0), ([b], [a, b], 1100.0)]
    loaded = await fts_engine.write(touches.touch_and_load_all, fts_engine.storage, requests, 1.5)
    assert [sorted(m) for m in loaded] == [[a, b], [a], [b], [a, b]]
    for memory_id, count, last in ((a, 2, 1000.0), (b, 2, 1100.0)):
        memory = await fts_engine.get(memory_id)
        assert (memory.access_count, memory.last_accessed) == (count, last)  # last_accessed never goes back
        assert loaded[-1][memory_id].access_count == count  # loaded after every touch of the job


async def test_a_failed_job_fails_each_waiting_recall_and_the_next_job_runs():
    calls: list[int] = []

    async def run(requests):
        calls.append(len(requests))
        if len(calls) == 1:
            raise store.MemoryNotFound("gone")
        return [{} for _ in requests]
    batcher = touches.TouchBatcher(run)
    first = asyncio.ensure_future(batcher.touch_and_load([1], [1], 1.0))
    second = asyncio.ensure_future(batcher.touch_and_load([2], [2], 1.0))
    results = await asyncio.gather(first, second, return_exceptions=True)
    assert all(isinstance(r, store.MemoryNotFound) for r in results) and calls == [2]
    assert await batcher.touch_and_load([3], [3], 1.0) == {} and calls == [2, 1]


@pytest.mark.sqlite_only("holds SQLite's write lock from a second connection")
async def test_a_recall_that_touches_nothing_takes_no_write_lock(fts_engine):
    import apsw
    kept = await fts_engine.remember(NewMemory("the kayak trip on the lake", "personal", owner_id=7))
    other = apsw.Connection(str(fts_engine.settings.db_path))
    other.execute("BEGIN IMMEDIATE")  # someone else writes for a long while
    try:
        loaded = await asyncio.wait_for(fts_engine.write(
            touches.touch_and_load_all, fts_engine.storage, [([], [kept], 1000.0)], 1.5), timeout=2)
        assert list(loaded[0]) == [kept]
    finally:
        other.execute("ROLLBACK")
        other.close()
