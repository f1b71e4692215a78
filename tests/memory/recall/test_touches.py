"""Concurrent recalls share their touch (bot/memory/recall/touches.py): fewer writer jobs, and every
memory's access_count, last_accessed and stability exactly as if each touch had been its own."""
from __future__ import annotations

import asyncio
import time

import pytest

from bot.memory import decay, records
from bot.memory.recall import touches
from bot.memory.records import NewMemory
from bot.memory.scope import Viewer

ME = Viewer(user_id=7, dm=True)

pytestmark = pytest.mark.usefixtures("backend")  # on both storage backends


async def test_concurrent_recalls_count_every_touch_in_fewer_writer_jobs(fts_engine):
    ids = [await fts_engine.remember(NewMemory(f"the kayak trip number {i} on the lake", "personal", owner_id=7))
           for i in range(3)]
    before = {i: await fts_engine.get(i) for i in ids}
    jobs = fts_engine._touches.jobs
    # the writer busy while the recalls read: their touches queue behind it, as they do when
    # recalls end faster than the writer applies one touch
    busy = asyncio.create_task(fts_engine.write(lambda conn: time.sleep(0.5)))
    results = await asyncio.gather(*(fts_engine.recall("kayak lake", ME) for _ in range(12)))
    await busy
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


async def test_a_failed_job_is_retried_one_request_at_a_time_and_the_next_job_runs():
    calls: list[int] = []

    async def run(requests):
        calls.append(len(requests))
        if len(calls) == 1 or requests[0][0] == [2]:  # the batch fails, then request 2 alone
            raise records.MemoryNotFound("gone")
        return [{r[0][0]: "touched"} for r in requests]

    async def load(ids):
        return {i: "untouched" for i in ids}
    batcher = touches.TouchBatcher(run, load)
    results = await asyncio.gather(*(batcher.touch_and_load([i], [i], 1.0) for i in (1, 2, 3)))
    assert results == [{1: "touched"}, {2: "untouched"}, {3: "touched"}] and calls == [3, 1, 1, 1]
    assert await batcher.touch_and_load([4], [4], 1.0) == {4: "touched"} and calls == [3, 1, 1, 1, 1]


def _refuse_touches(conn, backend: str, memory_id: int | None) -> None:
    """A database that refuses to touch one memory (or every memory): a real failure of the
    UPDATE inside the touch transaction, as a full disk or a damaged page makes one."""
    which = "" if memory_id is None else f"NEW.id = {memory_id}"
    if backend:  # the PostgreSQL test database outlives the test (emptied, not dropped): no trigger may stay
        conn.pg.execute("DROP TRIGGER IF EXISTS refuse_touch ON memories")
        conn.pg.execute("CREATE OR REPLACE FUNCTION refuse_touch() RETURNS trigger LANGUAGE plpgsql AS "
                        "$$ BEGIN RAISE EXCEPTION 'this touch is refused'; END $$")
        conn.pg.execute(f"CREATE TRIGGER refuse_touch BEFORE UPDATE OF access_count ON memories FOR EACH ROW "
                        f"{f'WHEN ({which})' if which else ''} EXECUTE FUNCTION refuse_touch()")
    else:
        conn.execute(f"CREATE TRIGGER refuse_touch BEFORE UPDATE OF access_count ON memories "
                     f"{f'WHEN {which}' if which else ''} BEGIN SELECT RAISE(ABORT, 'this touch is refused'); END")


def _accept_touches(conn, backend: str) -> None:
    conn.execute("DROP TRIGGER IF EXISTS refuse_touch" + (" ON memories" if backend else ""))


async def test_one_refused_touch_costs_no_recall_its_memories_and_no_other_its_touch(fts_engine, backend, caplog):
    topics = ("kayak", "violin", "pottery")
    ids = {t: await fts_engine.remember(NewMemory(f"the {t} lessons on tuesday", "personal", owner_id=7))
           for t in topics}
    await fts_engine.write(_refuse_touches, backend, ids["violin"])
    jobs = fts_engine._touches.jobs
    try:  # three recalls' touches queued together (recall's last step): one batch, whose transaction fails
        results = await asyncio.gather(*(fts_engine._touches.touch_and_load([ids[t]], [ids[t]], time.time())
                                         for t in topics))
    finally:
        await fts_engine.write(_accept_touches, backend)
    assert fts_engine._touches.jobs - jobs == 1
    assert [list(r) for r in results] == [[ids[t]] for t in topics]  # every recall has its memories
    for topic in topics:
        memory = await fts_engine.get(ids[topic])
        assert memory.access_count == (0 if topic == "violin" else 1), topic  # the others' clocks are exact
        assert (memory.last_accessed is None) == (topic == "violin")
    warnings = [r.getMessage() for r in caplog.records if "could not count" in r.getMessage()]
    assert len(warnings) == 1 and "1 of 3 recalls" in warnings[0] and "this touch is refused" in warnings[0]


async def test_when_no_touch_can_be_written_recalls_answer_untouched(fts_engine, backend, caplog):
    kayak = await fts_engine.remember(NewMemory("the kayak trip on the lake", "personal", owner_id=7))
    await fts_engine.write(_refuse_touches, backend, None)
    try:
        results = await asyncio.gather(*(fts_engine.recall("kayak lake", ME) for _ in range(4)))
    finally:
        await fts_engine.write(_accept_touches, backend)
    assert all(r.ids == [kayak] and r.memories[0].memory.text == "the kayak trip on the lake" for r in results)
    assert (await fts_engine.get(kayak)).access_count == 0
    assert any("could not count" in r.getMessage() and "this touch is refused" in r.getMessage()
               for r in caplog.records)


@pytest.mark.sqlite_only("holds SQLite's write lock from a second connection")
async def test_a_locked_database_costs_a_recall_one_lock_wait_and_no_retries(fts_engine, caplog):
    import apsw
    kayak = await fts_engine.remember(NewMemory("the kayak trip on the lake", "personal", owner_id=7))
    await fts_engine._run(lambda conn: conn.set_busy_timeout(300))
    other = apsw.Connection(str(fts_engine.settings.db_path))
    other.execute("BEGIN IMMEDIATE")  # another process writes for a long while
    try:
        started = time.monotonic()
        results = await asyncio.gather(*(fts_engine._touches.touch_and_load([kayak], [kayak], time.time())
                                         for _ in range(3)))
        waited = time.monotonic() - started
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert all(list(r) == [kayak] for r in results)
    assert waited < 1.0  # one busy timeout (0.3 s): not one more per request (1.2 s), nor write_transaction's four
    assert (await fts_engine.get(kayak)).access_count == 0
    assert any("could not count 3 of 3 recalls" in r.getMessage() and "locked" in r.getMessage()
               for r in caplog.records)


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
