"""`muninn doctor --fix` on PostgreSQL (the embedded server): what it checks there, what --fix
repairs (stored values, as on SQLite), and that it says what it cannot do: grants (the
counterpart of SQLite's file modes) are listed with the REVOKE to run, never changed."""
from __future__ import annotations

import json
import os
import socket
import time

import psycopg
import pytest

from bot.cli import main as cli
from bot.memory.postgres.health import PRIVATE_TABLES
from bot.memory.sql import leases

pytestmark = pytest.mark.parametrize("backend", ["postgresql"], indirect=True)

OLLAMA_CHECKS = ("ollama", "chat model", "embedding model")
READER = f"muninn_doctor_reader_{os.getpid()}"   # roles are the whole server's: one per test session


@pytest.fixture
def doctor(backend, monkeypatch, capsys, tmp_path):
    monkeypatch.chdir(tmp_path)
    for key in list(os.environ):
        if key.startswith(("MUNINN_", "OLLAMA_")):
            monkeypatch.delenv(key)
    monkeypatch.setenv("MUNINN_DATABASE_URL", backend)
    monkeypatch.setenv("OLLAMA_URL", "")

    def run(*args: str) -> tuple[bool, dict[str, dict]]:
        """(every database check passed, the checks by name); Ollama is off here (its checks fail)."""
        capsys.readouterr()  # what earlier commands printed
        cli.main(["doctor", "--json", *args])
        found = {c["check"]: c for c in json.loads(capsys.readouterr().out)["checks"]}
        return all(c["ok"] for name, c in found.items() if name not in OLLAMA_CHECKS), found
    return run


def sql(url: str, *statements: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement.encode())


def the_fixes_it_names_work(doctor, backend: str, fix: str) -> None:
    """Run each statement of a permissions check's fix (without the '--fix changes no grants'
    tail): the doctor is content after them."""
    statements = fix.removeprefix("if they should not: ").split("; ")
    for statement in statements[:-1]:
        sql(backend, statement.split(" (as ")[0])
    healthy, found = doctor()
    assert healthy and "only the owner" in found["permissions"]["detail"], found["permissions"]


def readers_found(doctor) -> tuple[str, str]:
    """The doctor's permissions check when it must find readers: (detail, fix)."""
    healthy, found = doctor()
    assert not healthy and not found["permissions"]["ok"]
    return found["permissions"]["detail"], found["permissions"]["fix"]


def test_fix_clamps_values_lists_grants_it_leaves_and_says_what_it_cannot_do(doctor, backend):
    assert cli.main(["remember", "otters hold hands", "--scope", "global"]) == 0
    sql(backend, "UPDATE memories SET last_accessed = 1e300, stability = 0 WHERE id = 1",
        f"CREATE ROLE {READER}", f"GRANT SELECT ON memories TO {READER}", "GRANT SELECT ON messages TO PUBLIC")
    try:
        healthy, found = doctor()
        assert not healthy and not found["stored values"]["ok"] and not found["permissions"]["ok"]
        assert f"{READER} may read memories" in found["permissions"]["detail"]
        assert "PUBLIC may read messages" in found["permissions"]["detail"]
        revoke = f'REVOKE SELECT ON {", ".join(PRIVATE_TABLES)} FROM PUBLIC, "{READER}"'
        assert revoke in found["permissions"]["fix"]
        assert "--fix on PostgreSQL" not in found                       # said only when asked to fix

        healthy, found = doctor("--fix")
        assert not healthy                                                # the grants are still there
        assert found["stored values"]["ok"] and found["stored values"]["detail"].startswith("clamped 2 values")
        assert not found["permissions"]["ok"] and "--fix changes no grants" in found["permissions"]["fix"]
        limits = found["--fix on PostgreSQL"]["detail"]
        assert "clamped stored values only" in limits and "changes no grants" in limits and "migrate" in limits
        with psycopg.connect(backend) as conn:                          # unchanged: the grant is the admin's call
            assert conn.execute("SELECT has_table_privilege(%s, 'memories', 'SELECT')", (READER,)).fetchone() == (True,)

        sql(backend, f"REVOKE SELECT ON memories FROM {READER}", "REVOKE SELECT ON messages FROM PUBLIC")
        _, found = doctor("--fix")   # (the memory has no vector: Ollama is off; --fix does not embed)
        assert not found["vector index"]["ok"] and found["vector index"]["fix"] == "muninn maintain"
        assert found["stored values"]["ok"] and found["permissions"]["ok"] and "only the owner" in found["permissions"]["detail"]
    finally:
        sql(backend, f"REVOKE ALL ON memories FROM {READER}", "REVOKE ALL ON messages FROM PUBLIC",
            f"DROP ROLE IF EXISTS {READER}")


def test_grants_on_vectors_or_columns_and_members_of_pg_read_all_data_are_readers(doctor, backend):
    """Embeddings can be inverted back to text, a column grant reads the words as well as a
    table's, and pg_read_all_data reads every table without any grant."""
    assert cli.main(["stats"]) == 0
    columns, everything = f"{READER}_columns", f"{READER}_all"
    sql(backend, f"CREATE ROLE {READER}", f"CREATE ROLE {columns}", f"CREATE ROLE {everything}",
        f"GRANT SELECT ON memory_vectors TO {READER}", f"GRANT SELECT (id, text) ON memories TO {columns}",
        f"GRANT SELECT (role) ON messages TO {columns}", f"GRANT pg_read_all_data TO {everything}")
    try:
        detail, fix = readers_found(doctor)
        assert f"{READER} may read memory_vectors;" in detail
        assert f"{columns} may read memories (id, text), messages (role)" in detail
        assert f"{everything} may read every table (a member of pg_read_all_data)" in detail
        assert f'REVOKE SELECT ON {", ".join(PRIVATE_TABLES)} FROM "{READER}", "{columns}"' in fix
        assert f'REVOKE "pg_read_all_data" FROM "{everything}"' in fix

        the_fixes_it_names_work(doctor, backend, fix)
    finally:
        sql(backend, f"REVOKE ALL ON memories, messages, memory_vectors FROM {READER}, {columns}",
            f"DROP ROLE IF EXISTS {READER}", f"DROP ROLE IF EXISTS {columns}", f"DROP ROLE IF EXISTS {everything}")


def test_members_of_the_owner_role_default_privileges_and_who_paused_are_readers(doctor, backend):
    """`GRANT owner TO x` reads every table the owner reads; default privileges make the tables of a
    future migration readable; the list of people who paused Muninn is theirs too. Each is named with
    a statement that takes it away, and running those statements leaves the doctor content."""
    assert cli.main(["stats"]) == 0
    member, later, pauses = f"{READER}_member", f"{READER}_later", f"{READER}_pauses"
    with psycopg.connect(backend) as conn:
        row = conn.execute("SELECT pg_get_userbyid(relowner) FROM pg_class WHERE oid = 'memories'::regclass").fetchone()
        assert row is not None
        owner = row[0]
    sql(backend, f"CREATE ROLE {member}", f"CREATE ROLE {later}", f"CREATE ROLE {pauses}",
        f'GRANT "{owner}" TO {member}', f"ALTER DEFAULT PRIVILEGES GRANT SELECT ON TABLES TO {later}",
        f"GRANT SELECT ON memory_pauses TO {pauses}")
    try:
        detail, fix = readers_found(doctor)
        assert f'{member} may read every table (a member of the tables\' owner role "{owner}")' in detail
        assert f"{pauses} may read memory_pauses" in detail
        assert f'{later} will read the tables created from now on (default privileges of "{owner}"' in detail
        assert f'REVOKE "{owner}" FROM "{member}"' in fix
        assert f'ALTER DEFAULT PRIVILEGES FOR ROLE "{owner}" REVOKE SELECT ON TABLES FROM "{later}"' in fix

        the_fixes_it_names_work(doctor, backend, fix)
    finally:
        sql(backend, f"ALTER DEFAULT PRIVILEGES REVOKE ALL ON TABLES FROM {later}",
            f"REVOKE ALL ON memory_pauses FROM {pauses}", f'REVOKE "{owner}" FROM {member}',
            *(f"DROP ROLE IF EXISTS {role}" for role in (member, later, pauses)))


def test_doctor_names_a_dead_maintenance_run_that_still_holds_the_lease(doctor, backend):
    assert cli.main(["stats"]) == 0
    dead = f"{socket.gethostname()}:999999999:abcdef@{leases._place()}"   # this machine, no such pid
    with psycopg.connect(backend, autocommit=True) as conn:
        conn.execute("INSERT INTO meta (key, value) VALUES ('lease.maintenance', %s)",
                     (json.dumps({"holder": dead, "expires": time.time() + 90}),))
    healthy, found = doctor()
    assert healthy, found
    assert f"held by {dead}, a process of this machine that is gone" in found["maintenance"]["detail"]


def test_doctor_counts_the_big_keys_vector_indexes_and_names_an_invalid_one(doctor, backend):
    import numpy as np

    from bot.memory.postgres.backend import PostgresStorage
    from bot.memory.records import NewMemory
    from bot.memory.vector_indexes import carried_out, planned
    assert cli.main(["stats"]) == 0
    healthy, found = doctor()
    assert healthy and "no visibility key has its own vector index" in found["key indexes"]["detail"]
    storage = PostgresStorage(backend)
    conn = storage.open_writer()
    try:
        rng = np.random.default_rng(1)
        vecs = rng.standard_normal((40, 8))
        storage.insert(conn, [NewMemory(f"memory {i}", "global") for i in range(40)], base_stability_days=7,
                       model="m", vecs=(vecs / np.linalg.norm(vecs, axis=1)[:, None]).tolist(), now=1000.0)
        job = planned(conn, 20)
        assert job is not None and carried_out(job, 0) == (1, 0)
    finally:
        conn.close()
    healthy, found = doctor()
    assert "1 visibility key(s)" in found["key indexes"]["detail"] and found["key indexes"]["ok"]
    sql(backend, "UPDATE pg_index SET indisvalid = false WHERE indexrelid IN (SELECT oid FROM pg_class "
                 "WHERE starts_with(relname, 'memory_vectors_ann_'))")
    healthy, found = doctor()
    assert not found["key indexes"]["ok"] and "left invalid" in found["key indexes"]["detail"]
    assert "muninn maintain" in found["key indexes"]["fix"]
