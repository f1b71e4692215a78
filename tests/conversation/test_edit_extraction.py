"""An edited message teaches its new words: "I moved to Oslo" corrected to "I moved to Bergen"
takes Oslo back and learns Bergen, end to end (pipeline, extractor, fake Ollama, real database),
as a new message would be learned from: only a message Muninn answered, never a paused
person's, private where the channel is. Recording the edit, the take-back and reading what
the extraction needs are one writer job and one transaction; an edit or a delete of a message
Muninn never stored takes no write lock at all."""
from __future__ import annotations

import asyncio
import time

import pytest

from bot.conversation.pipeline import Pipeline
from bot.lifecycle.extractor import Extractor
from bot.memory import records
from bot.memory.engine import Engine
from bot.memory.scope import Viewer
from bot.memory.sql import history, store
from tests.conversation.test_pipeline import ALICE, GENERAL, GUILD, RecordingOutlet, facts_reply, said

pytestmark = pytest.mark.usefixtures("backend")

MOVES = facts_reply(("Oslo", "Alice lives in Oslo"), ("Bergen", "Alice lives in Bergen"))


async def alices_memories(engine: Engine) -> list[records.Memory]:
    return await engine.read(lambda conn: store.memories_of(conn, ALICE, ("personal",)))


@pytest.fixture
async def learning(engine, fake_ollama):
    fake_ollama.default_chat_reply = MOVES
    extractor = Extractor(engine, batch_delay=0.01)
    try:
        yield Pipeline(engine, extractor), extractor
    finally:
        await extractor.close()


async def test_a_corrected_message_teaches_the_correction(learning, engine):
    pipeline, extractor = learning
    moved = said("I moved to Oslo last month")
    await pipeline.respond(moved, RecordingOutlet([]))
    await extractor.drain()
    [oslo] = await alices_memories(engine)
    assert oslo.text == "Alice lives in Oslo" and oslo.source_message_ids == [str(moved.message_id)]

    assert await pipeline.edited(moved.message_id, "I moved to Bergen last month", time.time())
    await extractor.drain()
    [bergen] = await alices_memories(engine)
    assert bergen.text == "Alice lives in Bergen" and bergen.source_message_ids == [str(moved.message_id)]
    found = await engine.recall("where does Alice live", Viewer(user_id=ALICE, channel_id=GENERAL, guild_id=GUILD))
    assert [m.memory.text for m in found.memories] == ["Alice lives in Bergen"]


async def test_a_correction_in_a_private_channel_stays_private(learning, engine):
    pipeline, extractor = learning
    moved = said("I moved to Oslo last month")
    await pipeline.respond(moved, RecordingOutlet([]))
    await extractor.drain()
    assert await pipeline.edited(moved.message_id, "I moved to Bergen last month", time.time(), private=True)
    await extractor.drain()
    [bergen] = await alices_memories(engine)
    assert bergen.text == "Alice lives in Bergen" and bergen.private
    elsewhere = Viewer(user_id=ALICE, channel_id=GENERAL + 1, guild_id=GUILD)
    assert (await engine.recall("where does Alice live", elsewhere)).memories == []


async def test_an_edit_is_learned_from_only_where_a_new_message_would_be(learning, engine, fake_ollama):
    pipeline, extractor = learning
    heard = said("I moved to Oslo last month")           # recorded, not answered: never extracted
    await pipeline.record(heard)
    assert await pipeline.edited(heard.message_id, "I moved to Bergen last month", time.time())
    paused = said("I moved to Oslo last month")          # answered, then Alice paused her memory
    await pipeline.respond(paused, RecordingOutlet([]))
    await extractor.drain()
    [oslo] = await alices_memories(engine)
    assert await pipeline.pause(ALICE)
    assert await pipeline.edited(paused.message_id, "I moved to Bergen last month", time.time())
    await extractor.drain()
    assert await alices_memories(engine) == []           # Oslo taken back, Bergen not learned while paused
    extractions = [r["messages"][-1]["content"] for r in fake_ollama.chat_requests() if r.get("format")]
    assert oslo.text == "Alice lives in Oslo" and not any("Bergen" in said_text for said_text in extractions)
    kept = await engine.read(history.get, paused.message_id)   # nor kept in the history: the message goes
    assert kept is not None and kept.content == ""
    assert paused.message_id not in [m.id for m in await engine.read(history.recent, GENERAL, 10)]


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)  # apsw's commit hook counts the transactions
async def test_an_edit_and_its_take_back_are_one_transaction(engine):
    pipeline = Pipeline(engine)
    await engine.write(history.record, channel_id=GENERAL, guild_id=GUILD, author_id=ALICE, author_name="Alice",
                       role="user", content="I moved to Oslo", created_at=time.time(), message_id=2000)
    learned = await engine.remember(records.NewMemory("Alice lives in Oslo", "personal", owner_id=ALICE,
                                                    source_message_ids=[2000]))
    commits: list[int] = []
    await engine.write(lambda conn: conn.set_commit_hook(lambda: commits.append(1) or False))
    assert await pipeline.edited(2000, "I moved to Bergen", 3.0)
    await engine.write(lambda conn: conn.set_commit_hook(None))
    assert commits == [1] and await engine.get_many([learned]) == {}
    assert (await engine.read(history.get, 2000)).content == "I moved to Bergen"


@pytest.mark.sqlite_only("holds SQLite's write lock from a second connection")
async def test_an_edit_or_delete_of_a_message_never_stored_takes_no_write_lock(engine):
    import apsw
    pipeline = Pipeline(engine)
    other = apsw.Connection(str(engine.settings.db_path))
    other.execute("BEGIN IMMEDIATE")  # an import holds the write lock for a long while
    try:
        started = time.monotonic()
        assert not await asyncio.wait_for(pipeline.edited(4242, "edited before Muninn joined", 3.0), 3)
        assert await asyncio.wait_for(pipeline.deleted([4242, 4243]), 3) == 0
        assert time.monotonic() - started < 1.0  # no lock wait (busy timeout 5 s)
    finally:
        other.execute("ROLLBACK")
        other.close()
