"""WAL checkpoints run on the engine's loader thread, never inside the writer's commits
(bot/memory/sqlite/checkpoints.py); at most one waits; closing leaves none behind; a reader that holds
old pages (another process) only makes one stop short; recall sees every write throughout."""
from __future__ import annotations

import asyncio
import threading
import time
from contextlib import contextmanager
from typing import Iterator

import apsw
import pytest

from bot.memory import records
from bot.memory.engine import Engine
from bot.memory.scope import Viewer
from bot.memory.sql import queries
from bot.memory.sqlite import checkpoints, db
from tests.helpers import until

pytestmark = pytest.mark.sqlite_only("SQLite's WAL and its checkpoints")

EVERY = 40  # pages: a handful of commits of the text below
VIEWER = Viewer(user_id=7, channel_id=1, guild_id=1)


@pytest.fixture(autouse=True)
def small_threshold(monkeypatch):
    monkeypatch.setattr(checkpoints, "EVERY_PAGES", EVERY)
    monkeypatch.delenv("MUNINN_WAL_CHECKPOINT", raising=False)


def bulky(i: int) -> records.NewMemory:
    """A global memory of ~3 KB with a word of its own (`word{i}x`): a few WAL pages per commit."""
    filler = " ".join(f"filler{i}n{j}" for j in range(300))
    return records.NewMemory(f"word{i}x {filler}", "global", owner_id=1)


async def write_burst(engine: Engine, count: int, start: int = 0) -> list[int]:
    return [await engine.remember(bulky(i)) for i in range(start, start + count)]


async def small_write(engine: Engine) -> None:
    """A commit of a page or two: far from another EVERY pages."""
    await engine.write(lambda conn: queries.set_meta(conn, "small", str(time.perf_counter_ns())))  # a new value: a page written


@contextmanager
def loader_checkpointing(checks: checkpoints.Checkpoints) -> Iterator[None]:
    """As while a checkpoint runs on the loader thread (the engine's own code waits on this state)."""
    with checks._lock:
        checks._running = True
    try:
        yield
    finally:
        with checks._lock:
            checks._running = False
            checks._lock.notify_all()


def ran(engine: Engine) -> list[checkpoints.Checkpoint]:
    assert engine.storage.checkpoints is not None  # type: ignore[attr-defined]
    return list(engine.storage.checkpoints.history)  # type: ignore[attr-defined]


def block_loader(engine: Engine) -> threading.Event:
    """Keep the engine's loader thread busy until the returned event is set."""
    started, release = threading.Event(), threading.Event()

    def busy(conn: object) -> None:
        started.set()
        release.wait(30)
    engine.vector_cache.background(busy)  # type: ignore[misc]
    assert started.wait(10)  # its read connection is open: opening one holds checkpoints back
    return release


async def test_a_burst_of_writes_checkpoints_on_the_loader_thread_not_in_the_commits(make_settings):
    async with Engine(make_settings()) as engine:
        await engine.warmed()  # the loader free (a loaded machine stretches the start-up warm past the burst)
        assert await engine.write(lambda conn: queries.query_value(conn, "PRAGMA wal_autocheckpoint")) == 0
        await write_burst(engine, 60)
        await until(lambda: len(ran(engine)) >= 1, "checkpointed")  # under load, one may cover the whole burst
        done = ran(engine)
        assert {c.thread.split("_")[0] for c in done} == {"muninn-vecload"}
        assert all(c.copied_pages > 0 for c in done)


async def test_at_most_one_checkpoint_waits_while_the_loader_is_busy(make_settings, monkeypatch):
    monkeypatch.setattr(checkpoints, "INLINE_AFTER", 10_000)  # never the writer's own (below)
    async with Engine(make_settings()) as engine:
        release = block_loader(engine)
        try:
            await write_burst(engine, 60)  # the WAL passes the threshold several times over
            checks = engine.storage.checkpoints  # type: ignore[attr-defined]
            assert checks.skipped > 0 and ran(engine) == []
        finally:
            release.set()
        await until(lambda: len(ran(engine)) == 1, "checkpointed once")
        await asyncio.sleep(0.2)
        assert len(ran(engine)) == 1  # the skipped ones were not queued behind it


async def test_a_checkpoint_kept_waiting_by_a_busy_loader_is_run_by_the_writer(make_settings):
    """The loader busy for long (the start-up warm at 1M: ~25 s): past INLINE_AFTER x the
    threshold the writer checkpoints itself, so the WAL does not grow without end; the queued
    job finds it done and does not run a second time."""
    async with Engine(make_settings()) as engine:
        release = block_loader(engine)
        checks = engine.storage.checkpoints  # type: ignore[attr-defined]
        try:
            await write_burst(engine, 60)
            done = ran(engine)
            assert checks.stale >= 1 and done and {c.thread.split("_")[0] for c in done} == {"muninn-db"}
            assert max(c.wal_pages for c in done) <= (checkpoints.INLINE_AFTER + 1) * EVERY + 200
        finally:
            release.set()
        await asyncio.sleep(0.3)
        assert {c.thread.split("_")[0] for c in ran(engine)} <= {"muninn-db", "muninn-vecload"}


async def test_close_runs_the_queued_checkpoint_so_the_file_is_left_tidy(make_settings, monkeypatch):
    monkeypatch.setattr(checkpoints, "INLINE_AFTER", 10_000)
    engine = await Engine(make_settings()).start()
    release = block_loader(engine)
    await write_burst(engine, 20)
    checks = engine.storage.checkpoints  # type: ignore[attr-defined]
    assert ran(engine) == [] and checks._queued


    def release_once_checkpointed() -> None:  # close() waits for the loader, blocking the event loop
        for _ in range(3000):
            if checks.history:
                break
            threading.Event().wait(0.01)
        release.set()
    releaser = threading.Thread(target=release_once_checkpointed)
    releaser.start()
    await engine.close()
    releaser.join()
    last = checks.history[-1]
    assert last.thread.startswith("muninn-db") and last.copied_pages == last.wal_pages > 0
    assert len(checks.history) == 1  # the loader skipped its copy of the job


async def test_a_reader_holding_old_pages_stops_a_checkpoint_short_and_loses_nothing(make_settings):
    settings = make_settings()
    async with Engine(settings) as engine:
        ids = await write_burst(engine, 3)
        checks = engine.storage.checkpoints  # type: ignore[attr-defined]
        await until(lambda: not (checks._queued or checks._running), "done with the checkpoint of those")
        other = db.connect(settings.db_path, migrate_schema=False)  # another process's reader, mid-read
        other.execute("BEGIN")
        assert queries.query_value(other, "SELECT count(*) FROM memories") == 3
        before = len(ran(engine))
        ids += await write_burst(engine, 40, start=3)
        await until(lambda: len(ran(engine)) > before, "checkpointed")
        assert all(c.copied_pages < c.wal_pages for c in ran(engine)[before:])  # stopped short of its pages
        other.execute("COMMIT")
        seen = len(ran(engine))
        ids += await write_burst(engine, 40, start=43)
        await until(lambda: any(c.copied_pages == c.wal_pages for c in ran(engine)[seen:]), "checkpointed all")
        assert queries.query_value(other, "SELECT count(*) FROM memories") == len(ids) == 83
        other.close()
        assert set(await engine.read(lambda c: [r[0] for r in c.execute("SELECT id FROM memories")])) == set(ids)


async def test_a_wal_whose_next_write_began_before_its_checkpoint_ended_is_started_over(make_settings):
    """SQLite starts the WAL over only at a write that begins once all of it is copied. When the
    next write has already begun (a burst of writes), the checkpoint asks for a RESTART; the
    writer being busy then, after the next commit. Without it the WAL grew without end."""
    settings = make_settings()
    async with Engine(settings) as engine:
        checks = engine.storage.checkpoints  # type: ignore[attr-defined]
        release = block_loader(engine)
        await write_burst(engine, 6)  # past RESTART_AFTER x EVERY pages, its checkpoint waiting
        assert checks._queued
        other = db.connect(settings.db_path, migrate_schema=False)  # the next write, already begun
        other.execute("BEGIN IMMEDIATE")
        other.execute("INSERT INTO meta(key, value) VALUES('next', 'write')")
        release.set()
        await until(lambda: len(checks.history) == 1 and not checks._running, "checkpointed")
        assert checks.history[0].copied_pages == checks.history[0].wal_pages >= checkpoints.RESTART_AFTER * EVERY
        assert checks.restarts == 0  # the write lock was taken: after the next commit
        other.execute("COMMIT")
        await small_write(engine)  # began after the checkpoint, yet the WAL is not all copied
        await until(lambda: checks.restarts == 1 and not (checks._queued or checks._running), "started over")
        await small_write(engine)
        wal_pages, _ = other.wal_checkpoint("main", apsw.SQLITE_CHECKPOINT_PASSIVE)
        assert wal_pages < EVERY  # this write started the WAL over
        other.close()


async def test_recall_sees_every_write_while_checkpoints_run(make_settings):
    async with Engine(make_settings()) as engine:
        for i in range(60):
            memory_id = await engine.remember(bulky(i))
            result = await engine.recall(f"word{i}x", VIEWER)
            assert memory_id in result.ids, i
        assert len(ran(engine)) >= 1


async def test_inline_switch_checkpoints_in_the_commit(make_settings, monkeypatch):
    """The A/B switch of bench/tail.py: as SQLite's automatic checkpoint, on the writer's thread."""
    monkeypatch.setenv("MUNINN_WAL_CHECKPOINT", "inline")
    async with Engine(make_settings()) as engine:
        await write_burst(engine, 30)
        assert ran(engine) and {c.thread.split("_")[0] for c in ran(engine)} == {"muninn-db"}


async def test_a_scrub_waits_for_a_running_checkpoint(make_settings):
    """forget(scrub=True) truncates the WAL itself: a background checkpoint holding the checkpoint
    lock would make it leave the forgotten words there, silently."""
    async with Engine(make_settings()) as engine:
        checks = engine.storage.checkpoints  # type: ignore[attr-defined]
        memory_id = await engine.remember(bulky(0))
        await until(lambda: not (checks._queued or checks._running), "done with the checkpoint of that write")
        with loader_checkpointing(checks):
            scrub = asyncio.create_task(engine.forget([memory_id], scrub=True))
            await asyncio.sleep(0.3)
            assert not scrub.done()
        assert await scrub == 1


async def test_a_read_connection_opens_between_background_checkpoints(make_settings):
    """Opening checks the file's header against its size (files.check_before_open); mid-copy, a
    checkpoint has written page 1 before extending the file, and the check saw it "truncated"."""
    async with Engine(make_settings()) as engine:
        checks = engine.storage.checkpoints  # type: ignore[attr-defined]
        with loader_checkpointing(checks):
            first_read = asyncio.create_task(engine.read(lambda conn: queries.query_value(conn, "SELECT 1")))
            await asyncio.sleep(0.3)
            assert not first_read.done()
        assert await first_read == 1
