"""An edited message's old words go as a deleted message's do: the history keeps only the new
text, what was learned from the old text alone is taken back, and the next maintenance run
leaves the old words in none of the database's files (SQLite's file and WAL, FTS5 segments;
PostgreSQL's relation files, read back as tests/memory/postgres/test_scrub.py does)."""
from __future__ import annotations

import time

import pytest

from bot.conversation.pipeline import Pipeline
from bot.lifecycle.maintenance import run_maintenance
from bot.memory.engine import Engine
from bot.memory.records import NewMemory
from bot.memory.sql import history, store

pytestmark = pytest.mark.usefixtures("backend")

OWNER, CHANNEL = 41, 5
SECRET = "Zanzibarite xylophonequeen"


def _words_in_files(settings, backend: str) -> list[str]:
    """Where the old words can still be read: the files holding them."""
    if backend:
        from tests.memory.postgres.test_scrub import files_holding
        return [*files_holding(backend, "messages", "zanzibarit", "xylophonequeen"),
                *files_holding(backend, "memories", "zanzibarit", "xylophonequeen")]
    path = settings.db_path
    return [file.name for file in (path, path.with_name(path.name + "-wal"))
            if file.exists() and b"xylophonequeen" in file.read_bytes().lower()]


async def chatter_and_a_secret(engine: Engine) -> None:
    """30 ordinary messages of Oz's, then message 2000 with the secret."""
    for n in range(30):
        await engine.write(history.record, channel_id=CHANNEL, guild_id=None, author_id=OWNER, author_name="Oz",
                           role="user", content=f"chatter {n}", created_at=time.time(), message_id=1000 + n)
    await engine.write(history.record, channel_id=CHANNEL, guild_id=None, author_id=OWNER, author_name="Oz",
                       role="user", content=f"my password is {SECRET}", created_at=time.time(), message_id=2000)


async def test_an_edit_takes_the_old_words_out_of_the_history_the_facts_and_the_files(make_settings, backend):
    settings = make_settings("")
    async with Engine(settings) as engine:
        pipeline = Pipeline(engine)
        await chatter_and_a_secret(engine)
        learned = await engine.remember(NewMemory(f"Oz's password is {SECRET}", "personal", owner_id=OWNER,
                                                  source_message_ids=[2000]))
        also_said_elsewhere = await engine.remember(NewMemory("Oz lives in Bergen", "personal", owner_id=OWNER,
                                                              source_message_ids=[2000, 1001]))
        await engine.remember_many([NewMemory(f"filler fact {n} about boats", "personal", owner_id=OWNER)
                                    for n in range(30)])
        assert _words_in_files(settings, backend)

        assert await pipeline.edited(2000, "my password is none of your business", 3.0)

        assert (await engine.read(history.get, 2000)).content == "my password is none of your business"
        assert await engine.get_many([learned]) == {}  # learned from the old text alone: taken back
        assert (await engine.get(also_said_elsewhere)).source_message_ids == ["1001"]
        await run_maintenance(engine, use_llm=False)
        assert not await engine.finish_scrub()  # the run did it: nothing left for the next one
        assert _words_in_files(settings, backend) == []  # while the bot runs (closing SQLite checkpoints the WAL)


async def test_the_old_words_of_a_message_nothing_was_learned_from_leave_the_files_too(make_settings, backend):
    settings = make_settings("")
    async with Engine(settings) as engine:
        pipeline = Pipeline(engine)
        await chatter_and_a_secret(engine)
        assert _words_in_files(settings, backend)
        assert await pipeline.edited(2000, "my password is none of your business", 3.0)
        await run_maintenance(engine, use_llm=False)
        assert _words_in_files(settings, backend) == []


async def test_an_edit_of_a_message_the_history_no_longer_holds_takes_back_what_it_taught(make_settings, backend):
    async with Engine(make_settings("")) as engine:
        learned = await engine.remember(NewMemory(f"Oz's password is {SECRET}", "personal", owner_id=OWNER,
                                                  source_message_ids=[2000]))  # message 2000 was pruned since
        assert not await Pipeline(engine).edited(2000, "my password is none of your business", time.time() + 1)
        assert await engine.get_many([learned]) == {}
        assert await engine.finish_scrub()


async def test_an_edit_that_changes_nothing_leaves_no_work(make_settings, backend):
    async with Engine(make_settings("")) as engine:
        pipeline = Pipeline(engine)
        await engine.write(history.record, channel_id=CHANNEL, guild_id=None, author_id=OWNER, author_name="Oz",
                           role="user", content="same words", created_at=time.time(), message_id=2000)
        learned = await engine.remember(NewMemory("Oz says the same words", "personal", owner_id=OWNER,
                                                  source_message_ids=[2000]))
        assert await pipeline.edited(2000, "same words", 3.0)  # Discord sends edits of embeds, pins, ...
        assert (await engine.get(learned)).source_message_ids == ["2000"]
        assert not await engine.finish_scrub()
        assert (await engine.read(history.get, 2000)).edited_at == 3.0


async def test_old_words_still_waiting_for_extraction_are_never_extracted(engine, fake_ollama):
    from bot.lifecycle.extractor import Extractor
    from tests.conversation.test_pipeline import ALICE, RecordingOutlet, facts_reply, said
    fake_ollama.default_chat_reply = facts_reply(("called Ylva", "Alice's sister is called Ylva"))
    slow = Extractor(engine, batch_delay=5.0)
    pipeline = Pipeline(engine, slow)
    try:
        first = said("My sister is called Ylva")
        await pipeline.respond(first, RecordingOutlet([]))
        assert await pipeline.edited(first.message_id, "My sister is called something else", 3.0)
        await slow.drain()
        assert await engine.read(lambda conn: store.memories_of(conn, ALICE, ("personal",))) == []
    finally:
        await slow.close()
