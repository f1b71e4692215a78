"""bench/choices.py on a tiny world: every case is timed, and the heavy user's suggestions are theirs."""
from __future__ import annotations

import argparse

import pytest

from bench import choices
from bot.memory.engine import Engine
from bot.memory.scope import Viewer

pytestmark = pytest.mark.sqlite_only("a tiny run of the benchmark harness")


async def test_choices_benchmark_times_every_case(tmp_path):
    args = argparse.Namespace(backend="sqlite", size=2100, own=1100, rounds=3, seed=2)
    result = await choices.run(args, "", tmp_path)
    assert set(result["ms"]) == {"nothing typed", "common word", "rare word", "no match", "a number", "no memories"}
    assert all(0 < row["p50"] <= row["max"] for row in result["ms"].values())
    async with Engine(choices.settings_for(tmp_path / "choices.db", "")) as engine:
        heavy = Viewer(user_id=choices.HEAVY, channel_id=choices.CHANNEL, guild_id=choices.GUILD)
        found = await engine.own_choices(heavy, "zeppelin")
        assert len(found) == 2 and all(m.owner_id == choices.HEAVY and "zeppelin" in m.text for m in found)
        assert await engine.own_choices(heavy, "xylophone") == []
