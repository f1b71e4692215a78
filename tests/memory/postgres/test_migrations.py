"""The PostgreSQL schema (bot/memory/postgres/migrations.py) on a real embedded server."""
from __future__ import annotations

import threading

import psycopg
import pytest

from bot.memory.postgres.migrations import MIGRATIONS, migrate, schema_version
from bot.memory.sqlite import migrations as sqlite_migrations
from tests.postgres_fixtures import TEMPLATE


def test_numbered_like_sqlite_and_fully_applied(postgres_url):
    assert len(MIGRATIONS) == len(sqlite_migrations.MIGRATIONS)
    with psycopg.connect(postgres_url) as conn:
        assert schema_version(conn) == len(MIGRATIONS)
        assert migrate(conn) == len(MIGRATIONS)  # idempotent
        tables = {row[0] for row in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}
        assert {"meta", "memories", "memory_vectors", "memory_links", "messages", "channel_options",
                "memory_sources", "vector_changes", "memory_pauses", "schema_version"} <= tables
        assert conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'").fetchone()


def _insert(conn: psycopg.Connection, text: str, sources: str = "[]", archived: float | None = None) -> int:
    row = conn.execute(
        "INSERT INTO memories (text, scope, owner_id, vis_key, stability, created_at, updated_at,"
        " source_message_ids, archived_at) VALUES (%s, 'global', 1, 'g', 1, 0, 0, %s, %s) RETURNING id",
        (text, sources, archived)).fetchone()
    assert row is not None
    return int(row[0])


def test_keyword_index_stems_and_covers_only_active_memories(postgres_url):
    with psycopg.connect(postgres_url) as conn:
        active = _insert(conn, "Alice's cats are running in the garden")
        _insert(conn, "the archived cat", archived=5.0)
        hits = conn.execute(
            "SELECT id FROM memories WHERE archived_at IS NULL AND text_search @@ plainto_tsquery('muninn', 'cat run')"
        ).fetchall()
        assert [h[0] for h in hits] == [active]


def test_memory_sources_follow_the_json_list(postgres_url):
    with psycopg.connect(postgres_url) as conn:
        mid = _insert(conn, "learned from two messages", sources="[11, 12]")
        assert sorted(r[0] for r in conn.execute("SELECT message_id FROM memory_sources WHERE memory_id = %s", (mid,))) \
            == ["11", "12"]
        conn.execute("UPDATE memories SET source_message_ids = '[13]' WHERE id = %s", (mid,))
        assert [r[0] for r in conn.execute("SELECT message_id FROM memory_sources WHERE memory_id = %s", (mid,))] == ["13"]
        conn.execute("DELETE FROM memories WHERE id = %s", (mid,))
        assert conn.execute("SELECT count(*) FROM memory_sources").fetchone() == (0,)


def test_ids_are_never_reused(postgres_url):
    with psycopg.connect(postgres_url) as conn:
        first = _insert(conn, "one")
        conn.execute("DELETE FROM memories WHERE id = %s", (first,))
        assert _insert(conn, "two") > first


def test_two_processes_migrating_at_once_both_succeed(postgres_server):
    url = postgres_server.create_database("muninn_concurrent_migrate")
    try:
        errors: list[BaseException] = []

        def run() -> None:
            try:
                with psycopg.connect(url) as conn:
                    migrate(conn)
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=run) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        with psycopg.connect(url) as conn:
            assert schema_version(conn) == len(MIGRATIONS)
            assert conn.execute("SELECT count(*) FROM schema_version").fetchone() == (1,)
    finally:
        postgres_server.drop_database("muninn_concurrent_migrate")


def test_a_newer_database_is_refused(postgres_server):
    url = postgres_server.create_database("muninn_newer", template=TEMPLATE)
    try:
        with psycopg.connect(url) as conn:
            conn.execute("UPDATE schema_version SET version = 99")
            conn.commit()
            with pytest.raises(RuntimeError, match="newer than this Muninn"):
                migrate(conn)
    finally:
        postgres_server.drop_database("muninn_newer")


def test_migration_9_drops_the_hnsw_index_of_an_older_database(postgres_server):
    """A database made before migration 9 (its backend built an HNSW index at the first
    embedding) loses the index and keeps its vectors; the search is exact from then on."""
    url = postgres_server.create_database("muninn_before_9", template=TEMPLATE)
    try:
        with psycopg.connect(url) as conn:
            memory = _insert(conn, "a remembered fact")
            conn.execute("INSERT INTO memory_vectors (memory_id, vis_key, created_at, embedding) "
                         "VALUES (%s, 'g', 0, '[1,0,0]')", (memory,))
            conn.execute("CREATE INDEX memory_vectors_hnsw ON memory_vectors "
                         "USING hnsw ((embedding::vector(3)) vector_l2_ops)")
            conn.execute("UPDATE schema_version SET version = 8")
            conn.commit()
            assert migrate(conn) == len(MIGRATIONS) >= 9
            assert conn.execute("SELECT count(*) FROM pg_indexes WHERE indexname = 'memory_vectors_hnsw'"
                                ).fetchone() == (0,)
            assert conn.execute("SELECT memory_id FROM memory_vectors").fetchall() == [(memory,)]
    finally:
        postgres_server.drop_database("muninn_before_9")


def test_migration_10_makes_vectors_follow_their_memory_key(postgres_server):
    """Made by migration 10 (no longer at each start): a version-9 database without the trigger
    gets it and its drifted vectors put back under their memory's key; one whose start had made
    the trigger already keeps working."""
    url = postgres_server.create_database("muninn_before_10", template=TEMPLATE)
    try:
        with psycopg.connect(url) as conn:
            conn.execute("DROP TRIGGER memory_vectors_follow_key ON memories")
            memory = _insert(conn, "a fact that changed hands")
            conn.execute("INSERT INTO memory_vectors (memory_id, vis_key, created_at, embedding) "
                         "VALUES (%s, 'p:7:dm', 0, '[1,0,0]')", (memory,))  # drifted: the memory is global
            conn.execute("UPDATE schema_version SET version = 9")
            conn.commit()
            assert migrate(conn) == len(MIGRATIONS) >= 10
            assert conn.execute("SELECT vis_key FROM memory_vectors").fetchall() == [("g",)]
            logged = conn.execute("SELECT count(*) FROM vector_changes WHERE memory_id = %s", (memory,)).fetchone()[0]
            conn.execute("UPDATE memories SET scope = 'personal', vis_key = 'p:1:dm' WHERE id = %s", (memory,))
            assert conn.execute("SELECT vis_key FROM memory_vectors").fetchall() == [("p:1:dm",)]
            assert conn.execute("SELECT count(*) FROM vector_changes WHERE memory_id = %s",
                                (memory,)).fetchone()[0] == logged + 1  # logged once, for the caches
            conn.commit()
            conn.execute("UPDATE schema_version SET version = 9")  # as if a start had made the trigger first
            conn.commit()
            assert migrate(conn) == len(MIGRATIONS)
            assert conn.execute("SELECT count(*) FROM pg_trigger WHERE tgname = 'memory_vectors_follow_key'"
                                ).fetchone() == (1,)
    finally:
        postgres_server.drop_database("muninn_before_10")


def _keyword_index(conn: psycopg.Connection) -> str:
    row = conn.execute("SELECT indexdef FROM pg_indexes WHERE indexname = 'memories_text_search'").fetchone()
    return str(row[0]) if row else ""


def _keyword_plan(conn: psycopg.Connection) -> str:
    """The plan of a keyword match with the keyword index as the only index left (the others
    dropped in a transaction rolled back after): which conditions that index can serve, whatever
    the planner would pick on a small table among the others."""
    conn.execute("SET LOCAL enable_seqscan = off")
    others = conn.execute("SELECT i.indexrelid::regclass::text FROM pg_index i WHERE i.indrelid = 'memories'::regclass "
                          "AND i.indexrelid <> 'memories_text_search'::regclass AND NOT EXISTS "
                          "(SELECT 1 FROM pg_constraint c WHERE c.conindid = i.indexrelid)").fetchall()
    for (index,) in others:
        conn.execute(f"DROP INDEX {index}".encode())
    plan = conn.execute("EXPLAIN SELECT id FROM memories WHERE archived_at IS NULL AND vis_key = 'g' "
                        "AND text_search @@ plainto_tsquery('muninn', 'otter')").fetchall()
    conn.rollback()
    return "\n".join(row[0] for row in plan)


def test_migration_14_indexes_key_and_words_together_and_keeps_active_word_statistics(postgres_url):
    with psycopg.connect(postgres_url) as conn:
        assert "gin (vis_key, text_search)" in _keyword_index(conn)
        assert "WHERE (archived_at IS NULL)" in _keyword_index(conn)
        assert conn.execute("SELECT extname FROM pg_extension WHERE extname = 'btree_gin'").fetchone()
        # a key's equality (the common-word walk's per key) and the words, both from the index
        # (`vis_key = ANY(array)` is not: GIN has no array search, it filters the rows)
        assert "vis_key = 'g'" in _keyword_plan(conn).split("Index Cond:")[1]
        assert conn.execute("SELECT stxname FROM pg_statistic_ext").fetchall() == [("memories_active_words",)]
        assert conn.execute("SELECT stxstattarget FROM pg_statistic_ext").fetchone() == (400,)


def test_migration_14_on_a_database_with_memories(postgres_server, monkeypatch):
    """A version-13 database with active and archived memories: the new index finds the active
    ones by key and word, and the statistics count only the active ones."""
    url = postgres_server.create_database("muninn_before_14")
    try:
        with psycopg.connect(url) as conn:
            monkeypatch.setattr("bot.memory.postgres.migrations.MIGRATIONS", MIGRATIONS[:13])
            assert migrate(conn) == 13
            assert "gin (text_search)" in _keyword_index(conn)
            otters = [_insert(conn, f"an otter swims in river {i}") for i in range(30)]
            for i in range(10):
                _insert(conn, f"an archived otter {i}", archived=5.0)
            conn.commit()
            monkeypatch.undo()
            assert migrate(conn) == len(MIGRATIONS) >= 14
            assert "gin (vis_key, text_search)" in _keyword_index(conn)
            found = conn.execute("SELECT id FROM memories WHERE archived_at IS NULL AND vis_key = ANY(ARRAY['g']) "
                                 "AND text_search @@ plainto_tsquery('muninn', 'otter') ORDER BY id").fetchall()
            assert [row[0] for row in found] == otters
            stats = conn.execute("SELECT most_common_elems::text::text[], most_common_elem_freqs, null_frac "
                                 "FROM pg_stats_ext_exprs WHERE statistics_name = 'memories_active_words'").fetchone()
            otter = dict(zip(stats[0], stats[1], strict=False))["otter"]
            assert (otter, stats[2]) == (pytest.approx(1.0), pytest.approx(0.25))  # in all 30 active, of 40 rows
    finally:
        postgres_server.drop_database("muninn_before_14")


def test_a_server_without_btree_gin_gets_one_line_saying_what_to_install(postgres_server, monkeypatch):
    from bot.memory.errors import DatabaseError
    url = postgres_server.create_database("muninn_no_btree_gin")
    try:
        with psycopg.connect(url) as conn:
            lacking = [*MIGRATIONS[:13], "CREATE EXTENSION IF NOT EXISTS muninn_no_such_extension;"]
            monkeypatch.setattr("bot.memory.postgres.migrations.MIGRATIONS", lacking)
            with pytest.raises(DatabaseError, match="no btree_gin extension.*contrib"):
                migrate(conn)
            assert schema_version(conn) == 13
    finally:
        postgres_server.drop_database("muninn_no_btree_gin")


def test_migration_23_walks_long_memories_words_in_an_index_of_their_own(postgres_url):
    """Each half of the common-word walk (keywords.py) has an index whose predicate it states: the
    short memories' index-only, carrying their words; the long memories' beside it."""
    halves = {"<= 1500": "memories_active_vis_words", "> 1500": "memories_active_vis_long"}
    with psycopg.connect(postgres_url) as conn:
        conn.execute("SET LOCAL enable_seqscan = off")
        conn.execute("SET LOCAL enable_bitmapscan = off")
        # rolled back below: only the two indexes left, so the plan says which conditions each can serve
        # whatever the planner would pick on a small table among the others
        for (constraint,) in conn.execute("SELECT conname FROM pg_constraint WHERE conrelid = 'memories'::regclass "
                                          "AND contype IN ('p', 'u')").fetchall():
            conn.execute(f"ALTER TABLE memories DROP CONSTRAINT {constraint} CASCADE".encode())
        others = conn.execute("SELECT indexrelid::regclass::text FROM pg_index WHERE indrelid = 'memories'::regclass "
                              "AND indexrelid::regclass::text NOT IN (%s, %s)", list(halves.values())).fetchall()
        for (index,) in others:
            conn.execute(f"DROP INDEX {index}".encode())
        for size, index in halves.items():
            plan = "\n".join(row[0] for row in conn.execute(
                "EXPLAIN SELECT m.id, m.text_search FROM memories m WHERE m.vis_key = 'g' AND m.archived_at IS NULL "
                f"AND m.id > 0 AND octet_length(m.text_search::text) {size} "
                "AND m.text_search @@ plainto_tsquery('muninn', 'otter') ORDER BY m.id DESC LIMIT 5".encode()))
            assert index in plan, plan
        assert "Index Only Scan Backward using memories_active_vis_words" in "\n".join(row[0] for row in conn.execute(
            "EXPLAIN SELECT m.id, m.text_search FROM memories m WHERE m.vis_key = 'g' AND m.archived_at IS NULL "
            "AND m.id > 0 AND octet_length(m.text_search::text) <= 1500 "
            "AND m.text_search @@ plainto_tsquery('muninn', 'otter') ORDER BY m.id DESC LIMIT 5"))
        conn.rollback()
