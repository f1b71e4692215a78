"""`muninn migrate --to postgresql://...` against the real embedded PostgreSQL server."""
from __future__ import annotations

import hashlib
from pathlib import Path

import psycopg
import pytest

from bot.cli.main import main
from bot.memory import records
from bot.memory.engine import Engine
from bot.memory.postgres.copy import Interrupted, MigrationError, copy_database
from bot.memory.scope import Viewer
from bot.memory.sql import history, options, store
from tests.postgres_server import free_port

ALICE, BOB, CAROL = 1001, 1002, 1003
GUILD, ROOM, OTHER_ROOM = 500, 600, 601
VIEWERS = [Viewer(ALICE, dm=True), Viewer(BOB, dm=True), Viewer(ALICE, channel_id=ROOM, guild_id=GUILD),
           Viewer(CAROL, channel_id=OTHER_ROOM, guild_id=GUILD), Viewer(9999, dm=True)]
QUERIES = ["what does alice like to eat", "the raid schedule", "bob's cat", "favourite colour", "rust compiler"]
TOPICS = ["likes sushi and ramen", "raid is on friday at nine", "has a cat called Pixel", "favourite colour is teal",
          "is learning the rust compiler", "plays the cello", "lives near the harbour", "hates cold coffee"]


async def build_source(settings) -> dict:
    """A SQLite database with every table in use, a deleted memory (so AUTOINCREMENT's high
    mark is above the largest id) and an archived one."""
    async with Engine(settings) as engine:
        ids = []
        for n, topic in enumerate(TOPICS):
            ids.append(await engine.remember(records.NewMemory(f"Alice {topic}", "personal", owner_id=ALICE,
                                                             source_message_ids=[7000 + n])))
            ids.append(await engine.remember(records.NewMemory(f"Bob {topic}", "personal", owner_id=BOB, guild_id=GUILD,
                                                             mentions=[ALICE, CAROL] if n % 2 else [])))
            ids.append(await engine.remember(records.NewMemory(f"The room says {topic}", "room", owner_id=CAROL,
                                                             channel_id=ROOM, guild_id=GUILD)))
        ids.append(await engine.remember(records.NewMemory("Muninn is a raven", "global", owner_id=1)))
        await engine.write(store.add_link, ids[0], ids[3], "semantic", 0.8)
        await engine.write(store.add_link, ids[2], ids[5], "co_extracted")
        await engine.archive(ids[4], "decayed")
        # room memories under moderation: a claim waiting, one approved (logged), the mode set (logged)
        ids.append(await engine.remember(records.NewMemory("The room says bring snacks", "room", owner_id=BOB,
                                                           channel_id=ROOM, guild_id=GUILD, standing=records.PENDING)))
        ids.append(await engine.remember(records.NewMemory("The room says the quiz is at nine", "room", owner_id=BOB,
                                                           channel_id=ROOM, guild_id=GUILD, standing=records.PENDING)))
        await engine.rooms.approve(ids[-1], channel_id=ROOM, guild_id=GUILD, moderator_id=CAROL)
        await engine.rooms.set_mode(GUILD, "open", moderator_id=CAROL, channel_id=ROOM)
        await engine.console.record("export-user", user_id=CAROL)  # the operator's console log
        last = await engine.remember(records.NewMemory("a memory that gets deleted", "global", owner_id=1))
        await engine.forget([last])
        for n in range(12):
            await engine.write(history.record, channel_id=ROOM, guild_id=GUILD, author_id=ALICE, author_name="alice",
                               role="user", content=f"message {n}", message_id=7000 + n)
        await engine.write(history.record, channel_id=ROOM, guild_id=GUILD, author_id=1, author_name="Muninn",
                           role="assistant", content="a reply", message_id=7100, reply_to_author=BOB,
                           context_authors=[ALICE, BOB])
        await engine.write(options.set_channel_option, ROOM, GUILD, "answer", "every")
        await engine.pause_memory(CAROL)
        stats = await engine.stats()
    return {"ids": ids, "deleted": last, "stats": stats}


def file_state(path: Path) -> tuple[str, bool]:
    return hashlib.sha256(path.read_bytes()).hexdigest(), Path(f"{path}-wal").exists()


@pytest.fixture
async def source(make_settings, fake_ollama):
    settings = make_settings(fake_ollama.url)
    facts = await build_source(settings)
    return settings, facts


def rows(url: str, sql: str) -> list[tuple]:
    with psycopg.connect(url) as conn:
        return conn.execute(sql.encode()).fetchall()


async def test_full_copy_keeps_ids_counts_and_the_source(source, postgres_url, fake_ollama, make_settings):
    settings, facts = source
    before = file_state(settings.db_path)
    seen: list[tuple[int, int]] = []
    report = copy_database(settings.db_path, postgres_url, batch=5, on_progress=lambda d, t: seen.append((d, t)))
    assert report.ok, report.line()
    assert file_state(settings.db_path) == before  # opened read-only: not a byte changed
    assert report.counts["memories"] == (len(facts["ids"]) + 0, len(facts["ids"]))
    assert report.counts["memory_vectors"][0] == facts["stats"]["embedded"] > 0
    for table in ("memory_links", "messages", "channel_options", "memory_pauses", "memory_sources", "memory_mentions",
                  "guild_settings", "memory_approvals", "moderation_log", "memory_teachers", "reply_context",
                  "console_log"):
        assert report.counts[table][0] == report.counts[table][1] > 0, table
    assert seen and seen[-1][0] == seen[-1][1]
    assert sorted(r[0] for r in rows(postgres_url, "SELECT id FROM memories")) == sorted(facts["ids"])
    assert rows(postgres_url, "SELECT value FROM meta WHERE key = 'embed_model'") == [("nomic-embed-text",)]
    assert rows(postgres_url, "SELECT count(*) FROM pg_indexes WHERE indexname = 'memory_vectors_hnsw'") == [(0,)]
    assert rows(postgres_url, "SELECT count(*) FROM vector_changes") == [(0,)]  # no log of the copy: no cache needs it
    again = copy_database(settings.db_path, postgres_url)  # a rerun after success: nothing copied twice
    assert again.ok and again.resumed and sum(again.copied.values()) == 0
    # a new memory on PostgreSQL never takes the deleted memory's id (SQLite's AUTOINCREMENT high mark)
    async with Engine(make_settings(fake_ollama.url, MUNINN_DATABASE_URL=postgres_url), warm=False) as engine:
        new_id = await engine.remember(records.NewMemory("after the move", "global", owner_id=1))
        archived = await engine.get(facts["ids"][4])
        assert await engine.rooms.mode(GUILD) == "open"
        assert [item.memory.id for item in (await engine.rooms.pending(ROOM))[0]] == [facts["ids"][-2]]
        await engine.rooms.set_mode(GUILD, "moderated", moderator_id=CAROL, channel_id=ROOM)  # the log goes on
        assert [e.action for e in await engine.rooms.log(ROOM)] == ["mode:moderated", "mode:open", "approve"]
    assert new_id > facts["deleted"]
    assert archived.archived_at is not None and archived.archive_reason == "decayed"


def test_interrupted_copy_resumes_without_duplicates(source, postgres_url, capsys):
    settings, facts = source
    with pytest.raises(Interrupted):
        copy_database(settings.db_path, postgres_url, batch=4, stop_after_batches=3)
    partial = rows(postgres_url, "SELECT count(*) FROM memories")[0][0]
    assert partial == 12  # three committed batches of four
    # the copy turns the keyword index's fastupdate on; interrupted, it is off again (migration 13)
    assert rows(postgres_url, "SELECT reloptions FROM pg_class WHERE relname = 'memories_text_search'") == [
        (["fastupdate=off"],)]
    code = main(["migrate", "--db", str(settings.db_path), "--to", postgres_url, "--batch", "4"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert out.out.startswith(f"verified: memories {len(facts['ids'])},")
    assert rows(postgres_url, "SELECT count(*), count(DISTINCT id) FROM memories") == [(len(facts["ids"]),) * 2]


async def test_recall_on_the_copy_matches_sqlite(source, postgres_url, fake_ollama, make_settings):
    settings, _ = source
    assert copy_database(settings.db_path, postgres_url).ok
    results: dict[str, list[list[int]]] = {}
    # The copy holds the same memories, words and vectors: the same keyword hits (all of them:
    # each backend orders close ones by its own BM25) and the same vector ranking.
    for name, url in (("sqlite", ""), ("postgresql", postgres_url)):
        async with Engine(make_settings("", MUNINN_DATABASE_URL=url), warm=False) as engine:
            results[name] = [sorted(m.memory.id for m in (await engine.recall(q, v, touch=False, limit=50)).memories)
                             for v in VIEWERS for q in QUERIES]
        async with Engine(make_settings(fake_ollama.url, MUNINN_DATABASE_URL=url, MUNINN_FUSION="ranks",
                                        MUNINN_RRF_WEIGHT_FTS="0"), warm=False) as engine:
            results[name] += [[m.memory.id for m in (await engine.recall(q, v, touch=False)).memories]
                              for v in VIEWERS for q in QUERIES]
    assert results["postgresql"] == results["sqlite"]
    assert any(results["sqlite"])


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_refusals_are_one_line(source, postgres_url, postgres_server, capsys):
    settings, _ = source
    db = str(settings.db_path)
    code, out, err = run_cli(capsys, "migrate", "--db", db, "--to", "mysql://localhost/x")
    assert code == 1 and "postgresql://" in err and len(err.strip().splitlines()) == 1
    down = f"postgresql://postgres@127.0.0.1:{free_port()}/muninn"
    code, out, err = run_cli(capsys, "migrate", "--db", db, "--to", down)
    assert code == 1 and "cannot connect" in err and len(err.strip().splitlines()) == 1
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("INSERT INTO memories (text, scope, vis_key, stability, created_at, updated_at) "
                     "VALUES ('someone else''s', 'global', 'g', 1, 0, 0)")
    code, out, err = run_cli(capsys, "migrate", "--db", db, "--to", postgres_url)
    assert code == 1 and "not empty" in err and len(err.strip().splitlines()) == 1
    newer = postgres_server.create_database("muninn_migrate_newer", template="muninn_template")
    try:
        with psycopg.connect(newer, autocommit=True) as conn:
            conn.execute("UPDATE schema_version SET version = 99")
        code, out, err = run_cli(capsys, "migrate", "--db", db, "--to", newer)
        assert code == 1 and "newer" in err and len(err.strip().splitlines()) == 1
    finally:
        postgres_server.drop_database("muninn_migrate_newer")
    code, out, err = run_cli(capsys, "migrate", "--db", str(Path(db).with_name("none.db")), "--to", postgres_url)
    assert code == 1 and "no SQLite database" in err


async def test_text_postgresql_cannot_hold_is_repaired_and_counted(source, postgres_url):
    """SQLite keeps any bytes in a TEXT column (a bad byte from an old import, a NUL);
    PostgreSQL refuses both: they arrive as U+FFFD, counted, and the rest is unchanged."""
    settings, facts = source
    import apsw
    conn = apsw.Connection(str(settings.db_path))
    conn.execute("UPDATE messages SET content = CAST(? AS TEXT) WHERE id = 7001", (b"caf\xe9 au lait",))
    conn.execute("UPDATE messages SET author_name = ? WHERE id = 7002", ("al\x00ice",))
    conn.close()
    report = copy_database(settings.db_path, postgres_url)
    assert report.ok and report.repaired_texts == 2
    assert rows(postgres_url, "SELECT content FROM messages WHERE id = 7001") == [("caf\ufffd au lait",)]
    assert rows(postgres_url, "SELECT author_name FROM messages WHERE id = 7002") == [("al\ufffdice",)]
    assert rows(postgres_url, "SELECT content FROM messages WHERE id = 7003") == [("message 3",)]


async def test_a_lost_connection_is_one_line_and_the_rerun_finishes(source, postgres_url):
    settings, facts = source

    def cut(done: int, total: int) -> None:
        if done >= 8:  # after two committed batches the server drops the migrating connection
            with psycopg.connect(postgres_url, autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                              "WHERE datname = current_database() AND pid != pg_backend_pid()")
    with pytest.raises(MigrationError, match="run the same command again to continue") as caught:
        copy_database(settings.db_path, postgres_url, batch=4, on_progress=cut)
    assert "\n" not in str(caught.value)
    assert rows(postgres_url, "SELECT count(*) FROM memories") == [(8,)]
    report = copy_database(settings.db_path, postgres_url, batch=4)
    assert report.ok and report.resumed and report.counts["memories"] == (len(facts["ids"]),) * 2
