"""The keyword path's common-word window, on both backends: a query of only common words
looks at the COMMON_WINDOW memories up to the viewer's own newest, not the database's; a
recall as of a moment has no window. (The one home of these behaviours' tests.)"""
from __future__ import annotations

import time

import pytest

from bot.memory.recall import keywords
from bot.memory.records import NewMemory
from bot.memory.scope import Viewer

pytestmark = pytest.mark.usefixtures("backend")  # engine tests on SQLite and PostgreSQL

ALICE = 1


async def _old_lamps_then_a_busy_channel(engine) -> int:
    old = await engine.remember(NewMemory("Alice bought lamps long ago", "personal", owner_id=ALICE))
    await engine.remember_many([NewMemory(f"the channel talked about lamps number {i}", "room", channel_id=5,
                                          guild_id=9) for i in range(600)])  # "lamps": a common word now
    return old


async def test_the_common_word_window_ends_at_the_viewers_newest_memory(fts_engine, monkeypatch):
    """A quiet DM in a busy bot: everything the viewer has is older than the last COMMON_WINDOW
    memories stored (other people's); a common word still finds it."""
    old = await _old_lamps_then_a_busy_channel(fts_engine)
    monkeypatch.setattr(keywords, "COMMON_WINDOW", 300)
    assert (await fts_engine.recall("lamps", Viewer(ALICE, dm=True), touch=False)).ids == [old]
    newer = await fts_engine.remember(NewMemory("Alice bought lamps again", "personal", owner_id=ALICE))
    # now the window ends at her new memory and holds the channel's talk before it, not the old one
    assert (await fts_engine.recall("lamps", Viewer(ALICE, dm=True), touch=False)).ids == [newer]


async def test_as_of_a_moment_or_through_a_window_that_reaches_back_the_older_memory_counts(fts_engine, monkeypatch):
    old = await _old_lamps_then_a_busy_channel(fts_engine)
    newer = await fts_engine.remember(NewMemory("Alice bought lamps again", "personal", owner_id=ALICE))
    monkeypatch.setattr(keywords, "COMMON_WINDOW", 300)
    assert (await fts_engine.recall("lamps", Viewer(ALICE, dm=True), touch=False)).ids == [newer]
    past = await fts_engine.recall("lamps", Viewer(ALICE, dm=True), touch=False, as_of=time.time() + 60)
    assert set(past.ids) == {old, newer}  # as of a moment: no window
    monkeypatch.setattr(keywords, "COMMON_WINDOW", 10_000)
    assert set((await fts_engine.recall("lamps", Viewer(ALICE, dm=True), touch=False)).ids) == {old, newer}
