"""bot/memory/sql/teachers.py: a room memory taught by several people survives one teacher's
forget-all (or deleted message), owned by the earliest remaining teacher; also after consolidation.
Real engine, fake Ollama, both backends."""
from __future__ import annotations

import json
import time

import pytest

from bot.lifecycle import maintenance
from bot.lifecycle.fact_store import store_facts
from bot.lifecycle.facts import Fact
from bot.memory.records import MemoryNotFound, NewMemory
from bot.memory.scope import Viewer
from tests.helpers import ALICE, BOB, CHANNEL, GUILD, axis, blend, exchange, one

pytestmark = pytest.mark.usefixtures("backend")

CAROL = 303
GAME = "Game night is every Friday at 8 pm"
DAY = 86400.0


def taught(text: str, teacher: int, message_id: int) -> Fact:
    """A room fact as extraction resolves it: the channel's, taught by `teacher` through one message."""
    return Fact(text, "room", "room", 0.6, teacher, CHANNEL, GUILD, (message_id,))


async def teach(engine, teacher: int, name: str, message_id: int, text: str = GAME, at: float | None = None) -> int:
    (memory_id,) = await store_facts(engine, [taught(text, teacher, message_id)],
                                     exchange(text, author=teacher, name=name, message_id=message_id,
                                              created_at=at))
    return memory_id


async def teachers_of(engine, memory_id: int) -> list[tuple[int, list[str]]]:
    rows = await engine.write(lambda conn: conn.execute(
        "SELECT user_id, source_message_ids FROM memory_teachers WHERE memory_id = ? "
        "ORDER BY first_taught_at, user_id", (memory_id,)).fetchall())
    return [(int(user), json.loads(sources)) for user, sources in rows]


async def recalled_by(engine, viewer: Viewer) -> list[int]:
    return (await engine.recall("when is game night", viewer, touch=False)).ids


async def test_the_second_teacher_of_a_fact_is_recorded_and_keeps_it_after_the_first_forgets(engine):
    now = time.time()
    first = await teach(engine, ALICE, "Alice", 11, at=now - 60)
    again = await teach(engine, BOB, "Bob", 22, at=now)
    assert again == first  # de-duplicated: one memory, reinforced
    assert await teachers_of(engine, first) == [(ALICE, ["11"]), (BOB, ["22"])]
    assert (await one(engine, first)).owner_id == ALICE
    assert [m.id for m in await engine.memories_of(BOB)] == [first]           # /memory export of Bob shows it
    assert (await engine.own_memory(BOB, first)).id == first                   # and /memory why

    forgotten = await engine.messages.forget_person(ALICE)

    assert (forgotten.personal, forgotten.taught, forgotten.shared) == (0, 0, 1)
    memory = await one(engine, first)
    assert (memory.text, memory.owner_id, memory.source_message_ids) == (GAME, BOB, ["22"])
    assert await teachers_of(engine, first) == [(BOB, ["22"])]
    for viewer in (Viewer(BOB, CHANNEL, GUILD), Viewer(CAROL, CHANNEL, GUILD)):  # Bob, and the channel
        assert first in await recalled_by(engine, viewer)
    assert await engine.memories_of(ALICE) == []
    with pytest.raises(MemoryNotFound):
        await engine.own_memory(ALICE, first)

    forgotten = await engine.messages.forget_person(BOB)  # the last teacher takes it with him
    assert (forgotten.taught, forgotten.shared) == (1, 0)
    with pytest.raises(MemoryNotFound):
        await one(engine, first)


async def test_the_same_teacher_again_adds_a_message_not_a_teacher(engine):
    first = await teach(engine, ALICE, "Alice", 11)
    assert await teach(engine, ALICE, "Alice", 12) == first
    assert await teachers_of(engine, first) == [(ALICE, ["11", "12"])]
    forgotten = await engine.messages.forget_person(ALICE)
    assert (forgotten.taught, forgotten.shared) == (1, 0)


async def test_the_earliest_remaining_teacher_owns_it(engine):
    now = time.time()
    memory_id = await teach(engine, ALICE, "Alice", 11, at=now - 120)
    await teach(engine, CAROL, "Carol", 33, at=now - 60)
    await teach(engine, BOB, "Bob", 22, at=now)
    await engine.messages.forget_person(ALICE)
    assert (await one(engine, memory_id)).owner_id == CAROL
    assert [user for user, _ in await teachers_of(engine, memory_id)] == [CAROL, BOB]


async def test_a_deleted_message_takes_back_its_teachers_part_only(engine):
    now = time.time()
    memory_id = await teach(engine, ALICE, "Alice", 11, at=now - 60)
    await teach(engine, BOB, "Bob", 22, at=now)
    await engine.messages.delete([11])  # Alice deletes her message: she no longer teaches it
    memory = await one(engine, memory_id)
    assert (memory.owner_id, memory.source_message_ids) == (BOB, ["22"])
    assert await teachers_of(engine, memory_id) == [(BOB, ["22"])]
    assert memory_id in await recalled_by(engine, Viewer(CAROL, CHANNEL, GUILD))
    await engine.messages.delete([22])  # Bob's too: nobody teaches it
    with pytest.raises(MemoryNotFound):
        await one(engine, memory_id)


async def test_a_teacher_by_command_stays_when_a_message_of_another_is_deleted(engine):
    remembered = await engine.remember(NewMemory(GAME, "room", ALICE, CHANNEL, GUILD))  # /memory remember: no message
    assert await teach(engine, BOB, "Bob", 22) == remembered
    await engine.messages.delete([22])
    memory = await one(engine, remembered)
    assert (memory.owner_id, memory.source_message_ids) == (ALICE, [])
    assert await teachers_of(engine, remembered) == [(ALICE, [])]


GAME_AGAIN = "Game night happens every Friday at 8 pm"


@pytest.mark.parametrize("use_llm", [True, False], ids=["merged by the llm", "clearest kept"])
async def test_consolidation_keeps_every_teacher_and_one_forget_all_leaves_it_to_the_other(
        engine, fake_ollama, script, use_llm):
    fake_ollama.vectors.update({GAME: axis(0), GAME_AGAIN: blend(0, 1, 0.95), "when is game night": axis(0)})
    now = time.time()
    alices = await engine.remember(NewMemory(GAME, "room", ALICE, CHANNEL, GUILD, created_at=now - 3 * DAY,
                                             source_message_ids=[11]))
    bobs = await engine.remember(NewMemory(GAME_AGAIN, "room", BOB, CHANNEL, GUILD, created_at=now - DAY,
                                           source_message_ids=[22]))
    script.add("merge", '{"text": "Game night: every Friday at 8 pm"}')
    (merge,) = (await maintenance.run_maintenance(engine, use_llm=use_llm)).consolidated
    survivor = merge.survivor
    assert (merge.merged_by == "llm") == use_llm
    assert await teachers_of(engine, survivor) == [(ALICE, ["11"]), (BOB, ["22"])]
    assert (await one(engine, survivor)).owner_id == ALICE  # the earliest teacher

    forgotten = await engine.messages.forget_person(ALICE)

    memory = await one(engine, survivor)
    assert memory.archived_at is None and (memory.owner_id, memory.source_message_ids) == (BOB, ["22"])
    assert await teachers_of(engine, survivor) == [(BOB, ["22"])]
    for viewer in (Viewer(BOB, CHANNEL, GUILD), Viewer(CAROL, CHANNEL, GUILD)):
        assert survivor in await recalled_by(engine, viewer)
    if survivor != alices:  # her archived original was hers alone: it went
        with pytest.raises(MemoryNotFound):
            await one(engine, alices)
    assert {m.id for m in await engine.memories_of(BOB)} == {survivor, bobs}  # his archived original stays his
    assert forgotten.shared == 1 and forgotten.taught == (0 if survivor == alices else 1)


async def test_one_teacher_forgetting_one_shared_memory_leaves_it_to_the_other(engine):
    now = time.time()
    memory_id = await teach(engine, ALICE, "Alice", 11, at=now - 60)
    assert await teach(engine, BOB, "Bob", 22, at=now) == memory_id
    assert await engine.forget_taught(ALICE, memory_id) is False     # /memory forget by its owner
    kept = await one(engine, memory_id)
    assert kept.owner_id == BOB and kept.archived_at is None and "11" not in [str(s) for s in kept.source_message_ids]
    assert await teachers_of(engine, memory_id) == [(BOB, ["22"])]
    assert memory_id in await recalled_by(engine, Viewer(user_id=CAROL, channel_id=CHANNEL, guild_id=GUILD))
    assert await engine.forget_taught(BOB, memory_id) is True        # the last teacher: it goes
    with pytest.raises(MemoryNotFound):
        await one(engine, memory_id)
