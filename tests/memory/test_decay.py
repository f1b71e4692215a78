"""The Ebbinghaus model with a fixed clock: retention, stability growth on recall, ranking."""
from __future__ import annotations

import math

import pytest

from bot.memory import decay
from bot.memory.recall import touches
from bot.memory.records import NewMemory
from bot.memory.scope import Viewer
from bot.memory.sql import store
from bot.memory.storage import storage_of

pytestmark = pytest.mark.usefixtures("backend")  # engine tests on SQLite and PostgreSQL

DAY = 86400.0
T0 = 1_700_000_000.0


def test_retention_follows_exp_minus_t_over_s():
    s0 = decay.initial_stability(0.0, 7.0)
    assert s0 == 7.0 and decay.initial_stability(1.0, 7.0) == 21.0
    assert decay.retention(T0 + 7 * DAY, T0, s0) == pytest.approx(math.exp(-1))
    assert decay.retention(T0 + 30 * DAY, T0, s0) == pytest.approx(0.0138, abs=1e-3)
    assert decay.retention(T0 - DAY, T0, s0) == 1.0  # a clock behind the memory never inflates it
    assert decay.retention(T0 + 7 * DAY, T0, 0.0) == 0.0  # a damaged row counts as faded, never raises


async def test_stability_grows_with_each_recall_and_is_capped(fts_engine):
    memory_id = await fts_engine.remember(NewMemory("the kettle is broken", "personal", owner_id=1, created_at=T0))
    start = (await fts_engine.get(memory_id)).stability
    def touch(conn, growth: float) -> None:  # what a recall does, through the backend under test
        touches.touch_and_load_all(conn, storage_of(conn), [([memory_id], [memory_id], T0)], growth)
    for _ in range(3):
        await fts_engine.write(touch, 1.5)
    assert (await fts_engine.get(memory_id)).stability == pytest.approx(start * 1.5 ** 3)
    for _ in range(40):
        await fts_engine.write(touch, 2.0)
    assert (await fts_engine.get(memory_id)).stability == decay.MAX_STABILITY_DAYS


async def test_recall_resets_the_clock_with_a_fixed_clock(fts_engine):
    memory_id = await fts_engine.remember(NewMemory("the kettle is broken", "personal", owner_id=1,
                                                    importance=0.0, created_at=T0))
    memory = await fts_engine.write(store.get, memory_id)
    assert memory.retention(T0 + 7 * DAY) == pytest.approx(math.exp(-1))
    await fts_engine.recall("kettle", Viewer(1, dm=True), as_of=T0 + 7 * DAY)
    recalled = await fts_engine.write(store.get, memory_id)
    assert recalled.retention(T0 + 7 * DAY) == 1.0
    assert recalled.stability == pytest.approx(7.0 * 1.5)
    assert recalled.retention(T0 + 7 * DAY + 10.5 * DAY) == pytest.approx(math.exp(-1))
