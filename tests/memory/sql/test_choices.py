"""The autocomplete of memory ids and the memories a message taught (sql/choices.py), on both
backends: a person is offered their own memories that the scope rule lets them see where they ask,
never another person's, matched by words or number, bounded."""
from __future__ import annotations

import pytest

from bot.memory.records import NewMemory
from bot.memory.scope import Viewer
from bot.memory.sql import choices
from tests.helpers import ALICE, BOB, CHANNEL, GUILD

pytestmark = pytest.mark.usefixtures("backend")

OTHER_GUILD, OTHER_CHANNEL, PRIVATE_CHANNEL = 8, 80, 72
HERE = Viewer(user_id=ALICE, channel_id=CHANNEL, guild_id=GUILD)


async def texts(engine, viewer: Viewer, typed: str, limit: int = 25) -> list[str]:
    return [m.text for m in await engine.own_choices(viewer, typed, limit=limit)]


async def test_only_the_callers_own_memories_that_they_may_see_here(fts_engine):
    engine = fts_engine
    await engine.remember_many([
        NewMemory("Alice plays the cello", "personal", ALICE, CHANNEL, GUILD),
        NewMemory("Alice's cello teacher is strict", "personal", ALICE, OTHER_CHANNEL, OTHER_GUILD),
        NewMemory("Alice tunes her cello in the practice room", "personal", ALICE, PRIVATE_CHANNEL, GUILD,
                  private=True),
        NewMemory("Alice bought a cello in a DM", "personal", ALICE, 71, None),
        NewMemory("Bob plays the cello too", "personal", BOB, CHANNEL, GUILD),
        NewMemory("cello practice is on Mondays", "room", ALICE, CHANNEL, GUILD),
        NewMemory("cello lessons cost 20 euros", "room", BOB, CHANNEL, GUILD),
        NewMemory("the cello is a string instrument", "global", None),
    ])
    assert await texts(engine, HERE, "cello") == ["cello practice is on Mondays", "Alice plays the cello"]
    assert await texts(engine, Viewer(user_id=BOB, channel_id=CHANNEL, guild_id=GUILD), "cello") == [
        "cello lessons cost 20 euros", "Bob plays the cello too"]
    # In a DM a person sees their personal memories from everywhere, and still nobody else's.
    assert sorted(await texts(engine, Viewer(user_id=ALICE, channel_id=71, dm=True), "CELLO")) == [
        "Alice bought a cello in a DM", "Alice plays the cello", "Alice tunes her cello in the practice room",
        "Alice's cello teacher is strict"]


async def test_matched_by_words_case_aside_or_by_number_and_bounded(fts_engine):
    engine = fts_engine
    ids = await engine.remember_many([NewMemory(f"fact {n} about 100%_sure things", "personal", ALICE, CHANNEL, GUILD)
                                      for n in range(40)] + [NewMemory("Alice likes Jazz", "personal", ALICE,
                                                                       CHANNEL, GUILD)])
    assert await texts(engine, HERE, "  JAZZ ") == ["Alice likes Jazz"]
    assert await texts(engine, HERE, "100%_") == [f"fact {n} about 100%_sure things" for n in range(39, 14, -1)]
    assert await texts(engine, HERE, "1%") == []          # % and _ are what was typed, not wildcards
    assert await texts(engine, HERE, "a_o") == []
    assert len(await texts(engine, HERE, "")) == 25        # nothing typed: the newest
    assert len(await texts(engine, HERE, "", limit=5)) == 5
    found = await engine.own_choices(HERE, str(ids[7]))
    assert ids[7] in [m.id for m in found] and all(str(m.id).startswith(str(ids[7])) or str(ids[7]) in m.text
                                                     for m in found)


async def test_an_archived_memory_is_not_offered(fts_engine):
    engine = fts_engine
    gone, = await engine.remember_many([NewMemory("Alice once lived in Bergen", "personal", ALICE, CHANNEL, GUILD)])
    await engine.archive(gone, "decayed")
    assert await texts(engine, HERE, "Bergen") == []


async def test_the_memories_a_message_taught_whoever_s(fts_engine):
    engine = fts_engine
    ids = await engine.remember_many([
        NewMemory("Alice plays the cello", "personal", ALICE, CHANNEL, GUILD, source_message_ids=[5001]),
        NewMemory("cello practice is on Mondays", "room", ALICE, CHANNEL, GUILD, source_message_ids=[5001, 5002]),
        NewMemory("Bob plays the cello too", "personal", BOB, CHANNEL, GUILD, source_message_ids=[5002]),
    ])
    assert [m.id for m in await engine.from_message(5001)] == ids[:2]
    assert [m.id for m in await engine.from_message(5002)] == ids[1:]
    assert await engine.from_message(5003) == []


def test_a_typed_pattern_matches_only_itself():
    assert choices.like_pattern("50%_a\\b") == "%50\\%\\_a\\\\b%"


async def test_words_are_looked_for_among_the_newest_memories_only(fts_engine, monkeypatch):
    monkeypatch.setattr(choices, "SEARCHED", 5)
    ids = await fts_engine.remember_many([NewMemory(f"Alice note {n}" + (" zeppelin" if n in (0, 7) else ""),
                                                    "personal", ALICE, CHANNEL, GUILD) for n in range(10)])
    found = await fts_engine.own_choices(HERE, "zeppelin")
    assert [m.id for m in found] == [ids[7]]  # the oldest one is past the newest five
