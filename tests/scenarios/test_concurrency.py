"""Several writers on one database file, and writers killed halfway: real `muninn` processes
(two imports, a maintain loop, kill -9) next to the bot's engine in this process. Nothing may
fail, nothing may be lost, and the file must stay whole. The figures come from
bench/reliability.py, which runs the same scenarios at a larger size."""
from __future__ import annotations

import threading
import time

import apsw
import pytest

from bench import reliability
from bot.memory.errors import DatabaseBusy
from bot.memory.sql import queries
from bot.memory.sql.transactions import write_transaction
from bot.memory.sqlite import db
from tests.fakes.ollama import FakeOllamaThread

# SQLite's file under several writers: its write lock, BEGIN IMMEDIATE, kill -9 and PRAGMA integrity_check
# (bench/reliability.py drives SQLite files). Two processes on PostgreSQL: test_processes.py,
# memory/postgres/test_backend.py (two engines writing at once) and bench/test_pg_speed.py (processes side by side).
pytestmark = pytest.mark.sqlite_only("SQLite's file locking and integrity under several writing processes")


@pytest.fixture(scope="module")
def ollama():
    with FakeOllamaThread() as fake:
        yield fake


def assert_clean(rows: list[reliability.Figures]) -> None:
    for row in rows:
        assert (row.failed, row.lost, row.tracebacks) == (0, 0, 0), row.row()


def test_two_imports_a_maintain_loop_and_the_bot_write_at_once(tmp_path, ollama):
    rows = reliability.concurrent_writers(tmp_path, lines=300, ops=25, ollama_url=ollama.url)
    assert_clean(rows)
    assert {row.scenario for row in rows} >= {"cli: import alpha", "cli: import beta", "bot: extracted facts",
                                              "bot: /memory remember", "bot: /memory forget"}
    assert all(row.tried for row in rows if row.scenario.startswith(("cli: import", "bot:")))
    assert reliability.integrity(tmp_path / "concurrent.db") == []


def test_kill_9_during_import_maintain_and_reindex_then_run_again(tmp_path, ollama):
    rows = reliability.kill_and_rerun(tmp_path, lines=400, ollama_url=ollama.url)
    assert_clean(rows)
    assert sum("killed" in row.notes[0] for row in rows) >= 2, [row.notes for row in rows]
    assert reliability.integrity(tmp_path / "kill.db") == []


def test_a_read_first_write_waits_for_the_lock_instead_of_failing(tmp_path):
    """The bug behind "database is locked": a deferred transaction that reads, then writes while
    another connection holds the lock, fails at once. write_transaction waits its turn."""
    path = tmp_path / "lock.db"
    holder, waiter = db.connect(path), db.connect(path)
    holder.execute("BEGIN IMMEDIATE")
    holder.execute("INSERT INTO meta(key, value) VALUES ('held', '1')")
    threading.Timer(0.5, lambda: holder.execute("COMMIT")).start()
    started = time.monotonic()
    with write_transaction(waiter):
        waiter.execute("SELECT count(*) FROM memories").fetchall()   # read first ...
        queries.set_meta(waiter, "after", "1")                              # ... then write
    assert time.monotonic() - started >= 0.4
    assert queries.get_meta(waiter, "held") == "1" and queries.get_meta(waiter, "after") == "1"


def test_a_lock_held_too_long_is_one_clear_error(tmp_path, monkeypatch):
    from bot.memory.sql import transactions
    monkeypatch.setattr(transactions, "LOCK_RETRIES", 1)
    monkeypatch.setattr(transactions, "BACKOFF_S", (0.01,))
    path = tmp_path / "lock.db"
    holder, waiter = db.connect(path), db.connect(path)
    waiter.set_busy_timeout(50)
    holder.execute("BEGIN IMMEDIATE")
    with pytest.raises(DatabaseBusy, match="locked by another process"):
        with write_transaction(waiter):
            pass
    holder.execute("ROLLBACK")
    assert not waiter.in_transaction


def test_nested_write_transactions_are_savepoints(tmp_path):
    conn = db.connect(tmp_path / "n.db")
    with write_transaction(conn):
        queries.set_meta(conn, "outer", "1")
        with pytest.raises(apsw.SQLError):
            with write_transaction(conn):
                queries.set_meta(conn, "inner", "1")
                conn.execute("SELECT no_such_function()")
    assert queries.get_meta(conn, "outer") == "1" and queries.get_meta(conn, "inner") is None
