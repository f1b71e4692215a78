"""The keyword path's common-word window, on both backends: a query of only common words
looks at the COMMON_WINDOW memories up to the viewer's own newest, not the database's."""
from __future__ import annotations

import pytest

from bot.memory import fts
from bot.memory.scope import Viewer
from bot.memory.store import NewMemory

pytestmark = pytest.mark.usefixtures("backend")  # engine tests on SQLite and PostgreSQL

ALICE = 1


async def test_the_common_word_window_ends_at_the_viewers_newest_memory(fts_engine, monkeypatch):
    """A quiet DM in a busy bot: everything the viewer has is older than the last COMMON_WINDOW
    memories stored (other people's); a common word still finds it."""
    old = await fts_engine.remember(NewMemory("Alice bought lamps long ago", "personal", owner_id=ALICE))
    await fts_engine.remember_many([NewMemory(f"the channel talked about lamps number {i}", "room", channel_id=5,
                                              guild_id=9) for i in range(600)])  # "lamps": a common word now
    monkeypatch.setattr(fts, "COMMON_WINDOW", 300)
    assert (await fts_engine.recall("lamps", Viewer(ALICE, dm=True), touch=False)).ids == [old]
    newer = await fts_engine.remember(NewMemory("Alice bought lamps again", "personal", owner_id=ALICE))
    # now the window ends at her new memory and holds the channel's talk before it, not the old one
    assert (await fts_engine.recall("lamps", Viewer(ALICE, dm=True), touch=False)).ids == [newer]
