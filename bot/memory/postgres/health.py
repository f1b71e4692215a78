"""What `muninn doctor` reads of a PostgreSQL database: the server, its extensions, the schema, and who may read the memories."""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from bot.memory.postgres import ann, migrations
from bot.memory.postgres.backend import PostgresStorage
from bot.memory.postgres.connection import PgConnection

# The people's words: their text, their vectors (an embedding can be inverted back to much of
# its text), who asked Muninn to stop remembering them, who taught which room memory, and whose
# messages each of Muninn's replies answered from.
PRIVATE_TABLES = ("memories", "messages", "memory_vectors", "memory_pauses", "memory_teachers", "reply_context")

# Who besides the tables' owner may read them, one row each (role, table, column or NULL, how):
# SELECT granted on a table or on some of its columns (to a role, or to every role: PUBLIC;
# how NULL); members of pg_read_all_data (PostgreSQL 14+; to_regrole is NULL before it), which
# read every table without any grant; members of the owner role itself (`GRANT owner TO x`:
# x reads whatever the owner reads, by inheritance or SET ROLE). Superusers and the role Muninn
# connects as are the server's administration and Muninn itself: not listed.
_READERS_SQL = """
SELECT coalesce(r.rolname, 'PUBLIC'), c.relname, NULL, NULL
FROM pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) a LEFT JOIN pg_roles r ON r.oid = a.grantee
WHERE c.relnamespace = current_schema()::regnamespace AND c.relname = ANY(%(tables)s)
  AND a.grantee <> c.relowner AND a.privilege_type = 'SELECT'
UNION ALL
SELECT coalesce(r.rolname, 'PUBLIC'), c.relname, att.attname::text, NULL
FROM pg_class c JOIN pg_attribute att ON att.attrelid = c.oid AND att.attnum > 0 AND NOT att.attisdropped
CROSS JOIN LATERAL aclexplode(att.attacl) a LEFT JOIN pg_roles r ON r.oid = a.grantee
WHERE c.relnamespace = current_schema()::regnamespace AND c.relname = ANY(%(tables)s)
  AND a.grantee <> c.relowner AND a.privilege_type = 'SELECT'
UNION ALL
SELECT m.rolname, c.relname, NULL, 'pg_read_all_data'
FROM pg_class c JOIN pg_roles m ON pg_has_role(m.oid, to_regrole('pg_read_all_data'), 'MEMBER')
WHERE c.relnamespace = current_schema()::regnamespace AND c.relname = ANY(%(tables)s)
  AND NOT m.rolsuper AND m.oid <> c.relowner AND m.oid <> to_regrole('pg_read_all_data')
UNION ALL
SELECT m.rolname, c.relname, NULL, pg_get_userbyid(c.relowner)::text
FROM pg_class c JOIN pg_roles m ON pg_has_role(m.oid, c.relowner, 'MEMBER')
WHERE c.relnamespace = current_schema()::regnamespace AND c.relname = ANY(%(tables)s)
  AND NOT m.rolsuper AND m.oid <> c.relowner AND m.rolname <> current_user
ORDER BY 1, 2, 3
"""
# Default privileges of the owner role that grant SELECT on tables created later (every schema,
# or Muninn's): the tables a future migration creates would be readable as soon as they exist.
# One row each: (grantee, owner, schema or NULL for every schema).
_DEFAULT_READERS_SQL = """
SELECT coalesce(r.rolname, 'PUBLIC'), pg_get_userbyid(d.defaclrole)::text, n.nspname::text
FROM pg_default_acl d CROSS JOIN LATERAL aclexplode(d.defaclacl) a
LEFT JOIN pg_roles r ON r.oid = a.grantee LEFT JOIN pg_namespace n ON n.oid = d.defaclnamespace
WHERE d.defaclobjtype = 'r' AND a.privilege_type = 'SELECT' AND a.grantee <> d.defaclrole
  AND (d.defaclnamespace = 0 OR d.defaclnamespace = current_schema()::regnamespace)
  AND d.defaclrole = (SELECT relowner FROM pg_class WHERE oid = 'memories'::regclass)
ORDER BY 1, 3
"""

# The fix when pgvector is missing (CONTRIB_FIX, in migrations.py, when btree_gin is).
PGVECTOR_FIX = "CREATE EXTENSION vector (as a superuser), or install pgvector"

Reader = tuple[str, str, str | None, str | None]      # role, table, column, how (_READERS_SQL)
DefaultReader = tuple[str, str, str | None]           # role, owner, schema (_DEFAULT_READERS_SQL)


@contextmanager
def opened(url: str) -> Iterator[tuple[PostgresStorage, PgConnection]]:
    """The backend and a plain connection to it, closed after the block: never the writer's, so
    nothing is migrated. Failing to connect raises before the block: for the doctor, that is
    the finding."""
    storage = PostgresStorage(url)
    conn = storage.open_reader()
    try:
        yield storage, conn
    finally:
        storage.close(conn)


def server_version(conn: PgConnection) -> str | None:
    """The server's version, as it names it."""
    row = conn.pg.execute("SHOW server_version").fetchone()
    return str(row[0]) if row else None


def extension_version(conn: PgConnection, name: str) -> str | None:
    """The version of the extension `name` in this database, or None when it is not created."""
    row = conn.pg.execute("SELECT extversion FROM pg_extension WHERE extname = %s", (name,)).fetchone()
    return str(row[0]) if row else None


def btree_gin(conn: PgConnection) -> tuple[str | None, bool]:
    """btree_gin in this database: (its version, or None when it is not created; whether the
    server has it to create)."""
    row = conn.pg.execute("SELECT (SELECT extversion FROM pg_extension WHERE extname = 'btree_gin'), "
                          "EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'btree_gin')").fetchone()
    return (row[0] if row else None), bool(row and row[1])


def schema_version(conn: PgConnection) -> int:
    """The last migration applied (0: no Muninn tables yet)."""
    return migrations.schema_version(conn.pg)


def readers(conn: PgConnection) -> list[Reader]:
    """The roles other than the tables' owner that may read the people's words now (_READERS_SQL)."""
    return conn.pg.execute(_READERS_SQL, {"tables": list(PRIVATE_TABLES)}).fetchall()


def default_readers(conn: PgConnection) -> list[DefaultReader]:
    """The roles that will read the tables created from now on (_DEFAULT_READERS_SQL)."""
    return conn.pg.execute(_DEFAULT_READERS_SQL).fetchall()


def _quoted(role: str) -> str:
    return role if role == "PUBLIC" else f'"{role}"'


def revokes(rows: Sequence[Reader], later: Sequence[DefaultReader] = ()) -> list[str]:
    """The statements that take the reading away, each with who may run it (revoking SELECT on
    a table revokes its column grants too; a membership is revoked from the role that grants it)."""
    def quoted(roles: set[str]) -> str:
        return ", ".join(_quoted(role) for role in sorted(roles))
    granted = {role for role, _, _, how in rows if how is None}
    fixes = []
    if granted:
        fixes.append(f"REVOKE SELECT ON {', '.join(PRIVATE_TABLES)} FROM {quoted(granted)} (as the tables' owner)")
    for how in sorted({how for _, _, _, how in rows if how is not None}):
        members = {role for role, _, _, h in rows if h == how}
        fixes.append(f"REVOKE {_quoted(how)} FROM {quoted(members)} (as a role that may: a superuser)")
    for owner, schema in sorted({(owner, schema or "") for _, owner, schema in later}):
        roles = {role for role, o, s in later if (o, s or "") == (owner, schema)}
        where = f" IN SCHEMA {schema}" if schema else ""
        fixes.append(f"ALTER DEFAULT PRIVILEGES FOR ROLE {_quoted(owner)}{where} REVOKE SELECT ON TABLES "
                     f"FROM {quoted(roles)} (as that role or a superuser)")
    return fixes


def ann_indexes(conn: PgConnection) -> tuple[int, int, int]:
    """The big keys' own HNSW indexes (postgres/ann.py): (valid, left invalid by a failed build, bytes)."""
    return ann.summary(conn)
