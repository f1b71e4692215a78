"""The PostgreSQL backend's own guarantees, on a real embedded server: what test_store.py checks
on SQLite's files (deletes leave nothing, failed batches write nothing, links respect people),
the two vector search plans agreeing, two engines writing at once, leases, and clear errors."""
from __future__ import annotations

import asyncio

import psycopg
import pytest

from bot.memory.engine import Engine
from bot.memory.errors import DatabaseError
from bot.memory.postgres.backend import PostgresStorage
from bot.memory.postgres.connection import translate
from bot.memory.postgres.migrations import MIGRATIONS
from bot.memory.records import NewMemory
from bot.memory.scope import Viewer
from tests.postgres_server import free_port


@pytest.fixture
async def pg_engine(fake_ollama, make_settings, postgres_url):
    async with Engine(make_settings(fake_ollama.url, MUNINN_DATABASE_URL=postgres_url)) as engine:
        yield engine


def counts(url: str, memory_id: int) -> dict[str, int]:
    with psycopg.connect(url) as conn:
        def one(sql: str) -> int:
            row = conn.execute(sql.encode(), (memory_id,)).fetchone()
            return int(row[0]) if row else 0
        return {"memories": one("SELECT count(*) FROM memories WHERE id = %s"),
                "keyword": one("SELECT count(*) FROM memories WHERE id = %s AND archived_at IS NULL "
                               "AND text_search @@ plainto_tsquery('muninn', 'zebra')"),
                "vectors": one("SELECT count(*) FROM memory_vectors WHERE memory_id = %s"),
                "links": one("SELECT count(*) FROM memory_links WHERE %s IN (source_id, target_id)"),
                "sources": one("SELECT count(*) FROM memory_sources WHERE memory_id = %s")}


def test_translate_keeps_quoted_text_and_casts():
    assert translate("SELECT ? , :owner, '?:x', \"a?\" FROM t WHERE a LIKE '%' AND b = ?") == \
        "SELECT %s , %(owner)s, '?:x', \"a?\" FROM t WHERE a LIKE '%' AND b = %s"
    assert translate("SELECT CAST(text AS BLOB), x::int, 5 % 2") == \
        "SELECT convert_to(text, 'UTF8'), x::int, 5 %% 2"


async def test_delete_removes_row_keyword_entry_vector_links_and_sources(pg_engine, postgres_url):
    a = await pg_engine.remember(NewMemory("the zebra lives in the zoo", "personal", owner_id=1,
                                           source_message_ids=[77]))
    b = await pg_engine.remember(NewMemory("zoo opening hours", "personal", owner_id=1))
    assert await pg_engine.write(pg_engine.storage.add_link, a, b, "co_extracted")
    assert counts(postgres_url, a) == {"memories": 1, "keyword": 1, "vectors": 1, "links": 1, "sources": 1}
    assert await pg_engine.forget([a], scrub=True) == 1
    assert counts(postgres_url, a) == {"memories": 0, "keyword": 0, "vectors": 0, "links": 0, "sources": 0}


async def test_archive_leaves_both_indexes_and_restore_brings_it_back(pg_engine, postgres_url):
    a = await pg_engine.remember(NewMemory("the zebra lives in the zoo", "global"))
    await pg_engine.archive(a, "test")
    assert counts(postgres_url, a) | {"memories": 1} == {"memories": 1, "keyword": 0, "vectors": 0, "links": 0,
                                                         "sources": 0}
    assert (await pg_engine.recall("zebra", Viewer(1, dm=True))).ids == []
    await pg_engine.restore(a)
    assert counts(postgres_url, a)["vectors"] == 1
    assert (await pg_engine.recall("zebra", Viewer(1, dm=True))).ids == [a]


async def test_a_failed_batch_writes_nothing(pg_engine):
    good = NewMemory("first fact", "personal", owner_id=1, external_id="dup")
    twin = NewMemory("second fact", "personal", owner_id=1, external_id="dup")
    with pytest.raises(psycopg.errors.UniqueViolation):
        await pg_engine.remember_many([good, twin])
    stats = await pg_engine.stats()
    assert stats["memories"] == 0 and stats["embedded"] == 0
    assert await pg_engine.existing_external_ids(["dup"]) == set()


async def test_links_never_join_two_peoples_personal_memories(pg_engine):
    mine = await pg_engine.remember(NewMemory("my fact", "personal", owner_id=1))
    bobs = await pg_engine.remember(NewMemory("Bob's fact", "personal", owner_id=2))
    room = await pg_engine.remember(NewMemory("a room fact", "room", channel_id=5, guild_id=9))
    assert await pg_engine.write(pg_engine.storage.add_link, mine, bobs, "semantic") is False
    assert await pg_engine.write(pg_engine.storage.add_link, bobs, room, "semantic", 0.5) is True
    assert await pg_engine.write(pg_engine.storage.add_link, bobs, room, "semantic", 0.9) is True  # keeps the larger
    assert (await pg_engine.stats())["links_by_kind"] == {"semantic": 1}


async def test_server_search_and_vector_cache_agree_inside_the_scope(fake_ollama, make_settings, postgres_url):
    """Many memories of others, a few of the viewer's: the server's exact search (what answers
    keys the cache does not hold) finds the same nearest visible memories as the vector cache."""
    # 150 texts in one embedding call overran the suite's 1 s embed timeout on a loaded machine
    settings = make_settings(fake_ollama.url, MUNINN_DATABASE_URL=postgres_url, OLLAMA_EMBED_TIMEOUT=30)
    async with Engine(settings) as pg_engine:
        await _server_and_cache_agree(pg_engine)


async def _server_and_cache_agree(pg_engine: Engine) -> None:
    await pg_engine.remember_many([NewMemory(f"apple fact {i}", "personal", owner_id=2) for i in range(150)])
    mine = await pg_engine.remember_many([NewMemory(f"pear note {i}", "personal", owner_id=1) for i in range(5)])
    storage = pg_engine.storage
    assert isinstance(storage, PostgresStorage)
    keys = await pg_engine.read(storage.visible_keys, Viewer(1, dm=True))
    info = await pg_engine.read(storage.index_info)
    query = (await pg_engine.ollama.embed(["apple fact"]))[0]
    exact = await pg_engine.read(lambda conn: storage._server_knn(conn, info, query, keys, 3))
    cached = await pg_engine.read(lambda conn: storage.knn(conn, info, query, keys, 3))  # the vector cache
    assert [m for m, _ in exact] == [m for m, _ in cached] and {m for m, _ in exact} <= set(mine)
    everyone = ["g", "p:1:dm", "p:2:dm"]
    exact = await pg_engine.read(lambda conn: storage._server_knn(conn, info, query, everyone, 10))
    cached = await pg_engine.read(lambda conn: storage.knn(conn, info, query, everyone, 10))
    assert [m for m, _ in exact] == [m for m, _ in cached] and len(exact) == 10
    indexes = await pg_engine.read(lambda conn: conn.pg.execute(
        "SELECT count(*) FROM pg_indexes WHERE tablename = 'memory_vectors' AND indexdef ILIKE '%%hnsw%%'").fetchone())
    assert indexes == (0,)  # no approximate index: inserts stay cheap (migration 9)


async def test_two_engines_writing_at_once_lose_and_duplicate_nothing(fake_ollama, make_settings, postgres_url):
    """Two engines = two processes' connections: both store, touch and forget at once."""
    settings = make_settings(fake_ollama.url, MUNINN_DATABASE_URL=postgres_url)
    async with Engine(settings) as one, Engine(settings) as two:
        async def writer(engine: Engine, who: int) -> list[int]:
            ids: list[int] = []
            for batch in range(8):
                ids += await engine.remember_many(
                    [NewMemory(f"fact {who}-{batch}-{i} about shared zebras", "global") for i in range(5)])
                await engine.recall("shared zebras", Viewer(who, dm=True))  # touches, concurrently
            return ids
        first, second = await asyncio.gather(writer(one, 1), writer(two, 2))
        assert len(set(first) | set(second)) == 80 == len(first) + len(second)
        stats = await one.stats()
        assert stats["memories"] == 80 and stats["embedded"] == 80
        gone = await asyncio.gather(one.forget(first[:20]), two.forget(first[10:30]))
        assert sum(gone) == 30 and (await two.stats())["memories"] == 50


async def test_the_lease_has_one_holder_across_engines(fake_ollama, make_settings, postgres_url):
    settings = make_settings("", MUNINN_DATABASE_URL=postgres_url)
    async with Engine(settings) as one, Engine(settings) as two:
        taken = await asyncio.gather(*(engine.take_lease("maintenance", name, 60)
                                       for engine, name in ((one, "a"), (two, "b"), (one, "a2"), (two, "b2"))))
        assert sum(taken) == 1
        holder = await one.lease_holder("maintenance")
        assert holder in ("a", "b", "a2", "b2")
        assert await two.release_lease("maintenance", holder)
        assert await two.take_lease("maintenance", "c", 60)
        await one.record_run("maintenance", 123.5)
        assert await two.last_run("maintenance") == 123.5


async def test_pauses_and_history_lookups(pg_engine):
    assert await pg_engine.pause_memory(7) and not await pg_engine.pause_memory(7)
    assert await pg_engine.take_pause_notice(7) and not await pg_engine.take_pause_notice(7)
    assert await pg_engine.memory_paused(7)
    assert await pg_engine.resume_memory(7) and not await pg_engine.memory_paused(7)
    assert await pg_engine.last_message_of(1, 7) is None


async def test_a_server_that_is_down_is_one_clear_line(make_settings):
    settings = make_settings("", MUNINN_DATABASE_URL=f"postgresql://muninn:secret@127.0.0.1:{free_port()}/muninn")
    with pytest.raises(DatabaseError) as caught:
        async with Engine(settings):
            pass
    message = str(caught.value)
    assert message.startswith("cannot connect to PostgreSQL at 127.0.0.1:") and "\n" not in message
    assert "secret" not in message


async def test_a_missing_database_is_one_clear_line(make_settings, postgres_server):
    settings = make_settings("", MUNINN_DATABASE_URL=postgres_server.url("no_such_database"))
    with pytest.raises(DatabaseError, match="no_such_database.*does not exist"):
        async with Engine(settings):
            pass


@pytest.mark.parametrize("url", ["mysql://x@h/db", "postgresql:///", "localhost/muninn"])
def test_a_database_url_that_is_not_postgresql_is_refused_at_load(url):
    from bot.settings import SettingsError, load_settings
    with pytest.raises(SettingsError, match="MUNINN_DATABASE_URL must be a postgresql:// URL"):
        load_settings({"MUNINN_DATABASE_URL": url}, dotenv=False)


async def test_two_processes_storing_the_same_fact_at_once_store_it_once(fake_ollama, make_settings, postgres_url):
    """Shards on one PostgreSQL: a fact heard by two bot processes at the same moment (the same
    person telling both, an import beside the bot) is stored once and reinforced once, as on
    SQLite, where the file's one write lock gives it for free."""
    from bot.lifecycle.fact_store import store_facts
    from bot.lifecycle.facts import Fact
    from tests.helpers import CHANNEL, GUILD, exchange, memories_of
    settings = make_settings(fake_ollama.url, MUNINN_DATABASE_URL=postgres_url)
    async with Engine(settings) as one, Engine(settings) as two:
        for round_ in range(12):
            fact = Fact(f"Alice keeps {round_} hives of bees.", "Alice", "personal", 0.5, 7, CHANNEL, GUILD, (round_,))
            stored = await asyncio.gather(store_facts(one, [fact], exchange(".")), store_facts(two, [fact], exchange(".")))
            assert stored[0] == stored[1], round_                       # both name the same memory
        kept = await memories_of(one)
        assert len(kept) == 12 and all(m.last_accessed is not None for m in kept)  # inserted once, then reinforced


async def test_after_the_server_drops_every_connection_the_engine_reconnects(pg_engine, postgres_url, caplog):
    """A PostgreSQL restart or failover closes the bot's connections: the next read and the next
    write open new ones (one warning each) instead of failing until the bot is restarted."""
    kept = await pg_engine.remember(NewMemory("Alice keeps bees", "global"))
    await pg_engine.recall("bees", Viewer(1, dm=True))           # the readers are open now too

    def drop_everyone() -> int:
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            rows = admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                 "WHERE datname = current_database() AND pid <> pg_backend_pid()").fetchall()
        return len(rows)
    assert await asyncio.to_thread(drop_everyone) >= 2
    with caplog.at_level("WARNING", logger="bot.memory.engine"):
        assert (await pg_engine.recall("bees", Viewer(1, dm=True))).ids == [kept]
        added = await pg_engine.remember(NewMemory("Alice keeps goats", "global"))
    assert (await pg_engine.get(added)).text == "Alice keeps goats"
    assert any("connection was lost" in r.getMessage() for r in caplog.records)


async def test_doctor_checks_the_postgresql_database(pg_engine, make_settings, postgres_url):
    from bot.cli.doctor import database_checks
    await pg_engine.remember(NewMemory("Alice keeps bees", "global"))
    settings = make_settings("", MUNINN_DATABASE_URL=postgres_url)
    found = {c.name: c for c in await asyncio.to_thread(database_checks, settings)}
    schema = f"schema {len(MIGRATIONS)}/{len(MIGRATIONS)}"
    assert found["database"].ok and "PostgreSQL 18" in found["database"].detail and schema in found["database"].detail
    assert found["pgvector"].ok and found["stored values"].ok and found["vector index"].ok
    assert found["permissions"].ok and "only the owner" in found["permissions"].detail  # no files: grants
    down = make_settings("", MUNINN_DATABASE_URL=f"postgresql://muninn:secret@127.0.0.1:{free_port()}/muninn")
    [check] = await asyncio.to_thread(database_checks, down)
    assert not check.ok and "cannot connect to PostgreSQL" in check.detail and "secret" not in check.detail
    assert "MUNINN_DATABASE_URL" in check.fix


async def test_doctor_finds_nonsense_times_on_postgresql(pg_engine, make_settings, postgres_url):
    from bot.cli.doctor import database_checks
    pinned = await pg_engine.remember(NewMemory("Alice keeps bees", "global"))
    with psycopg.connect(postgres_url, autocommit=True) as admin:   # e.g. copied from an old file
        admin.execute("UPDATE memories SET last_accessed = 4102444800 WHERE id = %s", (pinned,))
    found = {c.name: c for c in await asyncio.to_thread(database_checks,
                                                        make_settings("", MUNINN_DATABASE_URL=postgres_url))}
    assert not found["stored values"].ok and f"last_accessed in the future (pins the memory so it never fades) " \
        f"or not a number: 1 (#{pinned})" in found["stored values"].detail  # repair.RULES, as on SQLite


def test_a_vector_change_committed_after_a_newer_one_still_counts_as_a_change(postgres_url):
    """A fact write reuses its planning search only if no vector changed since (writes.py). A
    transaction that logged a change first (a lower seq) and commits after a newer one must
    still count: max(seq) did not move, and the other process's fact would be missed."""
    storage = PostgresStorage(postgres_url)
    conn = storage.open_writer()
    slow = psycopg.connect(postgres_url)
    try:
        slow.execute("INSERT INTO vector_changes (memory_id) VALUES (1)")  # not committed yet
        with psycopg.connect(postgres_url, autocommit=True) as quick:
            quick.execute("INSERT INTO vector_changes (memory_id) VALUES (2)")
        mark = storage.change_mark(conn)
        assert storage.unchanged_since(conn, mark)
        slow.commit()                                                        # the older change lands now
        assert not storage.unchanged_since(conn, mark)
    finally:
        slow.close()
        storage.close(conn)


def until_a_writer_waits_for_a_key(postgres_url: str) -> None:
    """Returns once another connection waits for a key's advisory lock (fails after ~4 s)."""
    import time
    with psycopg.connect(postgres_url, autocommit=True) as watch:
        for _ in range(200):
            if watch.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted").fetchone()[0]:
                return
            time.sleep(0.02)
    raise AssertionError("the second writer never waited for the key")


def test_a_fact_write_waiting_for_its_key_sees_what_the_holder_stored(postgres_url):
    """begin_fact_write sends the key lock and the checks after it as one round trip: the server
    runs them in order, each with its own snapshot, so a writer that waited for the key sees the
    fact and the vector its holder committed (one snapshot for all would see neither, and both
    processes would store the fact)."""
    import threading

    from bot.memory.sqlite import fts
    storage = PostgresStorage(postgres_url)
    holder, waiter = storage.open_writer(), storage.open_writer()
    memory = NewMemory("Alice keeps bees", "global")
    try:
        assert storage.index_for(holder, "m", 3) is not None
        mark = storage.change_mark(waiter)
        seen: dict = {}

        def wait_for_the_key() -> None:
            with waiter.transaction():
                seen["start"] = storage.begin_fact_write(waiter, [memory.vis_key], "m", 3, mark,
                                                         [(memory.vis_key, fts.tokens(memory.text))], 50)
        with holder.transaction():
            info, unchanged, hits = storage.begin_fact_write(holder, [memory.vis_key], "m", 3, mark,
                                                             [(memory.vis_key, fts.tokens(memory.text))], 50)
            assert info is not None and unchanged and hits == [[]]
            (stored,) = storage.insert(holder, [memory], base_stability_days=7, model="m", vecs=[[1.0, 0.0, 0.0]],
                                       now=None, info=info)
            other = threading.Thread(target=wait_for_the_key)
            other.start()
            until_a_writer_waits_for_a_key(postgres_url)
        other.join(10)
        info, unchanged, hits = seen["start"]
        assert info is not None and not unchanged and hits == [[(stored, "Alice keeps bees")]]
    finally:
        storage.close(holder)
        storage.close(waiter)


def test_a_fact_write_waiting_for_its_key_across_a_reset_index_sees_the_new_index(postgres_url):
    """begin_fact_write reads the index after the key locks (Storage.begin_fact_write's order):
    read before them, a writer that waited while the index was reset for another model would
    store its vector under the old one's model and size."""
    import threading

    storage = PostgresStorage(postgres_url)
    holder, waiter, resetter = storage.open_writer(), storage.open_writer(), storage.open_writer()
    key = NewMemory("Alice keeps bees", "global").vis_key
    try:
        assert storage.index_for(holder, "m", 3) is not None
        seen: dict = {}

        def wait_for_the_key() -> None:
            with waiter.transaction():
                seen["start"] = storage.begin_fact_write(waiter, [key], "m", 3, None, [], 50)
        with holder.transaction():
            storage.begin_fact_write(holder, [key], "m", 3, None, [], 50)
            other = threading.Thread(target=wait_for_the_key)
            other.start()
            until_a_writer_waits_for_a_key(postgres_url)
            storage.reset_index(resetter, "m2", 4)
        other.join(10)
        info, _, _ = seen["start"]
        assert info is None  # the index is m2's now: the write stores no vector of m's
    finally:
        storage.close(holder)
        storage.close(waiter)
        storage.close(resetter)
