"""Storage: migrations, WAL, one transaction per write, deletes that leave nothing behind."""
from __future__ import annotations

import apsw
import pytest

from bot.memory.records import NewMemory
from bot.memory.scope import Viewer
from bot.memory.sql import queries, store
from bot.memory.sqlite import db
from bot.memory.sqlite import vec0 as vectors
from bot.memory.sqlite.migrations import MIGRATIONS


def counts(conn, memory_id: int) -> dict:
    return {
        "memories": queries.query_value(conn, "SELECT count(*) FROM memories WHERE id = ?", (memory_id,)),
        # MATCH reads the index itself (a rowid probe of external-content FTS reads `memories`)
        "fts_match": queries.query_value(conn, "SELECT count(*) FROM memories_fts WHERE memories_fts MATCH 'zebra'"),
        "vectors": queries.query_value(conn, "SELECT count(*) FROM vec_memories WHERE memory_id = ?", (memory_id,))
        if vectors.table_exists(conn) else 0,
        "links": queries.query_value(conn, "SELECT count(*) FROM memory_links WHERE source_id = ? OR target_id = ?",
                                (memory_id, memory_id)),
        "sources": queries.query_value(conn, "SELECT count(*) FROM memory_sources WHERE memory_id = ?", (memory_id,)),
    }


def test_fresh_database_is_migrated_and_in_wal_mode(tmp_path):
    conn = db.connect(tmp_path / "m.db")
    assert conn.execute("PRAGMA user_version").fetchall()[0][0] == len(MIGRATIONS)
    assert conn.execute("PRAGMA journal_mode").fetchall()[0][0] == "wal"
    conn.close()
    again = db.connect(tmp_path / "m.db")  # re-opening applies nothing twice
    assert again.execute("PRAGMA user_version").fetchall()[0][0] == len(MIGRATIONS)


def test_newer_schema_is_refused(tmp_path):
    conn = db.connect(tmp_path / "m.db")
    conn.execute(f"PRAGMA user_version = {len(MIGRATIONS) + 1}")
    conn.close()
    with pytest.raises(RuntimeError, match="newer"):
        db.connect(tmp_path / "m.db")


def test_not_a_database_gives_a_clear_error(tmp_path):
    path = tmp_path / "junk.db"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(db.DatabaseError, match="not a SQLite database"):
        db.connect(path)


async def test_delete_removes_row_fts_vector_and_links(engine):
    a = await engine.remember(NewMemory("the zebra lives in the zoo", "personal", owner_id=1, source_message_ids=[42]))
    b = await engine.remember(NewMemory("zoo opening hours", "personal", owner_id=1))
    await engine.write(lambda conn: store.add_link(conn, a, b, "co_extracted"))
    before = await engine.write(counts, a)
    assert before == {"memories": 1, "fts_match": 1, "vectors": 1, "links": 1, "sources": 1}
    assert await engine.forget([a]) == 1
    assert await engine.write(counts, a) == {"memories": 0, "fts_match": 0, "vectors": 0, "links": 0, "sources": 0}
    await engine.write(fts_integrity_check)
    assert await engine.forget([a]) == 0


def fts_integrity_check(conn, against_content: bool = True) -> None:
    """Raises if the FTS index is damaged or (against_content) disagrees with the memories table.
    The comparison only holds while nothing is archived: archived rows leave the index on purpose."""
    conn.execute("INSERT INTO memories_fts(memories_fts, rank) VALUES ('integrity-check', ?)", (int(against_content),))


async def test_scrubbed_forget_leaves_no_recoverable_text(engine, tmp_path):
    secret = "sertraline4711"
    memory_id = await engine.remember(NewMemory(f"Ana takes {secret} daily", "personal", owner_id=1))
    await engine.remember(NewMemory("the weather is mild", "personal", owner_id=2))
    await engine.forget([memory_id], scrub=True)
    await engine.write(fts_integrity_check)
    blobs = await engine.write(lambda conn: [row[0] for row in conn.execute("SELECT block FROM memories_fts_data")])
    assert not any(secret.encode() in bytes(blob or b"") for blob in blobs)
    path = engine.settings.db_path
    await engine.close()
    for file in (path, path.with_name(path.name + "-wal")):
        if file.exists():
            assert secret.encode() not in file.read_bytes(), f"{secret} recoverable from {file.name}"


async def test_archive_keeps_the_row_but_leaves_the_indexes(engine):
    a = await engine.remember(NewMemory("the zebra lives in the zoo", "personal", owner_id=1))
    await engine.archive(a, "decayed")
    after = await engine.write(counts, a)
    assert after["memories"] == 1 and after["fts_match"] == 0 and after["vectors"] == 0
    await engine.write(fts_integrity_check, False)
    memory = await engine.write(store.get, a)
    assert memory.archived_at is not None and memory.archive_reason == "decayed"
    await engine.restore(a)
    restored = await engine.write(counts, a)
    assert restored["fts_match"] == 1 and restored["vectors"] == 1


async def test_text_update_keeps_fts_in_sync(fts_engine):
    a = await fts_engine.remember(NewMemory("the zebra lives in the zoo", "personal", owner_id=1))

    def rename(conn):
        with conn:
            conn.execute("UPDATE memories SET text = 'the giraffe lives in the zoo' WHERE id = ?", (a,))
    await fts_engine.write(rename)
    assert (await fts_engine.recall("zebra", Viewer(1, dm=True))).ids == []
    assert (await fts_engine.recall("giraffe", Viewer(1, dm=True))).ids == [a]
    await fts_engine.write(fts_integrity_check)


@pytest.mark.usefixtures("backend")  # both storage backends
async def test_ids_are_never_reused(fts_engine):
    first = await fts_engine.remember(NewMemory("first", "global"))
    await fts_engine.forget([first])
    assert await fts_engine.remember(NewMemory("second", "global")) > first


async def test_a_failed_batch_writes_nothing(fts_engine):
    good = NewMemory("first fact", "personal", owner_id=1, external_id="dup")
    twin = NewMemory("second fact", "personal", owner_id=1, external_id="dup")  # violates UNIQUE
    with pytest.raises(apsw.ConstraintError):
        await fts_engine.remember_many([good, twin])
    stats = await fts_engine.stats()
    assert stats["memories"] == 0 and stats["links"] == 0
    assert await fts_engine.write(queries.query_value, "SELECT count(*) FROM memories_fts WHERE memories_fts MATCH 'fact'") == 0


async def test_links_are_pairwise_and_never_join_two_peoples_personal_memories(fts_engine):
    ids = await fts_engine.remember_many([NewMemory(f"fact {i}", "personal", owner_id=1) for i in range(3)])
    bobs = await fts_engine.remember(NewMemory("Bob's fact", "personal", owner_id=2))
    room = await fts_engine.remember(NewMemory("a room fact", "room", channel_id=5, guild_id=9))

    def link(conn):
        with conn:
            store.link_pairwise(conn, ids, "co_extracted")
            return store.add_link(conn, ids[0], bobs, "semantic"), store.add_link(conn, bobs, room, "semantic")
    assert await fts_engine.write(link) == (False, True)
    links = await fts_engine.write(lambda conn: conn.execute("SELECT source_id, target_id, kind FROM memory_links").fetchall())
    assert sorted(links) == [(ids[0], ids[1], "co_extracted"), (ids[0], ids[2], "co_extracted"),
                             (ids[1], ids[2], "co_extracted"), (bobs, room, "semantic")]


@pytest.mark.parametrize("text, problem", [("", "empty"), ("   \n", "empty"), ("x" * 4001, "limit")])
def test_bad_memory_text_is_refused_clearly(text, problem):
    with pytest.raises(ValueError, match=problem):
        NewMemory(text, "global")


@pytest.mark.parametrize("kwargs, problem", [
    (dict(scope="personal"), "owner"), (dict(scope="room"), "channel"), (dict(scope="team"), "scope"),
    (dict(scope="global", importance=1.5), "importance"),
])
def test_bad_memory_fields_are_refused_clearly(kwargs, problem):
    with pytest.raises(ValueError, match=problem):
        NewMemory("a fact", **kwargs)


@pytest.mark.usefixtures("backend")  # both storage backends
async def test_odd_text_is_stored_verbatim(engine):
    text = "Ünïcödé 東京 🎉 <@123> @everyone \u202e rtl \"quotes\" 'single' NEAR(a b) x" + "y" * 3900
    memory_id = await engine.remember(NewMemory(text, "personal", owner_id=1))
    assert (await engine.get(memory_id)).text == text.strip()


async def test_vectors_are_partitioned_by_visibility_key(engine):
    await engine.remember(NewMemory("a fact", "room", channel_id=5, guild_id=1))
    info = await engine.write(vectors.index_info)
    assert await engine.write(queries.query_one, "SELECT vis_key FROM vec_memories") == ("r:5",)
    assert await engine.write(queries.query_value, "SELECT partition00 FROM vec_memories_chunks") == "r:5"
    assert info.model == "nomic-embed-text" and info.dim == 768


@pytest.mark.usefixtures("backend")  # both storage backends
async def test_listing_never_touches(fts_engine):
    memory_id = await fts_engine.remember(NewMemory("a fact", "personal", owner_id=1))
    await fts_engine.list_visible(Viewer(1, dm=True))
    await fts_engine.get_visible(Viewer(1, dm=True), memory_id)
    memory = await fts_engine.get(memory_id)
    assert (memory.access_count, memory.last_accessed) == (0, None)


async def test_a_delete_that_fails_halfway_removes_nothing(engine):
    keep = await engine.remember(NewMemory("the zebra lives in the zoo", "personal", owner_id=1))
    blocker = await engine.remember(NewMemory("a protected fact", "personal", owner_id=1))
    await engine.write(lambda conn: conn.execute(
        f"CREATE TEMP TRIGGER refuse BEFORE DELETE ON memories WHEN old.id = {blocker} "
        "BEGIN SELECT RAISE(ABORT, 'refused'); END"))
    with pytest.raises(apsw.ConstraintError):
        await engine.forget([keep, blocker])
    assert await engine.write(counts, keep) == {"memories": 1, "fts_match": 1, "vectors": 1, "links": 0, "sources": 0}


async def test_a_plain_forget_is_scrubbed_by_the_next_maintenance(engine):
    from bot.lifecycle.maintenance import run_maintenance
    secret = "oxycodone9182"
    memory_id = await engine.remember(NewMemory(f"Ben takes {secret} at night", "personal", owner_id=1))
    await engine.remember(NewMemory("the weather is mild", "personal", owner_id=2))
    assert await engine.forget([memory_id]) == 1                         # one `/memory forget`: no rewrite now

    def fts_blobs(conn) -> list[bytes]:
        return [bytes(row[0] or b"") for row in conn.execute("SELECT block FROM memories_fts_data")]
    assert any(secret.encode() in blob for blob in await engine.write(fts_blobs))  # FTS5 keeps it until a merge
    await run_maintenance(engine, use_llm=False)
    assert not any(secret.encode() in blob for blob in await engine.write(fts_blobs))
    assert not await engine.finish_scrub()                               # done: nothing left for the next run
    await engine.write(fts_integrity_check)


async def test_a_failed_scrub_keeps_its_mark_for_the_next_run(engine, monkeypatch):
    memory_id = await engine.remember(NewMemory("Ben takes oxycodone9182 at night", "personal", owner_id=1))
    await engine.forget([memory_id])

    def broken(conn) -> None:
        raise apsw.IOError("disk gone for a moment")
    monkeypatch.setattr(store, "scrub", broken)
    with pytest.raises(apsw.IOError):
        await engine.finish_scrub()
    monkeypatch.undo()
    assert await engine.finish_scrub()       # still marked: done now
    assert not await engine.finish_scrub()
