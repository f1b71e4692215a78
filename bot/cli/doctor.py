"""`muninn doctor`: check each part Muninn depends on and say what to run to fix it."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bot.llm.errors import OllamaError
from bot.llm.hosts import split_urls
from bot.llm.ollama import OllamaClient
from bot.memory.sql import leases, queries, repair
from bot.memory.sqlite import db, files
from bot.memory.sqlite import vec0 as vectors
from bot.memory.sqlite.migrations import MIGRATIONS, schema_version
from bot.settings import Settings


@dataclass
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""

    def to_dict(self) -> dict:
        return {"check": self.name, "ok": self.ok, "detail": self.detail, "fix": self.fix}


def database_checks(settings: Settings, *, fix: bool = False) -> list[Check]:
    """With `fix`, also repair what can be repaired safely: clamp nonsense stored values and make
    the database files private."""
    if settings.database_url:
        return postgres_checks(settings, fix)
    checks: list[Check] = []
    try:
        conn = db.connect(settings.db_path)
    except Exception as exc:  # any failure to open is the finding itself
        return [Check("database", False, str(exc), "point MUNINN_DB_PATH (or --db) at a writable file")]
    try:
        checks.append(permission_check(Path(settings.db_path), fix))
        checks.append(stored_values_check(conn, fix))
        version = conn.execute("SELECT vec_version()").fetchall()[0][0]
        checks.append(Check("sqlite-vec", True, f"{version} loaded from {db.vec_path()}"))
        integrity = conn.execute("PRAGMA quick_check").fetchall()[0][0]
        checks.append(Check("database", integrity == "ok",
                            f"{settings.db_path}: schema {schema_version(conn)}/{len(MIGRATIONS)}, integrity {integrity}",
                            "" if integrity == "ok" else "restore the file from a backup"))
        info = vectors.index_info(conn)
        missing = queries.query_value(conn, "SELECT count(*) FROM memories WHERE embedded = 0 AND archived_at IS NULL")
        checks.append(vector_check(settings, info, int(missing or 0)))
        holder = leases.holder_of(conn, "maintenance")
        if holder is not None:  # a running bot (one of several shard processes) does the periodic maintenance
            checks.append(maintenance_check(holder))
    finally:
        conn.close()
    return checks


def maintenance_check(holder: str) -> Check:
    if leases.abandoned(holder):
        return Check("maintenance", True, f"the maintenance lease is held by {holder}, a process of this machine "
                                          "that is gone (killed?): the next `muninn maintain` takes it over at once, "
                                          "the bot when it expires")
    return Check("maintenance", True, f"periodic maintenance is run by {holder}")


MIGRATE_FIX = "muninn stats (any Muninn command that opens the database applies the missing migrations)"


def postgres_checks(settings: Settings, fix: bool = False) -> list[Check]:
    """The same findings for a PostgreSQL database (MUNINN_DATABASE_URL): reachable and migrated,
    pgvector and btree_gin present, sane stored values (repair.RULES, as on SQLite; --fix clamps them), vectors
    for every active memory, which roles may read the people's words (the counterpart of the file
    modes), who maintains it. A check changes nothing else: it opens a plain connection, never
    the writer's, so it does not migrate; it says what to run instead. `fix` clamps the stored
    values and says what it does not do on PostgreSQL (POSTGRES_FIX_LIMITS)."""
    from bot.memory.postgres.backend import PostgresStorage
    from bot.memory.postgres.migrations import MIGRATIONS as PG_MIGRATIONS
    from bot.memory.postgres.migrations import schema_version as pg_schema_version
    storage = PostgresStorage(settings.database_url)
    try:
        conn = storage.open_reader()
    except Exception as exc:
        return [Check("database", False, str(exc),
                      "start the PostgreSQL server, or fix MUNINN_DATABASE_URL (unset it to use SQLite)")]
    try:
        server = conn.pg.execute("SHOW server_version").fetchone()
        vector = conn.pg.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'").fetchone()
        checks = [Check("pgvector", vector is not None, f"pgvector {vector[0] if vector else 'missing'}",
                        "" if vector else "CREATE EXTENSION vector (as a superuser), or install pgvector")]
        gin = conn.pg.execute("SELECT (SELECT extversion FROM pg_extension WHERE extname = 'btree_gin'), "
                              "EXISTS (SELECT 1 FROM pg_available_extensions WHERE name = 'btree_gin')").fetchone()
        checks.append(btree_gin_check(gin[0] if gin else None, bool(gin and gin[1])))
        version, latest = pg_schema_version(conn.pg), len(PG_MIGRATIONS)
        described = f"{storage.where()}: PostgreSQL {server[0] if server else '?'}, schema {version}/{latest}"
        if version > latest:
            return checks + [Check("database", False, f"{described}: newer than this Muninn", "upgrade Muninn")]
        if version < latest:
            state = "no Muninn tables yet" if version == 0 else "older than this Muninn"
            return checks + [Check("database", False, f"{described}: {state}", MIGRATE_FIX)]
        checks += [Check("database", True, described), stored_values_check(conn, fix)]
        info = storage.index_info(conn)
        row = conn.execute("SELECT count(*) FROM memories WHERE embedded = 0 AND archived_at IS NULL").fetchone()
        checks.append(vector_check(settings, info, int(row[0]) if row else 0))
        checks.append(grants_check(conn))
        holder = storage.lease_holder(conn, "maintenance")
        if holder is not None:
            checks.append(maintenance_check(holder))
    finally:
        storage.close(conn)
    if fix:
        checks.append(Check("--fix on PostgreSQL", True, POSTGRES_FIX_LIMITS))
    return checks


def btree_gin_check(installed: str | None, available: bool) -> Check:
    """btree_gin: the keyword index is GIN over (vis_key, text_search) (PostgreSQL migration 14),
    which a plain column in a GIN index needs. A server whose contrib modules are missing lacks it."""
    from bot.memory.postgres.migrations import CONTRIB_FIX
    if installed is not None:
        return Check("btree_gin", True, f"btree_gin {installed}")
    if available:
        return Check("btree_gin", True, "btree_gin available on the server (Muninn's migration 14 creates it)")
    return Check("btree_gin", False, "btree_gin missing on the server (Muninn's keyword index needs it)", CONTRIB_FIX)


# What `muninn doctor --fix` cannot do on PostgreSQL, said once at the end of its report.
POSTGRES_FIX_LIMITS = ("--fix clamped stored values only: on PostgreSQL it changes no grants (who may read the "
                       "memories is the server's roles: see permissions), creates no extension and does not migrate, "
                       "embed or reindex; run the fix each failed check names")
# The people's words: their text, their vectors (an embedding can be inverted back to much of
# its text), and who asked Muninn to stop remembering them.
PRIVATE_TABLES = ("memories", "messages", "memory_vectors", "memory_pauses")

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

Reader = tuple[str, str, str | None, str | None]      # role, table, column, how (_READERS_SQL)
DefaultReader = tuple[str, str, str | None]           # role, owner, schema (_DEFAULT_READERS_SQL)


def grants_check(conn) -> Check:
    """PostgreSQL's counterpart of the file modes: the roles other than the tables' owner that may
    read the people's words now (_READERS_SQL) or in the tables created later
    (_DEFAULT_READERS_SQL), with the statements that take it away."""
    rows = conn.pg.execute(_READERS_SQL, {"tables": list(PRIVATE_TABLES)}).fetchall()
    later = conn.pg.execute(_DEFAULT_READERS_SQL).fetchall()
    if not rows and not later:
        return Check("permissions", True, "only the owner of Muninn's tables may read the memories, their vectors "
                                          "and the messages (and the server's superusers)")
    said = "; ".join(part for part in (describe_readers(rows), describe_default_readers(later)) if part)
    return Check("permissions", False, f"other roles can read your memories: {said}",
                 revoke_readers(rows, later) + "; --fix changes no grants on PostgreSQL")


def _quoted(role: str) -> str:
    return role if role == "PUBLIC" else f'"{role}"'


def describe_readers(rows: Sequence[Reader]) -> str:
    """'PUBLIC may read messages; "x" may read memories (content), memory_vectors; "y" may read
    every table (a member of pg_read_all_data)', from _READERS_SQL's rows."""
    tables: dict[str, dict[str, list[str]]] = {}   # role -> table -> its granted columns ([]: all of it)
    through: dict[str, str] = {}                   # role -> the role it reads every table as a member of
    for role, table, column, how in rows:
        if how is not None:
            through.setdefault(role, how)
            continue
        columns = tables.setdefault(role, {}).setdefault(table, [])
        if column is None:
            columns.insert(0, "")   # the whole table: its column grants add nothing
        elif not columns or columns[0] != "":
            columns.append(column)
    said = []
    for role in sorted(tables.keys() | through.keys()):
        if role in through:
            how = through[role]
            what = "pg_read_all_data" if how == "pg_read_all_data" else f'the tables\' owner role "{how}"'
            said.append(f"{role} may read every table (a member of {what})")
            continue
        said.append(f"{role} may read " + ", ".join(
            table if cols[0] == "" else f"{table} ({', '.join(cols)})" for table, cols in tables[role].items()))
    return "; ".join(said)


def describe_default_readers(rows: Sequence[DefaultReader]) -> str:
    roles = sorted({role for role, _, _ in rows})
    if not roles:
        return ""
    owner = rows[0][1]
    return (f"{', '.join(roles)} will read the tables created from now on "
            f'(default privileges of "{owner}": a future migration\'s tables)')


def revoke_readers(rows: Sequence[Reader], later: Sequence[DefaultReader] = ()) -> str:
    """The statements that take the reading away (revoking SELECT on a table revokes its column
    grants too; a membership is revoked from the role that grants it)."""
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
    return "if they should not: " + "; ".join(fixes)


def vector_check(settings: Settings, info: vectors.IndexInfo | None, missing: int) -> Check:
    if info is not None and info.model != settings.embed_model:
        return Check("vector index", False,
                     f"vectors made with {info.model!r}, OLLAMA_EMBED_MODEL is {settings.embed_model!r}", "muninn reindex")
    detail = (f"{info.model}, {info.dim} dimensions" if info else "no vectors yet") + \
        f"; {missing} active memories without a vector"
    return Check("vector index", missing == 0, detail, "" if missing == 0 else "muninn maintain")


def permission_check(db_path: Path, fix: bool) -> Check:
    loose = files.loose_modes(db_path)
    if loose and fix:
        files.tighten_modes(db_path)
        return Check("permissions", True, f"made private: {'; '.join(loose)}")
    if loose:
        return Check("permissions", False, f"other users can read your memories: {'; '.join(loose)}",
                     f"muninn doctor --fix (or chmod 600 {db_path}* and chmod 700 {db_path.parent}); "
                     "keep .env private too (chmod 600 .env)")
    return Check("permissions", True, "database files readable by their owner only")


def stored_values_check(conn, fix: bool) -> Check:
    bad = repair.find_bad_rows(conn)
    if not bad:
        return Check("stored values", True, "every memory has sane times, stability and sources")
    listing = "; ".join(f"{what}: {len(ids)} (#{', #'.join(map(str, ids[:5]))}{', ...' if len(ids) > 5 else ''})"
                        for what, ids in bad.items())
    if fix:
        changed = repair.fix_bad_rows(conn)
        return Check("stored values", True, f"clamped {changed} values: {listing}")
    return Check("stored values", False, listing, "muninn doctor --fix (clamps them; recall and export show them "
                                                  "clamped meanwhile)")


async def ollama_checks(settings: Settings) -> list[Check]:
    if not settings.ollama_url:
        return [Check("ollama", False, "OLLAMA_URL is empty: recall is keyword-only and Muninn cannot chat",
                      "set OLLAMA_URL=http://localhost:11434 in .env")]
    urls = split_urls(settings.ollama_url)
    checks: list[Check] = []
    for url in urls:  # every host: a reply or an embedding may go to any of them
        checks += await host_checks(settings.replace(ollama_url=url), "" if len(urls) == 1 else f" {url}")
    return checks


async def host_checks(settings: Settings, suffix: str) -> list[Check]:
    """Reachable, and both models pulled, for one Ollama host (`suffix` names it among several)."""
    async with OllamaClient.from_settings(settings) as client:
        try:
            names = await client.model_names()
        except OllamaError as exc:
            return [Check("ollama" + suffix, False, str(exc), "start Ollama with `ollama serve`, or fix OLLAMA_URL")]
        checks = [Check("ollama" + suffix, True, f"reachable at {settings.ollama_url}")]
        for role, model in (("chat model", settings.chat_model), ("embedding model", settings.embed_model)):
            wanted = {model, f"{model}:latest"}
            present = any(name in wanted for name in names)
            checks.append(Check(role + suffix, present, f"{model} {'is' if present else 'is not'} pulled",
                                "" if present else f"ollama pull {model}" + (f" (on{suffix})" if suffix else "")))
    return checks


async def run_doctor(settings: Settings, *, fix: bool = False) -> list[Check]:
    import asyncio
    database = await asyncio.to_thread(database_checks, settings, fix=fix)
    return database + await ollama_checks(settings)
