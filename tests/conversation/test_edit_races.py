"""Edits racing other work: a forget-all that lands while an edit is recorded keeps the edit's
new words from being learned, and old words whose extraction is already running are not
stored once the edit (or a delete) took them back. End to end: pipeline, extractor, fake
Ollama, real database."""
from __future__ import annotations

import asyncio
import time

import pytest

from bot.conversation.pipeline import Pipeline
from bot.lifecycle.extractor import Extractor
from bot.memory.sql import history
from tests.conversation import test_edit_extraction
from tests.conversation.test_edit_extraction import MOVES, alices_memories
from tests.conversation.test_pipeline import ALICE, RecordingOutlet, facts_reply, said
from tests.fakes.ollama import FakeOllama

pytestmark = pytest.mark.usefixtures("backend")
learning = test_edit_extraction.learning  # the same fixture: Alice moves, a pipeline and its extractor


async def test_a_forget_all_during_an_edit_keeps_its_new_words_from_being_learned(learning, engine):
    pipeline, extractor = learning
    moved = said("I moved to Oslo last month")
    await pipeline.respond(moved, RecordingOutlet([]))
    await extractor.drain()
    assert [m.text for m in await alices_memories(engine)] == ["Alice lives in Oslo"]

    editing = asyncio.create_task(pipeline.edited(moved.message_id, "I moved to Bergen last month", time.time()))
    await asyncio.sleep(0)  # the edit now waits for its writer job
    await pipeline.forget_person(ALICE)
    await editing
    await extractor.drain()
    assert await alices_memories(engine) == []


async def extracting(fake_ollama: FakeOllama, count: int) -> None:
    """Wait until the fake Ollama has received `count` extraction requests."""
    for _ in range(500):
        if sum(1 for r in fake_ollama.chat_requests() if r.get("format")) >= count:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the extraction never started")


async def answered_and_being_extracted(pipeline, fake_ollama):
    """Alice's "I moved to Oslo" answered, its extraction running (the fake Ollama takes 1 s)."""
    fake_ollama.delay = 1.0
    fake_ollama.chat_replies = [MOVES, FakeOllama.TIMEOUT]  # the answer, then a slow extraction of Oslo
    moved = said("I moved to Oslo last month")
    await pipeline.respond(moved, RecordingOutlet([]))
    await extracting(fake_ollama, 1)
    return moved


async def test_old_words_being_extracted_when_the_edit_lands_are_not_stored(learning, engine, fake_ollama):
    pipeline, extractor = learning
    moved = await answered_and_being_extracted(pipeline, fake_ollama)
    assert await pipeline.edited(moved.message_id, "I moved to Bergen last month", time.time())
    await extractor.drain()
    assert [m.text for m in await alices_memories(engine)] == ["Alice lives in Bergen"]


async def test_a_delete_during_its_extraction_stores_nothing(learning, engine, fake_ollama):
    pipeline, extractor = learning
    moved = await answered_and_being_extracted(pipeline, fake_ollama)
    await pipeline.deleted([moved.message_id])
    await extractor.drain()
    assert await alices_memories(engine) == []


async def test_a_same_words_update_during_the_extraction_keeps_it(learning, engine, fake_ollama):
    pipeline, extractor = learning
    moved = await answered_and_being_extracted(pipeline, fake_ollama)
    assert await pipeline.edited(moved.message_id, moved.content, time.time())  # a link preview arrived
    await extractor.drain()
    assert [m.text for m in await alices_memories(engine)] == ["Alice lives in Oslo"]


async def test_the_authors_other_messages_in_that_batch_are_extracted_again(engine, fake_ollama):
    fake_ollama.default_chat_reply = facts_reply(("Oslo", "Alice lives in Oslo"), ("cat", "Alice has a cat"))
    fake_ollama.delay = 1.0
    extractor = Extractor(engine, batch_delay=0.3)  # both messages in one batch
    pipeline = Pipeline(engine, extractor)
    try:
        moved, cat = said("I moved to Oslo last month"), said("I have a cat called Mons")
        fake_ollama.chat_replies = [fake_ollama.default_chat_reply] * 2 + [FakeOllama.TIMEOUT]
        await pipeline.respond(moved, RecordingOutlet([]))
        await pipeline.respond(cat, RecordingOutlet([]))
        await extracting(fake_ollama, 1)
        await pipeline.deleted([moved.message_id])
        await extractor.drain()
        assert [m.text for m in await alices_memories(engine)] == ["Alice has a cat"]
        assert sum(1 for r in fake_ollama.chat_requests() if r.get("format")) == 2  # the cat, extracted again
    finally:
        await extractor.close()


async def test_old_words_extracted_while_the_edit_is_being_written_are_not_stored(learning, engine, fake_ollama,
                                                                                 monkeypatch):
    """The extraction ends while the edit's writer job runs: its fact write, queued behind that
    job, must already see the message as gone (marked inside the job, not after it returns)."""
    pipeline, extractor = learning
    real = history.edit_and_take_back

    def slow(conn, *args, **kwargs):
        time.sleep(0.8)  # the extraction (1 s in the fake Ollama) ends and queues its write meanwhile
        return real(conn, *args, **kwargs)
    monkeypatch.setattr(history, "edit_and_take_back", slow)
    moved = await answered_and_being_extracted(pipeline, fake_ollama)
    await asyncio.sleep(0.5)
    assert await pipeline.edited(moved.message_id, "I moved to Bergen last month", time.time())
    await extractor.drain()
    assert [m.text for m in await alices_memories(engine)] == ["Alice lives in Bergen"]
