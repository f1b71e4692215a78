"""`muninn maintain` after a run of it was killed (kill -9, a crash): the dead run's lease is
taken over at once, not refused as "already running in another process" until it expires
(90 s). A live holder, or one of another machine, is still waited for."""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bot.cli import main as cli
from bot.lifecycle import maintenance
from bot.memory.engine import Engine
from bot.memory.sql import leases

pytestmark = pytest.mark.usefixtures("backend")  # the lease row on a SQLite file or PostgreSQL

ROOT = Path(__file__).resolve().parents[2]
HOLDER_OF_A_CHILD = "from bot.memory.sql.leases import new_holder; print(new_holder(), flush=True)"


def child_holder(*, stay: bool) -> tuple[str, subprocess.Popen]:
    """The lease name a `muninn` process of this machine would use; the process exits (a killed
    run: its parent collected it, as a shell does) or stays running."""
    code = HOLDER_OF_A_CHILD + ("; import sys; sys.stdin.read()" if stay else "")
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout is not None
    holder = proc.stdout.readline().strip()
    if not stay:
        proc.wait(10)
    return holder, proc


@pytest.fixture
def maintain(make_settings, monkeypatch, capsys):
    settings = make_settings("")
    monkeypatch.setenv("MUNINN_DB_PATH", str(settings.db_path))
    monkeypatch.setenv("MUNINN_DATABASE_URL", settings.database_url)
    monkeypatch.setenv("OLLAMA_URL", "")

    async def run() -> tuple[int, str]:  # the command runs its own event loop: in a thread
        code = await asyncio.to_thread(cli.main, ["maintain", "--no-llm", "--json"])
        out = capsys.readouterr()
        return code, out.out + out.err
    return settings, run


async def test_the_lease_of_a_killed_run_on_this_machine_is_taken_over_at_once(maintain, caplog):
    settings, run = maintain
    dead, _ = child_holder(stay=False)
    assert leases.abandoned(dead)
    async with Engine(settings) as engine:
        assert await engine.take_lease(maintenance.MAINTENANCE_LEASE, dead, 90.0)   # then kill -9
    with caplog.at_level("WARNING", logger="bot.lifecycle.maintenance"):
        code, out = await run()
    assert code == 0 and "seconds" in json.loads(out)
    assert any(f"took over the maintenance lease of {dead}" in r.getMessage() for r in caplog.records)
    async with Engine(settings) as engine:
        assert await engine.lease_holder(maintenance.MAINTENANCE_LEASE) is None       # released after the run
        assert await engine.last_run(maintenance.MAINTENANCE_LEASE) is not None


async def test_a_live_holder_or_one_of_another_machine_is_waited_for(maintain):
    settings, run = maintain
    alive, proc = child_holder(stay=True)
    try:
        assert not leases.abandoned(alive)
        elsewhere = alive.replace(alive.rsplit("@", 1)[1], "0" * 8)   # the same pid on another machine
        for holder in (alive, elsewhere, "bot-shard-0"):
            async with Engine(settings) as engine:
                assert await engine.take_lease(maintenance.MAINTENANCE_LEASE, holder, 90.0)
            code, out = await run()
            assert code == 2 and f"maintenance is already running in another process ({holder})" in out
            async with Engine(settings) as engine:
                assert await engine.lease_holder(maintenance.MAINTENANCE_LEASE) == holder
                assert await engine.release_lease(maintenance.MAINTENANCE_LEASE, holder)
    finally:
        proc.communicate("")
    assert leases.abandoned(alive)     # now it has ended
