"""A personal forget on a big PostgreSQL database leaves the table's rewrite to maintenance
(bot/memory/postgres/scrub.py: VACUUM FULL memories took 3.3-3.7 s at 100k memories, an
exclusive lock that every recall waits behind)."""
from __future__ import annotations

import time

import pytest

from bot.conversation.pipeline import Pipeline
from bot.lifecycle.maintenance import run_maintenance
from bot.memory.engine import Engine
from bot.memory.postgres import scrub
from bot.memory.records import NewMemory
from bot.memory.scope import Viewer
from bot.memory.sql import history, marks
from tests.memory.postgres.test_scrub import OWNER, SECRET, files_holding

pytestmark = pytest.mark.parametrize("backend", ["postgresql"], indirect=True)


async def test_a_big_memories_table_is_rewritten_by_the_next_maintenance(fake_ollama, make_settings, backend,
                                                                          monkeypatch):
    monkeypatch.setattr(scrub, "REWRITE_AT_ONCE_BYTES", 0)  # every table counts as big
    async with Engine(make_settings(fake_ollama.url)) as engine:
        await engine.remember_many([NewMemory(f"ordinary note {n} about the weather", "personal", owner_id=OWNER)
                                    for n in range(20)])
        secret = await engine.remember(NewMemory(f"{SECRET} is my password", "personal", owner_id=OWNER))
        assert await engine.forget_personal(OWNER, [secret]) == 1
        mine = await engine.recall("password weather", Viewer(OWNER, dm=True))
        assert mine.memories and secret not in [hit.memory.id for hit in mine.memories]  # gone from answers at once
        assert files_holding(backend, "memories", "zanzibarit")  # the bytes wait for the rewrite...
        assert await engine.read(marks.pending_token) is not None
        await run_maintenance(engine, use_llm=False)
        assert files_holding(backend, "memories", "zanzibarit", "xylophonequeen") == []  # ...which maintenance made
        assert await engine.read(marks.pending_token) is None
        assert not await engine.finish_scrub()


async def test_a_forget_all_rewrites_the_small_history_at_once_beside_a_big_memories_table(
        fake_ollama, make_settings, backend, monkeypatch):
    big = {"memories"}
    monkeypatch.setattr(scrub, "_size", lambda conn, table: 10**9 if table in big else 0)
    async with Engine(make_settings(fake_ollama.url)) as engine:
        pipeline = Pipeline(engine)
        for n in range(30):
            await engine.write(history.record, channel_id=5, guild_id=None, author_id=OWNER, author_name="Oz",
                               role="user", content=f"chatter {n}", created_at=time.time(), message_id=1000 + n)
        await engine.write(history.record, channel_id=5, guild_id=None, author_id=OWNER, author_name="Oz", role="user",
                           content=f"my {SECRET}", created_at=time.time(), message_id=2000)
        await engine.remember(NewMemory(f"{SECRET} is my password", "personal", owner_id=OWNER))
        forgotten = await pipeline.forget_person(OWNER)
        assert forgotten.messages == 31 and forgotten.personal == 1
        assert files_holding(backend, "messages", "zanzibarite", "xylophonequeen") == []  # the person's words: at once
        assert files_holding(backend, "memories", "zanzibarit")  # the big table waits for maintenance
        assert await engine.read(marks.pending_token) is not None


def relfilenodes(url: str) -> dict[str, int]:
    """Each table's file: VACUUM FULL gives a table a new one."""
    import psycopg
    with psycopg.connect(url) as conn:
        return dict(conn.execute("SELECT relname::text, relfilenode::bigint FROM pg_class "
                                 "WHERE relname IN ('memories', 'messages', 'memory_vectors')").fetchall())


async def test_an_edit_that_taught_nothing_rewrites_only_the_history_at_maintenance(fake_ollama, make_settings,
                                                                                   backend):
    async with Engine(make_settings(fake_ollama.url)) as engine:
        pipeline = Pipeline(engine)
        await engine.write(history.record, channel_id=5, guild_id=None, author_id=OWNER, author_name="Oz", role="user",
                           content=f"my {SECRET}", created_at=time.time(), message_id=2000)
        await engine.remember(NewMemory("Oz likes boats", "personal", owner_id=OWNER, source_message_ids=[1999]))
        assert await pipeline.edited(2000, "my password is none of your business", 3.0)
        before = relfilenodes(backend)
        await run_maintenance(engine, use_llm=False)
        after = relfilenodes(backend)
        assert after["messages"] != before["messages"]  # the old words' table: rewritten
        assert after["memories"] == before["memories"] and after["memory_vectors"] == before["memory_vectors"]
        assert files_holding(backend, "messages", "zanzibarite", "xylophonequeen") == []
        assert await engine.read(marks.pending_token, marks.MESSAGES_PENDING) is None

        await engine.write(history.record, channel_id=5, guild_id=None, author_id=OWNER, author_name="Oz", role="user",
                           content=f"again {SECRET}", created_at=time.time(), message_id=2001)
        taught = await engine.remember(NewMemory(f"Oz's password is {SECRET}", "personal", owner_id=OWNER,
                                                 source_message_ids=[2001]))
        assert await pipeline.edited(2001, "never mind", 4.0)  # what it taught is taken back: every table
        assert await engine.get_many([taught]) == {}
        before = relfilenodes(backend)
        await run_maintenance(engine, use_llm=False)
        after = relfilenodes(backend)
        assert all(after[table] != before[table] for table in ("memories", "messages", "memory_vectors"))


async def test_a_deferred_history_scrub_rewrites_only_the_history_at_maintenance(fake_ollama, make_settings, backend,
                                                                                 monkeypatch):
    monkeypatch.setattr(scrub, "_size", lambda conn, table: 10**9)  # every table too big to rewrite at once
    async with Engine(make_settings(fake_ollama.url)) as engine:
        await engine.remember(NewMemory("Oz likes boats", "personal", owner_id=OWNER))
        await engine.write(history.record, channel_id=5, guild_id=None, author_id=OWNER, author_name="Oz", role="user",
                           content=f"my {SECRET}", created_at=time.time(), message_id=2000)
        assert await engine.drop_own_message(OWNER, 2000)
        assert files_holding(backend, "messages", "zanzibarite")  # left for maintenance
        before = relfilenodes(backend)
        await run_maintenance(engine, use_llm=False)
        after = relfilenodes(backend)
        assert after["messages"] != before["messages"]
        assert after["memories"] == before["memories"] and after["memory_vectors"] == before["memory_vectors"]
        assert files_holding(backend, "messages", "zanzibarite", "xylophonequeen") == []
