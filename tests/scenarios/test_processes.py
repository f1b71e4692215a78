"""Several processes on one database (a SQLite file, or PostgreSQL): the maintenance lease,
and facts stored by two at once.

Each Engine has its own connection and database thread, so two engines on one database contend
for its locks exactly as two bot processes do."""
from __future__ import annotations

import asyncio
import json
import logging
import time

import pytest

from bot.lifecycle import maintenance
from bot.lifecycle.fact_store import store_facts
from bot.lifecycle.facts import Fact
from bot.memory.engine import Engine
from bot.memory.sql import leases
from tests.helpers import ALICE, CHANNEL, GUILD, exchange, memories_of, one, until

pytestmark = pytest.mark.usefixtures("backend")  # two "processes" on one SQLite file or PostgreSQL database

DAY = 86400.0


@pytest.fixture
async def two(fake_ollama, make_settings):
    """Two engines (two "processes") on one database file."""
    settings = make_settings(fake_ollama.url)
    async with Engine(settings) as first, Engine(settings) as second:
        yield first, second


async def test_one_lease_holder_at_a_time_and_a_free_or_expired_lease_is_taken(two):
    first, second = two
    assert await first.take_lease("job", "a", 60) and not await second.take_lease("job", "b", 60)
    assert await first.take_lease("job", "a", 60)                 # the holder renews
    assert await second.lease_holder("job") == "a"
    assert not await second.release_lease("job", "b")             # only the holder can give it up
    assert await first.release_lease("job", "a") and await second.lease_holder("job") is None
    asked = time.time()
    assert await second.take_lease("job", "b", 1.0)
    refused = not await first.take_lease("job", "a", 60)
    assert refused or time.time() - asked >= 1.0                  # refused while b's lease stands (a stall aside)

    async def expired() -> bool:                                   # "b" died without releasing
        return await first.lease_holder("job") is None
    await until(expired, "expired")
    assert await first.take_lease("job", "a", 60)


async def test_contenders_racing_for_a_free_lease_get_exactly_one_holder(make_settings, fake_ollama):
    settings = make_settings(fake_ollama.url)
    engines = [Engine(settings) for _ in range(4)]
    try:
        for engine in engines:
            await engine.start()
        for round_ in range(5):
            won = await asyncio.gather(*(e.take_lease(f"race{round_}", f"h{i}", 60) for i, e in enumerate(engines)))
            assert sum(won) == 1
    finally:
        for engine in engines:
            await engine.close()


LEASE_S = 3.0  # renewed every second: a lapse needs a 2 s stall of a process (the bot's: 60 s of 90)


async def lease_row(engine: Engine) -> tuple[str, float] | None:
    """(holder, expiry) of the maintenance lease as stored (portable SQL: both backends)."""
    rows = await engine.read(lambda conn: conn.execute(
        "SELECT value FROM meta WHERE key = ?", (f"lease.{maintenance.MAINTENANCE_LEASE}",)).fetchall())
    if not rows:
        return None
    lease = json.loads(rows[0][0])
    return lease["holder"], float(lease["expires"])


async def renewals(engine: Engine, holder: str, count: int) -> None:
    """Until `holder` has renewed the lease `count` times from now (each renewal moves its expiry)."""
    seen: set[float] = set()

    async def renewed() -> bool:
        row = await lease_row(engine)
        if row is not None and row[0] == holder:
            seen.add(row[1])
        return len(seen) > count
    await until(renewed, f"renewed {count} times by {holder}")


async def test_maintenance_runs_in_exactly_one_process_and_the_other_takes_over(two, caplog):
    first, second = two
    faded = await first.remember(Fact("Alice had toast.", "Alice", "personal", 0.1, ALICE, CHANNEL, GUILD)
                                 .to_new_memory(created_at=time.time() - 60 * DAY))
    runs: list[str] = []
    real_run = maintenance.run_maintenance

    async def counted(engine):
        runs.append("first" if engine is first else "second")
        return await real_run(engine)

    with caplog.at_level(logging.INFO, logger="bot.lifecycle.maintenance"):
        maintenance.run_maintenance = counted  # type: ignore[assignment]
        try:
            tasks = {name: asyncio.create_task(maintenance.maintain_periodically(
                engine, hours=1.0, first_delay=0.0, lease_seconds=LEASE_S, holder=name))
                for name, engine in (("first", first), ("second", second))}

            async def ran() -> bool:
                return bool(runs) and await first.last_run("maintenance") is not None
            await until(ran, "run once")
            holder = runs[0]
            await renewals(first, holder, 2)                 # two renewals later: still one run
            assert len(runs) == 1 and (await one(first, faded)).archived_at is not None
            assert await first.lease_holder("maintenance") == holder
            tasks[holder].cancel()                          # the holder stops (and releases the lease)
            await asyncio.gather(tasks[holder], return_exceptions=True)
            other = "second" if holder == "first" else "first"

            async def taken_over() -> bool:
                return await first.lease_holder("maintenance") == other
            await until(taken_over, f"taken over by {other}")
            await renewals(first, other, 1)                 # it has looked at the schedule since
            assert len(runs) == 1            # the schedule is shared: the next run is due in an hour
            tasks[other].cancel()
            await asyncio.gather(tasks[other], return_exceptions=True)
        finally:
            maintenance.run_maintenance = real_run  # type: ignore[assignment]
    assert await first.lease_holder("maintenance") is None
    assert sum("now runs the periodic maintenance" in r.getMessage() for r in caplog.records) == 2


async def test_a_holder_that_dies_is_replaced_when_its_lease_expires(two):
    first, second = two
    assert await first.take_lease(maintenance.MAINTENANCE_LEASE, "crashed", 1.0)   # never renewed, never released
    [(_, expires)] = [await lease_row(first)]
    started: list[float] = []
    real_run = maintenance.run_maintenance

    async def timed(engine):
        started.append(time.time())
        return await real_run(engine)
    maintenance.run_maintenance = timed  # type: ignore[assignment]
    task = asyncio.create_task(maintenance.maintain_periodically(second, hours=1.0, first_delay=0.0,
                                                                lease_seconds=0.3, holder="heir"))
    try:
        async def ran() -> bool:
            return await second.last_run(maintenance.MAINTENANCE_LEASE) is not None
        await until(ran, "run by the heir")
        assert await second.lease_holder(maintenance.MAINTENANCE_LEASE) == "heir"
        assert len(started) == 1 and started[0] >= expires                        # not while the lease stood
    finally:
        maintenance.run_maintenance = real_run  # type: ignore[assignment]
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_two_processes_storing_the_same_facts_at_once_store_each_once(two, fake_ollama):
    first, second = two
    texts = [f"Alice's locker number is {n}" for n in range(8)]
    facts = [Fact(text, "Alice", "personal", 0.6, ALICE, CHANNEL, GUILD, (n,)) for n, text in enumerate(texts)]
    outcomes = await asyncio.gather(*(store_facts(engine, [fact], exchange(fact.text, message_id=n))
                                      for n, fact in enumerate(facts) for engine in (first, second)))
    stored = await memories_of(first)
    assert sorted(m.text for m in stored) == sorted(texts)           # each fact once, none lost
    for n in range(len(texts)):
        assert outcomes[2 * n] == outcomes[2 * n + 1]                # the second one reinforced the first


@pytest.mark.sqlite_only("leases.py's SQLite statement on a file (PostgreSQL's lease: the backend, tested above)")
def test_the_lease_row_is_one_statement_per_take(tmp_path):
    """A lease taken at `now` by one holder is refused to another until it expires (pure SQL)."""
    from bot.memory.sqlite import db
    conn = db.connect(tmp_path / "m.db")
    assert leases.take(conn, "x", "a", 10, now=100.0) and not leases.take(conn, "x", "b", 10, now=109.0)
    assert leases.take(conn, "x", "b", 10, now=111.0) and leases.holder_of(conn, "x", now=111.0) == "b"
    conn.close()


@pytest.mark.sqlite_only("a new SQLite file (PostgreSQL's concurrent migrators: memory/postgres/test_migrations.py)")
def test_processes_starting_at_once_on_a_new_file_create_the_schema_once(tmp_path):
    """Several shards started together by systemd: each applies the migrations it finds missing."""
    from concurrent.futures import ThreadPoolExecutor

    from bot.memory.sqlite import db
    from bot.memory.sqlite.migrations import MIGRATIONS, schema_version

    def open_and_close(_: int) -> int:
        conn = db.connect(tmp_path / "new.db")
        try:
            return schema_version(conn)
        finally:
            conn.close()
    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(open_and_close, range(4))) == [len(MIGRATIONS)] * 4


async def test_doctor_names_the_process_that_runs_maintenance(two):
    from bot.cli.doctor import database_checks
    first, _ = two
    assert not any(c.name == "maintenance" for c in await asyncio.to_thread(database_checks, first.settings))
    await first.take_lease("maintenance", "gpu-box:4242:abc", 60)
    [check] = [c for c in await asyncio.to_thread(database_checks, first.settings) if c.name == "maintenance"]
    assert check.ok and "gpu-box:4242:abc" in check.detail
