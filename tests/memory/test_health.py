"""What `muninn doctor` reads of a database, through the memory layer's health functions."""
from __future__ import annotations

import apsw
import pytest

from bot.memory import records
from bot.memory.engine import Engine
from bot.memory.errors import DatabaseError
from bot.memory.sql import health
from bot.memory.sqlite import health as sqlite_health
from bot.memory.sqlite.migrations import MIGRATIONS, schema_version

pytestmark = pytest.mark.usefixtures("backend")  # the portable count on SQLite and PostgreSQL


async def test_unembedded_count_is_active_memories_without_a_vector(make_settings):
    async with Engine(make_settings(""), warm=False) as engine:   # no Ollama: nothing gets a vector
        ids = [await engine.remember(records.NewMemory(f"otters {n}", "global", owner_id=1)) for n in range(3)]
        assert await engine.read(health.unembedded_count) == 3
        await engine.archive(ids[0], "decayed")
        assert await engine.read(health.unembedded_count) == 2


def test_sqlite_opened_migrates_a_new_file_and_closes_it(tmp_path):
    path = tmp_path / "new.db"
    with sqlite_health.opened(path) as conn:
        assert schema_version(conn) == len(MIGRATIONS)
        assert sqlite_health.vec_version(conn).startswith("v")
        assert sqlite_health.quick_check(conn) == "ok"
    with pytest.raises(apsw.ConnectionClosedError):
        conn.execute("SELECT 1")


def test_sqlite_opened_raises_before_the_block_for_a_file_that_is_not_a_database(tmp_path):
    path = tmp_path / "notes.db"
    path.write_text("not a database, just some notes\n" * 200)
    entered = False
    with pytest.raises(DatabaseError, match="is not a SQLite database"):
        with sqlite_health.opened(path):
            entered = True
    assert not entered


@pytest.mark.parametrize("backend", ["postgresql"], indirect=True)
def test_postgres_facts_of_a_migrated_database(backend):
    from bot.memory.postgres import health as postgres_health
    from bot.memory.postgres.migrations import MIGRATIONS as PG_MIGRATIONS
    with postgres_health.opened(backend) as (storage, conn):
        assert storage.where().startswith("postgresql://")
        assert (postgres_health.server_version(conn) or "").split(".")[0].isdigit()
        assert postgres_health.extension_version(conn, "vector") is not None
        assert postgres_health.extension_version(conn, "no_such_extension") is None
        installed, available = postgres_health.btree_gin(conn)
        assert installed is not None and available
        assert postgres_health.schema_version(conn) == len(PG_MIGRATIONS)
        assert postgres_health.readers(conn) == [] and postgres_health.default_readers(conn) == []
    assert conn.pg.closed


def test_revokes_name_each_grant_membership_and_default_privilege_once():
    from bot.memory.postgres.health import PRIVATE_TABLES, revokes
    rows = [("PUBLIC", "messages", None, None), ("reader", "memories", "text", None),
            ("member", "memories", None, "owner"), ("member", "messages", None, "owner"),
            ("everyone", "memories", None, "pg_read_all_data")]
    later = [("later", "owner", None), ("soon", "owner", "public")]
    assert revokes(rows, later) == [
        f'REVOKE SELECT ON {", ".join(PRIVATE_TABLES)} FROM PUBLIC, "reader" (as the tables\' owner)',
        'REVOKE "owner" FROM "member" (as a role that may: a superuser)',
        'REVOKE "pg_read_all_data" FROM "everyone" (as a role that may: a superuser)',
        'ALTER DEFAULT PRIVILEGES FOR ROLE "owner" REVOKE SELECT ON TABLES FROM "later" (as that role or a superuser)',
        'ALTER DEFAULT PRIVILEGES FOR ROLE "owner" IN SCHEMA public REVOKE SELECT ON TABLES FROM "soon" '
        "(as that role or a superuser)"]
    assert revokes([], []) == []
