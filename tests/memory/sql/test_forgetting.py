"""bot/memory/sql/forgetting.py: forget-all finds Muninn's replies to others that may repeat the
person's words (their conversation, recorded with each reply; a distinctive run or a rare word of
theirs anywhere) and empties them; the migration fills what older databases lack. Both backends."""
from __future__ import annotations

import time

import pytest

from bot.memory.engine import Engine
from bot.memory.records import NewMemory
from bot.memory.sql import history
from tests.helpers import rewind_schema

pytestmark = pytest.mark.usefixtures("backend")

ALICE, BOB, CAROL, MUNINN = 7, 8, 9, 1
GUILD, GENERAL, RANDOM = 900, 50, 51
_ids = iter(range(10**17, 10**18))


async def said(engine: Engine, who: int, text: str, *, channel: int = GENERAL, at: float,
               answering: int | None = None, heard: tuple[int, ...] = ()) -> int:
    """One history row: a person's message, or (`answering` someone) Muninn's reply to them."""
    row = dict(channel_id=channel, guild_id=GUILD, author_id=who, author_name=str(who), content=text,
               created_at=at, message_id=next(_ids), role="user" if answering is None else "assistant")
    if answering is not None:
        row.update(reply_to_author=answering, context_authors=heard)
    return await engine.write(lambda conn: history.record(conn, **row))


async def contents(engine: Engine) -> dict[int, str]:
    rows = await engine.write(lambda conn: conn.execute("SELECT id, content FROM messages").fetchall())
    return {int(message_id): str(content) for message_id, content in rows}


async def test_replies_that_heard_her_or_repeat_her_words_are_emptied_and_the_rest_kept(engine):
    now = time.time()
    hers = await said(engine, ALICE, "My neighbour Snarvelton plays the tuba every night", at=now)
    to_her = await said(engine, MUNINN, "Sounds loud!", answering=ALICE, heard=(ALICE,), at=now + 1)
    heard = await said(engine, MUNINN, "Hi Bob.", answering=BOB, heard=(ALICE, BOB), at=now + 2)
    bobs = await said(engine, BOB, "Every night? Tuba plays me", channel=RANDOM, at=now + 3)  # her words, his order
    rare = await said(engine, MUNINN, "Snarvelton? No idea.", channel=RANDOM, answering=CAROL, heard=(CAROL,),
                      at=now + 4)
    run = await said(engine, MUNINN, "Someone plays the tuba every night, they say.", channel=RANDOM,
                     answering=CAROL, heard=(CAROL, BOB), at=now + 5)  # her words in her order: a run
    common = await said(engine, MUNINN, "The tuba is a brass instrument.", channel=RANDOM, answering=BOB,
                        heard=(BOB,), at=now + 6)  # "tuba": Bob wrote it too, so it is not hers alone

    forgotten = await engine.messages.forget_person(ALICE)

    assert (forgotten.messages, forgotten.replies) == (2, 3)
    left = await contents(engine)
    assert hers not in left and to_her not in left               # hers, and the reply to her: deleted
    assert left[heard] == left[rare] == left[run] == ""           # emptied, as deleted messages are
    assert left[bobs] == "Every night? Tuba plays me" and left[common] == "The tuba is a brass instrument."
    assert [m.content for m in await engine.messages.recent(RANDOM, 10)] == [
        "Every night? Tuba plays me", "The tuba is a brass instrument."]  # no prompt shows what was emptied
    assert await engine.messages.is_own(heard)                    # still Muninn's: a reply to it is to Muninn
    assert await engine.write(lambda conn: conn.execute(
        "SELECT count(*) FROM reply_context WHERE author_id = ?", (ALICE,)).fetchall()[0][0]) == 0


async def test_the_words_of_a_memory_that_goes_count_as_hers(engine):
    now = time.time()
    await engine.remember(NewMemory("Alice's locker code is 83914", "personal", owner_id=ALICE, guild_id=GUILD,
                                    channel_id=GENERAL))  # her message is long gone from the history
    echo = await said(engine, MUNINN, "The code 83914 opens a locker.", channel=RANDOM, answering=BOB,
                      heard=(BOB,), at=now)
    assert (await engine.messages.forget_person(ALICE)).replies == 1
    assert (await contents(engine))[echo] == ""


async def test_the_migration_fills_teachers_and_each_replys_conversation_from_what_is_stored(
        make_settings, fake_ollama, backend):
    settings = make_settings(fake_ollama.url)
    async with Engine(settings) as engine:
        room = await engine.remember(NewMemory("Game night is on Fridays", "room", owner_id=ALICE, guild_id=GUILD,
                                               channel_id=GENERAL, source_message_ids=[5]))
        await engine.remember(NewMemory("Alice likes tea", "personal", owner_id=ALICE, guild_id=GUILD))
        now = time.time()
        await said(engine, ALICE, "hi", at=now)
        await said(engine, BOB, "hello", at=now + 1)
        reply = await said(engine, MUNINN, "Hello both!", answering=CAROL, at=now + 2)
        alone = await said(engine, MUNINN, "Quiet here.", channel=RANDOM, answering=CAROL, at=now + 3)

        # As a database made before the migration: without its tables.
        def before(conn):
            conn.execute("DROP TABLE memory_teachers")
            conn.execute("DROP TABLE reply_context")
            rewind_schema(conn, backend, "memory_teachers")
        await engine.write(before)

    async with Engine(settings) as engine:
        teachers = await engine.write(lambda conn: conn.execute(
            "SELECT memory_id, user_id, source_message_ids FROM memory_teachers").fetchall())
        assert [tuple(row) for row in teachers] == [(room, ALICE, '["5"]')]
        heard = await engine.write(lambda conn: conn.execute(
            "SELECT reply_id, author_id FROM reply_context ORDER BY reply_id, author_id").fetchall())
        assert [tuple(row) for row in heard] == [(reply, ALICE), (reply, BOB), (reply, CAROL), (alone, CAROL)]


async def test_a_reply_pruned_from_the_history_takes_its_conversation_with_it(engine):
    now = time.time()
    await said(engine, ALICE, "hi", at=now)
    reply = await said(engine, MUNINN, "Hello!", answering=ALICE, heard=(ALICE, BOB), at=now + 1)
    await said(engine, BOB, "later", at=now + 2)
    assert await engine.write(history.prune, GENERAL, 1) == 2

    def heard(conn):
        return conn.execute("SELECT count(*) FROM reply_context WHERE reply_id = ?", (reply,)).fetchall()[0][0]
    assert await engine.write(heard) == 0
