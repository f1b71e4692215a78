"""Forgotten words are gone from PostgreSQL's files, not only from its answers (privacy).

Read back the way someone with the data directory would: the bytes of every file of the
table (heap, TOAST, each index, the GIN index's lexemes included) after a CHECKPOINT wrote
the shared buffers out. pg_read_binary_file reads them through the server (the files belong
to its system user)."""
from __future__ import annotations

import struct
import time

import psycopg
import pytest

from bot.lifecycle.maintenance import run_maintenance
from bot.memory.engine import Engine
from bot.memory.records import NewMemory
from bot.memory.sql import history

pytestmark = pytest.mark.parametrize("backend", ["postgresql"], indirect=True)

SECRET = "Zanzibarite xylophonequeen"
OWNER = 41


def files_holding(url: str, table: str, *words: str | bytes) -> list[str]:
    """The relations of `table` (itself, its TOAST table and their indexes) whose file holds any of `words`."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CHECKPOINT")
        relations = [row[0] for row in conn.execute(
            "SELECT c.oid::regclass::text FROM pg_class c WHERE c.oid = %s::regclass "
            "OR c.oid = (SELECT reltoastrelid FROM pg_class WHERE oid = %s::regclass) "
            "OR c.oid IN (SELECT indexrelid FROM pg_index WHERE indrelid IN "
            "  (%s::regclass, (SELECT reltoastrelid FROM pg_class WHERE oid = %s::regclass)))",
            (table, table, table, table))]
        found = []
        for relation in relations:
            path = conn.execute("SELECT pg_relation_filepath(%s)", (relation,)).fetchone()
            data = conn.execute("SELECT pg_read_binary_file(%s, 0, pg_relation_size(%s), true)",
                                (path[0], relation)).fetchone()[0] or b""
            if any(word.lower().encode() in data.lower() if isinstance(word, str) else word in data for word in words):
                found.append(relation)
    return found


async def test_a_forgotten_memory_leaves_no_words_in_the_tables_or_the_keyword_index(fake_ollama, make_settings, backend):
    async with Engine(make_settings(fake_ollama.url)) as engine:
        notes = [NewMemory(f"ordinary note {n} about the weather", "personal", owner_id=OWNER) for n in range(30)]
        # 768-dimensional vectors fit two to a page; the 12th is the lower one of its page, so
        # VACUUM's compaction moves nothing over it, and it is not on the last page, which VACUUM cuts off
        await engine.remember_many(notes[:11])
        secret = await engine.remember(NewMemory(f"{SECRET} is my password", "personal", owner_id=OWNER))
        await engine.remember_many(notes[11:])
        assert files_holding(backend, "memories", "zanzibarit")  # the heap and the GIN index (a stem) hold it
        vector = await engine.read(lambda conn: conn.pg.execute(
            "SELECT embedding::real[] FROM memory_vectors WHERE memory_id = %s", (secret,)).fetchone()[0])
        vector_bytes = struct.pack("<8f", *vector[:8])  # as pgvector stores it, in the table and the HNSW index
        assert files_holding(backend, "memory_vectors", vector_bytes)
        assert await engine.forget_personal(OWNER, [secret]) == 1
        assert files_holding(backend, "memories", "zanzibarit", "xylophonequeen") == []  # at once
        assert files_holding(backend, "memory_vectors", vector_bytes) == ["memory_vectors"]  # pgvector zeroed the index's
        await run_maintenance(engine, use_llm=False)  # the vectors' rewrite waits for it (postgres/scrub.py)
        assert files_holding(backend, "memory_vectors", vector_bytes) == []
        assert not await engine.finish_scrub()  # done: nothing left for the next run


async def test_a_message_taken_back_leaves_no_words_in_the_history_table(fake_ollama, make_settings, backend):
    async with Engine(make_settings(fake_ollama.url)) as engine:
        for n in range(30):
            await engine.write(history.record, channel_id=5, guild_id=None, author_id=OWNER, author_name="Oz",
                               role="user", content=f"chatter {n}", created_at=time.time(), message_id=1000 + n)
        await engine.write(history.record, channel_id=5, guild_id=None, author_id=OWNER, author_name="Oz", role="user",
                           content=f"my {SECRET}", created_at=time.time(), message_id=2000)
        assert files_holding(backend, "messages", "zanzibarite")
        assert await engine.drop_own_message(OWNER, 2000)
    assert files_holding(backend, "messages", "zanzibarite", "xylophonequeen") == []


async def test_a_plain_forget_leaves_its_words_for_the_next_maintenance(fake_ollama, make_settings, backend):
    async with Engine(make_settings(fake_ollama.url)) as engine:
        await engine.remember_many([NewMemory(f"ordinary note {n} about the weather", "personal", owner_id=OWNER)
                                    for n in range(30)])
        secret = await engine.remember(NewMemory(f"{SECRET} is my password", "personal", owner_id=OWNER))
        await engine.remember_many([NewMemory(f"another note {n}", "personal", owner_id=OWNER) for n in range(30)])
        vector = await engine.read(lambda conn: conn.pg.execute(
            "SELECT embedding::real[] FROM memory_vectors WHERE memory_id = %s", (secret,)).fetchone()[0])
        vector_bytes = struct.pack("<8f", *vector[:8])
        assert await engine.forget([secret]) == 1  # one `/memory forget`: the table is not rewritten at each click
        await run_maintenance(engine, use_llm=False)
        assert files_holding(backend, "memories", "zanzibarit", "xylophonequeen") == []
        assert files_holding(backend, "memory_vectors", vector_bytes) == []
        assert not await engine.finish_scrub()


async def test_a_scrub_locked_out_by_a_long_transaction_waits_for_maintenance(fake_ollama, make_settings, backend):
    async with Engine(make_settings(fake_ollama.url)) as engine:
        secret = await engine.remember(NewMemory(f"{SECRET} is my password", "personal", owner_id=OWNER))
        await engine.remember_many([NewMemory(f"note {n}", "personal", owner_id=OWNER) for n in range(10)])
        with psycopg.connect(backend) as reader:  # someone's open transaction that read the table
            reader.execute("SELECT count(*) FROM memories").fetchone()
            started = time.monotonic()
            assert await engine.forget_personal(OWNER, [secret]) == 1
            assert time.monotonic() - started < 10  # the rewrite gave up after its lock wait, nothing hung
        assert files_holding(backend, "memories", "zanzibarit")  # not rewritten yet...
        await run_maintenance(engine, use_llm=False)
        assert files_holding(backend, "memories", "zanzibarit", "xylophonequeen") == []  # ...the next run did
        assert not await engine.finish_scrub()
