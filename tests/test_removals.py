"""Memories removed by another process: this one's cached word counts go (bot/memory/removals.py).

A process caches how many memories hold a word (fts.py, postgres/keywords.py) and forgets the
counts when it removes memories itself. Here the removal runs in a second process (a child
Python with its own engine on the same SQLite file or PostgreSQL database), so nothing in this
process is told: only the `removed_memories` counter in the meta table."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bot.memory import fts, removals
from bot.memory.engine import Engine
from bot.memory.postgres import keywords
from bot.memory.scope import Viewer
from bot.memory.store import NewMemory
from tests.helpers import ALICE, CHANNEL, GUILD

pytestmark = pytest.mark.usefixtures("backend")

ROOT = Path(__file__).resolve().parent.parent
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
        hit = fts._counts.get(str(settings.db_path), {}).get(word)
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
