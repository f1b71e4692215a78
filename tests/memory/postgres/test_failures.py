"""Failures of a whole PostgreSQL database, on the real embedded server: `bot.memory.errors.explain` names
them in one line that says what to fix, so the touch batch (bot/memory/recall/touches.py) does not
retry request by request what fails for every request alike."""
from __future__ import annotations

import asyncio
import time

import psycopg

from bot.memory import errors as database_errors
from bot.memory.engine import Engine
from bot.memory.records import NewMemory
from tests.postgres_fixtures import TEMPLATE

READ_ONLY_DB = "muninn_read_only"


def counting_runs(engine: Engine) -> list[int]:
    """How many writer jobs the touch batcher runs (one per batch, one per retried request)."""
    runs: list[int] = []
    batcher = engine._touches
    real_run = batcher._run

    async def run(requests):
        runs.append(len(requests))
        return await real_run(requests)
    batcher._run = run  # type: ignore[method-assign]
    return runs


def terminate_sessions(url: str) -> int:
    """pg_terminate_backend for every other session of the database (what a restart does to them)."""
    with psycopg.connect(url, autocommit=True) as admin:
        return len(admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                 "WHERE datname = current_database() AND pid <> pg_backend_pid()").fetchall())


async def touch_three(engine: Engine) -> tuple[list[int], list[dict]]:
    ids = [await engine.remember(NewMemory(f"the {t} lessons on tuesday", "personal", owner_id=7))
           for t in ("kayak", "violin", "pottery")]
    results = await asyncio.gather(*(engine._touches.touch_and_load([i], [i], time.time()) for i in ids))
    return ids, results


async def test_a_server_that_refuses_writes_fails_the_touch_batch_once_with_one_line(
        postgres_server, make_settings, caplog):
    """A failover to a read-only standby: after the server dropped our sessions, the new ones
    may read but not write. Every request's touch would fail alike: no retry of each."""
    url = postgres_server.create_database(READ_ONLY_DB, template=TEMPLATE)
    try:
        async with Engine(make_settings("", MUNINN_DATABASE_URL=url)) as engine:
            ids = [await engine.remember(NewMemory(f"the {t} lessons on tuesday", "personal", owner_id=7))
                   for t in ("kayak", "violin", "pottery")]
            with psycopg.connect(url, autocommit=True) as admin:
                admin.execute(f"ALTER DATABASE {READ_ONLY_DB} SET default_transaction_read_only = on".encode())
            assert await asyncio.to_thread(terminate_sessions, url) >= 1
            runs = counting_runs(engine)
            with caplog.at_level("WARNING", logger="bot.memory"):
                results = await asyncio.gather(*(engine._touches.touch_and_load([i], [i], time.time())
                                                 for i in ids))
            assert [list(r) for r in results] == [[i] for i in ids]   # every recall has its memories
            assert runs == [3]                                         # the batch, and no request alone
            [warning] = [r.getMessage() for r in caplog.records if "could not count" in r.getMessage()]
            assert "3 of 3 recalls" in warning and "PostgreSQL refuses writes" in warning
            assert "MUNINN_DATABASE_URL at the primary" in warning and "\n" not in warning
    finally:
        with psycopg.connect(postgres_server.url(), autocommit=True) as admin:
            admin.execute(f"ALTER DATABASE {READ_ONLY_DB} RESET default_transaction_read_only".encode())
        postgres_server.drop_database(READ_ONLY_DB)


async def test_a_full_server_disk_fails_the_touch_batch_once_with_one_line(make_settings, postgres_url, caplog):
    """The server answers SQLSTATE 53100 (disk_full), as it does when it cannot extend a table
    file; raised here by a trigger, the rest is the real server and driver."""
    with psycopg.connect(postgres_url, autocommit=True) as admin:
        admin.execute(b"CREATE OR REPLACE FUNCTION disk_full() RETURNS trigger LANGUAGE plpgsql AS "
                      b"$$ BEGIN RAISE EXCEPTION 'could not extend file: No space left on device' "
                      b"USING ERRCODE = 'disk_full'; END $$")
        admin.execute(b"CREATE TRIGGER disk_full BEFORE UPDATE OF access_count ON memories "
                      b"FOR EACH ROW EXECUTE FUNCTION disk_full()")
    try:
        async with Engine(make_settings("", MUNINN_DATABASE_URL=postgres_url)) as engine:
            runs = counting_runs(engine)
            with caplog.at_level("WARNING", logger="bot.memory"):
                ids, results = await touch_three(engine)
            assert [list(r) for r in results] == [[i] for i in ids]
            assert runs == [3]
            assert [(await engine.get(i)).access_count for i in ids] == [0, 0, 0]
            [warning] = [r.getMessage() for r in caplog.records if "could not count" in r.getMessage()]
            assert "the PostgreSQL server's disk is full: free space" in warning
    finally:
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            admin.execute(b"DROP TRIGGER IF EXISTS disk_full ON memories")


async def test_a_refusal_of_one_request_is_still_retried_request_by_request(make_settings, postgres_url):
    """The contrast: an error of one transaction (here a refused row) is not the whole database's."""
    with psycopg.connect(postgres_url, autocommit=True) as admin:
        admin.execute(b"CREATE OR REPLACE FUNCTION refuse_one() RETURNS trigger LANGUAGE plpgsql AS "
                      b"$$ BEGIN RAISE EXCEPTION 'this touch is refused'; END $$")
        admin.execute(b"CREATE TRIGGER refuse_one BEFORE UPDATE OF access_count ON memories "
                      b"FOR EACH ROW WHEN (NEW.id = 2) EXECUTE FUNCTION refuse_one()")
    try:
        async with Engine(make_settings("", MUNINN_DATABASE_URL=postgres_url)) as engine:
            runs = counting_runs(engine)
            ids, _ = await touch_three(engine)
            assert runs == [3, 1, 1, 1]
            assert [(await engine.get(i)).access_count for i in ids] == [1, 0, 1]
    finally:
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            admin.execute(b"DROP TRIGGER IF EXISTS refuse_one ON memories")


def test_each_whole_database_error_has_its_line_and_one_transactions_errors_none():
    errors = psycopg.errors
    for error in (errors.DiskFull, errors.OutOfMemory, errors.TooManyConnections, errors.AdminShutdown,
                  errors.CrashShutdown, errors.CannotConnectNow, errors.ReadOnlySqlTransaction,
                  errors.DataCorrupted, errors.IndexCorrupted, errors.IoError, errors.InsufficientPrivilege,
                  errors.ConnectionFailure):
        line = database_errors.explain(error("x"))
        assert line and "\n" not in line and ":" in line, error  # what happened: what to do
    assert "connection to PostgreSQL was lost (server closed the connection unexpectedly)" in (
        database_errors.explain(psycopg.OperationalError("server closed the connection unexpectedly\n\tThis probably ...")) or "")
    for error in (errors.DeadlockDetected, errors.SerializationFailure, errors.LockNotAvailable,
                  errors.QueryCanceled, errors.UniqueViolation, errors.PipelineAborted):
        assert database_errors.explain(error("x")) is None, error
    lookalike = type("OperationalError", (Exception,), {"__module__": "psycopg2.errors"})
    assert database_errors.explain(lookalike("server closed the connection")) is None   # another driver's error is not psycopg's
