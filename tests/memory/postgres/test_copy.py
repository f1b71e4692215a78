"""The pieces of `muninn migrate`'s copy: the SQLite source read (bot/memory/sqlite/copy_source.py)
and the target's checks (bot/memory/postgres/copy.py); tests/test_migrate.py runs whole copies."""
from __future__ import annotations

import struct

import apsw
import pytest

from bot.memory import records
from bot.memory.engine import Engine
from bot.memory.errors import DatabaseError
from bot.memory.postgres.copy import Float32Vector, MigrationError, copy_database
from bot.memory.sql.queries import set_meta
from bot.memory.sqlite import copy_source
from bot.memory.sqlite.copy_source import TABLES


def table(name: str) -> copy_source.Table:
    return next(t for t in TABLES if t.name == name)


@pytest.fixture
async def source(make_settings, fake_ollama):
    """A SQLite file with five embedded memories, the last one deleted, and a lease in meta."""
    settings = make_settings(fake_ollama.url)
    async with Engine(settings) as engine:
        ids = [await engine.remember(records.NewMemory(f"Alice likes tea number {n}", "personal", owner_id=1))
               for n in range(5)]
        await engine.forget([ids[-1]])
        await engine.write(set_meta, "lease.maintenance", "{}")
    return settings.db_path, ids


async def test_the_source_is_read_only_and_its_rows_come_in_key_order_after_a_key(source):
    path, ids = source
    before = path.read_bytes()
    conn = copy_source.open_source(path)
    try:
        with pytest.raises(apsw.ReadOnlyError):
            conn.execute("DELETE FROM memories")
        first, repaired = copy_source.table_rows(conn, table("memories"), None, 2)
        rest, _ = copy_source.table_rows(conn, table("memories"), [first[-1][0]], 10)
        assert [row[0] for row in first + rest] == ids[:-1] and repaired == 0
        assert first[0][1] == "Alice likes tea number 0"   # text read as bytes, decoded
        assert copy_source.row_count(conn, table("memories")) == len(ids) - 1
        assert [k for (k,) in copy_source.keys(conn, table("memories"))] == ids[:-1]
        assert copy_source.autoincrement_high(conn) == ids[-1]   # the deleted memory's id too
        meta_keys = [k for (k,) in copy_source.keys(conn, table("meta"))]
        assert "lease.maintenance" not in meta_keys and "embed_model" not in meta_keys and meta_keys
    finally:
        conn.close()
    assert path.read_bytes() == before


async def test_vectors_are_read_from_the_chunks_as_stored(source):
    path, ids = source
    conn = copy_source.open_source(path)
    try:
        info = copy_source.index_info(conn)
        assert info is not None and info.model == "nomic-embed-text"
        rows = copy_source.vector_rows(conn, info, None, 10)
        assert [row[0] for row in rows] == ids[:-1]
        stored = dict(conn.execute("SELECT memory_id, embedding FROM vec_memories"))
        assert all(blob == bytes(stored[mid]) and len(blob) == info.dim * 4 for mid, _, _, blob in rows)
        assert [row[0] for row in copy_source.vector_rows(conn, info, [ids[1]], 2)] == ids[2:4]
        assert copy_source.row_count(conn, table("memory_vectors")) == len(ids) - 1
    finally:
        conn.close()


async def test_text_postgresql_cannot_hold_is_cleaned_and_counted(source):
    path, ids = source
    conn = apsw.Connection(str(path))
    conn.execute("UPDATE memories SET text = CAST(? AS TEXT) WHERE id = ?", (b"caf\xe9", ids[0]))
    conn.execute("UPDATE memories SET text = ? WHERE id = ?", ("a\x00b", ids[1]))
    conn.execute("UPDATE memories SET text = ? WHERE id = ?", ("already \ufffd", ids[2]))  # not a repair
    conn.close()
    source_conn = copy_source.open_source(path)
    try:
        rows, repaired = copy_source.table_rows(source_conn, table("memories"), None, 3)
    finally:
        source_conn.close()
    assert [row[1] for row in rows] == ["caf\ufffd", "a\ufffdb", "already \ufffd"] and repaired == 2


def test_a_missing_file_or_another_schema_is_refused_in_one_line(tmp_path):
    with pytest.raises(DatabaseError, match="no SQLite database at"):
        copy_source.open_source(tmp_path / "none.db")
    old = tmp_path / "old.db"
    conn = apsw.Connection(str(old))
    conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT); CREATE TABLE memories (id INTEGER);"
                 "PRAGMA user_version = 1")
    conn.close()
    with pytest.raises(DatabaseError, match="has schema version 1, this Muninn .*: run `muninn stats`"):
        copy_source.open_source(old)
    with pytest.raises(MigrationError, match="has schema version 1"):   # the copy says it as its own error
        copy_database(old, "postgresql://localhost/unused")


def test_a_vector_goes_to_pgvector_as_big_endian_floats_after_its_size():
    raw = struct.pack("<3f", 1.0, -0.5, 0.25)
    assert Float32Vector(raw, 3).binary == struct.pack(">HH3f", 3, 0, 1.0, -0.5, 0.25)
    with pytest.raises(MigrationError, match="a stored vector has 3 dimensions, the index 4"):
        Float32Vector(raw, 4)


async def test_a_target_indexed_for_another_model_is_refused(source, postgres_url):
    import psycopg
    path, _ = source
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("INSERT INTO meta (key, value) VALUES ('embed_model', 'other-model'), ('embed_dim', '3')")
    with pytest.raises(MigrationError, match="the target's vector index is for other-model \\(3 dimensions\\)"):
        copy_database(path, postgres_url)
