"""Memories removed by another process: this one's cached word counts go (bot/memory/sql/removals.py).

A process caches how many memories hold a word (fts.py, postgres/keywords.py) and forgets the
counts when it removes memories itself. Here the removal runs in a second process (a child
Python with its own engine on the same SQLite file or PostgreSQL database), so nothing in this
process is told: only the `removed_memories` counter in the meta table."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bot.memory.engine import Engine
from bot.memory.postgres import keywords
from bot.memory.recall import keywords as shared_keywords
from bot.memory.records import NewMemory
from bot.memory.scope import Viewer
from bot.memory.sql import removals
from bot.memory.sqlite import fts
from tests.helpers import ALICE, CHANNEL, GUILD

pytestmark = pytest.mark.usefixtures("backend")

ROOT = Path(__file__).resolve().parents[3]
VIEWER = Viewer(ALICE, CHANNEL, GUILD)

_REMOVE = """
import asyncio, sys
from bot.memory.engine import Engine
from bot.memory.storage import storage_of
from bot.settings import load_settings

async def main(path, url, how, ids):
    settings = load_settings({"MUNINN_DB_PATH": path, "MUNINN_DATABASE_URL": url, "OLLAMA_URL": "",
                              "MUNINN_MAINTENANCE_HOURS": "0"})
    async with Engine(settings, warm=False) as engine:
        def remove(conn):
            storage = storage_of(conn)
            if how == "delete":
                storage.delete(conn, ids)
            else:
                for memory_id in ids:
                    storage.archive(conn, memory_id, "faded")
        await engine.write(remove)

asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], [int(i) for i in sys.argv[4:]]))
"""


def remove_in_another_process(settings, how: str, ids: list[int]) -> None:
    done = subprocess.run([sys.executable, "-c", _REMOVE, str(settings.db_path), settings.database_url, how,
                           *map(str, ids)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def cached_count(settings, word: str) -> int | None:
    """The count of `word` this process would use now (None: not cached, it counts again)."""
    if settings.database_url:
        hit = keywords._counts.get(settings.database_url, {}).get(word)
    else:
        hit = shared_keywords._counts.get(str(settings.db_path), {}).get(word)
    return None if hit is None else hit[0]


@pytest.mark.parametrize("how", ["delete", "archive"])
async def test_memories_removed_by_another_process_leave_no_stale_word_count(make_settings, how):
    settings = make_settings()
    async with Engine(settings, warm=False) as engine:
        zebras = [await engine.remember(NewMemory(f"the zebra number {i} grazes", "global")) for i in range(3)]
        await engine.remember(NewMemory("a lion sleeps", "global"))
        for _ in range(2):  # the first read of the counter forgets what was counted before it
            assert (await engine.recall("zebra", VIEWER, touch=False)).ids
        assert cached_count(settings, "zebra") == 3

        remove_in_another_process(settings, how, zebras)
        assert removals.KEY in {key for key, in await engine.read(
            lambda conn: conn.execute("SELECT key FROM meta").fetchall())}
        # SQLite reads the counter before counting; PostgreSQL with the keyword statement, for
        # the next recall: by the second recall the count is the one after the removal
        for _ in range(2):
            assert not (await engine.recall("zebra", VIEWER, touch=False)).ids
        assert cached_count(settings, "zebra") in (None, 0)


def test_the_counter_moves_by_the_memories_removed_and_its_own_moves_are_not_forgotten_twice():
    forgotten: list[int | None] = []
    removals.observe("db-a", None, forgotten.append)          # first read: whatever was counted before goes
    removals.observe("db-a", None, forgotten.append)          # unchanged: nothing
    removals.observe("db-a", 4, forgotten.append)             # another process removed 4
    removals.seen_own("db-a", 6, 2)                           # this one removed 2 (and forgot its counts itself)
    removals.observe("db-a", 6, forgotten.append)
    removals.observe("db-a", 1, forgotten.append)             # went back (a restored database): all go
    assert forgotten == [None, 4, None]


@pytest.mark.parametrize("backend", ["postgresql"], indirect=True)
async def test_a_removal_inside_a_longer_transaction_counts_after_its_commit_and_not_on_rollback(make_settings):
    """Inside a caller's transaction (a fact write's supersede, a maintenance batch of archives)
    the counter's row is not touched until the outermost commit: another process's removal never
    waits for that row meanwhile; a rollback counts nothing."""
    import psycopg

    from bot.memory.sql.transactions import write_transaction
    from bot.memory.storage import storage_of
    settings = make_settings()
    async with Engine(settings, warm=False) as engine:
        ids = [await engine.remember(NewMemory(f"the zebra number {i} grazes", "global")) for i in range(3)]

        def counter() -> int:
            with psycopg.connect(settings.database_url, autocommit=True) as other:
                row = other.execute("SELECT value FROM meta WHERE key = %s", (removals.KEY,)).fetchone()
                return int(row[0]) if row else 0

        def archive_then(conn, memory_id: int, fail: bool) -> None:
            with write_transaction(conn):
                storage_of(conn).archive(conn, memory_id, "faded")
                with psycopg.connect(settings.database_url, autocommit=True) as other:
                    other.execute("SET lock_timeout = '2s'")   # the row is free: another removal goes on
                    other.execute("INSERT INTO meta (key, value) VALUES (%s, '0') ON CONFLICT (key) DO UPDATE "
                                  "SET value = meta.value", (removals.KEY,))
                if fail:
                    raise RuntimeError("the caller's transaction fails")

        before = counter()
        await engine.write(archive_then, ids[0], False)
        assert counter() == before + 1
        with pytest.raises(RuntimeError):
            await engine.write(archive_then, ids[1], True)
        assert counter() == before + 1
        assert (await engine.get_many([ids[1]]))[ids[1]].archived_at is None   # rolled back whole


async def test_counts_are_forgotten_after_the_outer_commit_not_before(make_settings):
    """A removal inside a caller's transaction (a take-back inside an edit, a supersede inside a
    fact write): a recall on another connection before that commit still sees the removed
    memories and counts them again; the counts go once the commit is done, so no stale count is
    left (forgetting them at the removal left the recount cached)."""
    from bot.memory.sql.transactions import write_transaction
    from bot.memory.storage import storage_of
    settings = make_settings()
    async with Engine(settings, warm=False) as engine:
        zebras = [await engine.remember(NewMemory(f"the zebra number {i} grazes", "global")) for i in range(3)]
        reader = engine.storage.open_reader()
        count = keywords.doc_count if settings.database_url else fts.doc_count
        try:
            def delete_then_recount(conn) -> int | None:
                with write_transaction(conn):
                    storage_of(conn).delete(conn, zebras)
                    count(reader, "zebra", 100)   # a recall meanwhile: it still sees them
                    return cached_count(settings, "zebra")
            assert await engine.write(delete_then_recount) == 3
            assert cached_count(settings, "zebra") is None   # gone with the commit
            assert count(reader, "zebra", 100) == 0
        finally:
            engine.storage.close(reader)


@pytest.mark.sqlite_only("SQLite's own list of jobs (PostgreSQL's: test_a_removal_inside_a_longer_transaction...)")
def test_jobs_after_a_commit_run_once_it_is_done_and_never_after_a_rollback(tmp_path):
    from bot.memory.sql.transactions import after_commit
    from bot.memory.sqlite import db
    conn = db.connect(tmp_path / "m.db")
    ran: list[str] = []
    with db.write_transaction(conn):
        with db.write_transaction(conn):                     # a savepoint: still waits for the outer commit
            after_commit(conn, lambda: ran.append("committed"))
        assert ran == []
    assert ran == ["committed"]
    with pytest.raises(RuntimeError):
        with db.write_transaction(conn):
            after_commit(conn, lambda: ran.append("rolled back"))
            raise RuntimeError
    with db.write_transaction(conn):
        pass
    after_commit(conn, lambda: ran.append("outside"))        # no transaction: at once
    assert ran == ["committed", "outside"]
    conn.close()
