"""A memory whose scope (its visibility key) changes takes its vector along, in the same
transaction: the vector path never shows it to the old key's viewers (on PostgreSQL the vector
moves; on SQLite, where vec0 cannot move a partition key, it is dropped and embedded again)."""
from __future__ import annotations

import pytest

from bot.memory.records import NewMemory
from bot.memory.scope import Viewer, memory_key
from bot.memory.sql import store

pytestmark = pytest.mark.usefixtures("backend")

OWNER, OTHER = 5, 6
QUESTION = "what opens the safe?"  # no word in common with the memory: only the vector path finds it


def make_personal(conn, memory_id: int) -> None:
    """What an operator (or a later feature) does: the memory becomes OWNER's personal one."""
    conn.execute("UPDATE memories SET scope = 'personal', owner_id = ?, vis_key = ? WHERE id = ?",
                 (OWNER, memory_key("personal", OWNER, None, None), memory_id))


async def test_a_memory_made_personal_leaves_everyone_elses_vector_search(engine):
    memory_id = await engine.remember(NewMemory("the vault code is 4711", "global"))
    other, owner = Viewer(user_id=OTHER, dm=True), Viewer(user_id=OWNER, dm=True)
    found = await engine.recall(QUESTION, other, touch=False)
    assert memory_id in found.ids and found.memories[0].candidate.vector_rank  # by its vector

    await engine.write(make_personal, memory_id)
    assert memory_id not in (await engine.recall(QUESTION, other, touch=False)).ids
    assert memory_id not in (await engine.recall("vault code", other, touch=False)).ids
    assert (await engine.recall("vault code", owner, touch=False)).ids == [memory_id]

    await engine.backfill()  # SQLite embeds it again under its new key; PostgreSQL moved it already
    assert (await engine.write(store.get, memory_id)).embedded
    mine = await engine.recall(QUESTION, owner, touch=False)
    assert mine.ids == [memory_id] and mine.memories[0].candidate.vector_rank
    assert memory_id not in (await engine.recall(QUESTION, other, touch=False)).ids
