"""Once an engine's vector cache is warm, full GC collections no longer walk it (gc.freeze);
the last engine to close gives everything back to the collector (bot/memory/vectors/gc_pauses.py)."""
from __future__ import annotations

import gc

import numpy as np
import pytest

from bot.memory.engine import Engine
from bot.memory.scope import Viewer
from bot.memory.sqlite import db
from bot.memory.vectors import gc_pauses
from tests.memory.vectors.test_cache import KEYS, fill

pytestmark = pytest.mark.sqlite_only("the vector cache's start-up warm over a SQLite file")


@pytest.fixture
def settings(make_settings, monkeypatch):
    monkeypatch.delenv("MUNINN_GC_FREEZE", raising=False)
    settings = make_settings("", OLLAMA_EMBED_MODEL="m")
    conn = db.connect(settings.db_path)
    fill(conn, np.random.default_rng(5), 40)
    conn.close()
    return settings


def tracked(engine: Engine) -> bool:
    """Whether the collector still walks the engine's cached vectors (their holders)."""
    cached = {id(entry) for entry in engine.vector_cache._keys.values()}
    return any(id(obj) in cached for obj in gc.get_objects())


async def test_warm_engines_freeze_and_the_last_one_to_close_unfreezes(settings):
    before = gc_pauses.holders()
    first, second = Engine(settings), Engine(settings)
    await first.start()
    assert await first.warmed() == len(KEYS)
    assert gc_pauses.holders() == before + 1 and gc.get_freeze_count() > 0 and not tracked(first)
    await second.start()
    await second.warmed()
    assert gc_pauses.holders() == before + 2 and not tracked(second)
    await first.close()
    assert gc_pauses.holders() == before + 1 and gc.get_freeze_count() > 0  # the second is still warm
    await first.close()  # twice: counted once
    assert gc_pauses.holders() == before + 1
    await second.close()
    assert gc_pauses.holders() == before
    if before == 0:  # no other test's engine left open in this process
        assert gc.get_freeze_count() == 0


async def test_engines_that_do_not_warm_leave_the_collector_alone(settings, monkeypatch):
    before = gc_pauses.holders()
    async with Engine(settings, warm=False) as engine:  # a one-shot command
        await engine.recall("memory", Viewer(user_id=7, channel_id=1, guild_id=1), touch=False)
        assert gc_pauses.holders() == before
    monkeypatch.setenv("MUNINN_GC_FREEZE", "off")  # bench/tail.py's A/B switch
    async with Engine(settings) as engine:
        assert await engine.warmed() == len(KEYS)
        assert gc_pauses.holders() == before and tracked(engine)

