"""memory_mentions: the people a memory names besides its owner find it in their data (export,
/memory why, forget-all) and never in recall; the rows go with their memory. Both backends."""
from __future__ import annotations

import time

import pytest

from bot.memory.records import MemoryNotFound, NewMemory
from bot.memory.scope import Viewer
from bot.memory.sql import store
from tests.helpers import ALICE, BOB, CHANNEL, GUILD

pytestmark = pytest.mark.usefixtures("backend")

DAVE, ERIN = 404, 505


def bobs(text: str, *mentioned: int, source: int = 1) -> NewMemory:
    return NewMemory(text, "personal", BOB, CHANNEL, GUILD, 0.6, source_message_ids=[source], mentions=mentioned)


async def write_facts(engine, *memories: NewMemory) -> list[int]:
    """The fact write (engine.facts.write), without vectors or update decisions."""
    outcome = await engine.facts.write(None, list(memories), None, [None] * len(memories), settings=engine.settings,
                                       now=time.time(), searched=[], searched_mark=None)
    return outcome.ids


async def mention_rows(engine) -> list[tuple[int, int]]:
    def read(conn):
        return sorted((int(m), int(u)) for m, u in conn.execute("SELECT memory_id, user_id FROM memory_mentions"))
    return await engine.write(read)


async def test_a_fact_write_records_whom_it_names_and_a_repetition_adds_to_them(engine):
    (lent,) = await write_facts(engine, bobs("Bob lent Dave 50 euros.", DAVE))
    (again,) = await write_facts(engine, bobs("Bob lent Dave 50 euros.", DAVE, ERIN, source=2))
    assert again == lent and await mention_rows(engine) == [(lent, DAVE), (lent, ERIN)]
    assert await engine.mentioned(lent) == {DAVE, ERIN}

    # Dave's data holds it (export, why, forget-all), his recall never shows it
    assert [m.id for m in await engine.memories_of(DAVE)] == [lent]
    assert (await engine.own_memory(DAVE, lent)).owner_id == BOB
    with pytest.raises(MemoryNotFound):
        await engine.own_memory(ALICE, lent)
    seen = await engine.recall("Bob lent Dave euros", Viewer(DAVE, channel_id=CHANNEL, guild_id=GUILD), touch=False)
    assert lent not in seen.ids
    assert lent in (await engine.recall("Bob lent Dave euros", Viewer(BOB, channel_id=CHANNEL, guild_id=GUILD),
                                        touch=False)).ids


async def test_forget_all_of_the_person_named_deletes_it_and_only_it(engine):
    lent, cats = await write_facts(engine, bobs("Bob lent Dave 50 euros.", DAVE), bobs("Bob has two cats.", source=2))
    forgotten = await engine.messages.forget_person(DAVE)
    assert (forgotten.personal, forgotten.taught, forgotten.mentioning) == (0, 0, 1)
    assert set(await engine.get_many([lent, cats])) == {cats}
    assert await mention_rows(engine) == []


async def test_the_rows_go_with_their_memory_and_a_merge_keeps_whom_the_originals_named(engine):
    gone = await engine.remember(NewMemory("Bob owes Erin a beer", "personal", owner_id=BOB, mentions=[ERIN],
                                           source_message_ids=[77]))
    await engine.messages.delete([77])  # its only message: the memory is taken back
    assert await mention_rows(engine) == []
    assert gone not in await engine.get_many([gone])

    a = await engine.remember(NewMemory("Bob lent Dave 50 euros", "personal", owner_id=BOB, guild_id=GUILD,
                                        channel_id=CHANNEL, mentions=[DAVE]))
    b = await engine.remember(NewMemory("Bob lent Dave fifty euros", "personal", owner_id=BOB, guild_id=GUILD,
                                        channel_id=CHANNEL, mentions=[DAVE, ERIN]))
    merged = await engine.upkeep.consolidate([a, b], "Bob lent Dave 50 euros last week", None,
                                             model=engine.settings.embed_model, base_stability_days=1.0,
                                             now=time.time())
    assert merged is not None and merged.survivor not in (a, b)
    assert await engine.mentioned(merged.survivor) == {DAVE, ERIN}
    assert {m.id for m in await engine.memories_of(ERIN)} == {b, merged.survivor}  # archived ones too


async def test_memories_of_keeps_to_the_scopes_asked(engine):
    lent = await engine.remember(NewMemory("Bob lent Dave 50 euros", "personal", owner_id=BOB, mentions=[DAVE]))
    assert await engine.write(store.memories_of, DAVE, ("room",)) == []
    assert [m.id for m in await engine.write(store.memories_of, DAVE, ("personal",))] == [lent]
