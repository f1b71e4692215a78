"""`muninn doctor`: check each part Muninn depends on and say what to run to fix it."""
from __future__ import annotations

from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING

from bot.cli.checks import Check
from bot.cli.llm_doctor import embedding_size, llm_checks
from bot.memory.connection import Connection
from bot.memory.sql import health, leases, repair
from bot.memory.sqlite import db, files
from bot.memory.sqlite import health as sqlite_health
from bot.memory.sqlite import vec0 as vectors
from bot.memory.sqlite.migrations import MIGRATIONS, schema_version
from bot.redact import redact
from bot.settings import Settings

if TYPE_CHECKING:  # psycopg is optional: bot.memory.postgres is imported where it is used
    from bot.memory.postgres.health import DefaultReader, Reader


def database_checks(settings: Settings, *, fix: bool = False, embed_dim: int | None = None) -> list[Check]:
    """With `fix`, also repair what can be repaired safely: clamp nonsense stored values and make
    the database files private. `embed_dim`: the size of the embedding server's vectors, when known."""
    if settings.database_url:
        return postgres_checks(settings, fix, embed_dim)
    checks: list[Check] = []
    with ExitStack() as stack:
        try:
            conn = stack.enter_context(sqlite_health.opened(settings.db_path))
        except Exception as exc:  # any failure to open is the finding itself
            return [Check("database", False, str(exc), "point MUNINN_DB_PATH (or --db) at a writable file")]
        checks.append(permission_check(Path(settings.db_path), fix))
        checks.append(stored_values_check(conn, fix))
        checks.append(Check("sqlite-vec", True, f"{sqlite_health.vec_version(conn)} loaded from {db.vec_path()}"))
        integrity = sqlite_health.quick_check(conn)
        checks.append(Check("database", integrity == "ok",
                            f"{settings.db_path}: schema {schema_version(conn)}/{len(MIGRATIONS)}, integrity {integrity}",
                            "" if integrity == "ok" else "restore the file from a backup"))
        checks.append(vector_check(settings, vectors.index_info(conn), health.unembedded_count(conn), embed_dim))
        holder = leases.holder_of(conn, "maintenance")
        if holder is not None:  # a running bot (one of several shard processes) does the periodic maintenance
            checks.append(maintenance_check(holder))
    return checks


def maintenance_check(holder: str) -> Check:
    """Who runs the periodic maintenance (the holder of its lease), and whether that process is gone."""
    if leases.abandoned(holder):
        return Check("maintenance", True, f"the maintenance lease is held by {holder}, a process of this machine "
                                          "that is gone (killed?): the next `muninn maintain` takes it over at once, "
                                          "the bot when it expires")
    return Check("maintenance", True, f"periodic maintenance is run by {holder}")


def ann_check(valid: int, invalid: int, size: int, minimum: int) -> Check:
    """The HNSW indexes maintenance made for the big visibility keys (PostgreSQL): how many, their
    size, and any a cancelled or failed build left invalid (the next maintenance run remakes them)."""
    if invalid:
        return Check("key indexes", False, f"{invalid} vector index(es) of big visibility keys left invalid by a "
                                           "cancelled or failed build (searched exactly meanwhile)",
                     "muninn maintain (drops and makes them again; if it fails again, its log line says why)")
    if not valid:
        return Check("key indexes", True, "no visibility key has its own vector index" + (
            " (MUNINN_VECTOR_INDEX_MIN=0)" if minimum == 0 else f" (none of {minimum:,} vectors or more yet, "
                                                                  "or maintenance has not run since)"))
    return Check("key indexes", True, f"{valid} visibility key(s) of {minimum:,} vectors or more have their own "
                                      f"vector index ({size / 2**20:,.0f} MiB)")


MIGRATE_FIX = "muninn stats (any Muninn command that opens the database applies the missing migrations)"


def postgres_checks(settings: Settings, fix: bool = False, embed_dim: int | None = None) -> list[Check]:
    """The same findings for a PostgreSQL database (MUNINN_DATABASE_URL): reachable and migrated,
    pgvector and btree_gin present, sane stored values (repair.RULES, as on SQLite; --fix clamps them), vectors
    for every active memory, which roles may read the people's words (the counterpart of the file
    modes), who maintains it. A check changes nothing else: it opens a plain connection, never
    the writer's, so it does not migrate; it says what to run instead. `fix` clamps the stored
    values and says what it does not do on PostgreSQL (POSTGRES_FIX_LIMITS)."""
    from bot.memory.postgres import health as postgres_health
    from bot.memory.postgres.migrations import MIGRATIONS as PG_MIGRATIONS
    with ExitStack() as stack:
        try:
            storage, conn = stack.enter_context(postgres_health.opened(settings.database_url))
        except Exception as exc:
            return [Check("database", False, redact(str(exc), settings.secrets()),
                          "start the PostgreSQL server, or fix MUNINN_DATABASE_URL (unset it to use SQLite)")]
        vector = postgres_health.extension_version(conn, "vector")
        checks = [Check("pgvector", vector is not None, f"pgvector {vector or 'missing'}",
                        "" if vector else postgres_health.PGVECTOR_FIX)]
        checks.append(btree_gin_check(*postgres_health.btree_gin(conn)))
        version, latest = postgres_health.schema_version(conn), len(PG_MIGRATIONS)
        described = (f"{storage.where()}: PostgreSQL {postgres_health.server_version(conn) or '?'}, "
                     f"schema {version}/{latest}")
        if version > latest:
            return checks + [Check("database", False, f"{described}: newer than this Muninn", "upgrade Muninn")]
        if version < latest:
            state = "no Muninn tables yet" if version == 0 else "older than this Muninn"
            return checks + [Check("database", False, f"{described}: {state}", MIGRATE_FIX)]
        checks += [Check("database", True, described), stored_values_check(conn, fix)]
        checks.append(vector_check(settings, storage.index_info(conn), health.unembedded_count(conn), embed_dim))
        checks.append(ann_check(*postgres_health.ann_indexes(conn), settings.vector_index_min))
        rows, later = postgres_health.readers(conn), postgres_health.default_readers(conn)
        checks.append(grants_check(rows, later, postgres_health.revokes(rows, later)))
        holder = storage.lease_holder(conn, "maintenance")
        if holder is not None:
            checks.append(maintenance_check(holder))
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


def grants_check(rows: Sequence[Reader], later: Sequence[DefaultReader], revokes: Sequence[str]) -> Check:
    """PostgreSQL's counterpart of the file modes: the roles other than the tables' owner that may
    read the people's words now (`rows`) or in the tables created later (`later`), with the
    statements that take it away (`revokes`)."""
    if not rows and not later:
        return Check("permissions", True, "only the owner of Muninn's tables may read the memories, their vectors "
                                          "and the messages (and the server's superusers)")
    said = "; ".join(part for part in (describe_readers(rows), describe_default_readers(later)) if part)
    return Check("permissions", False, f"other roles can read your memories: {said}",
                 "if they should not: " + "; ".join(revokes) + "; --fix changes no grants on PostgreSQL")


def describe_readers(rows: Sequence[Reader]) -> str:
    """'PUBLIC may read messages; "x" may read memories (content), memory_vectors; "y" may read
    every table (a member of pg_read_all_data)', from the rows of postgres.health.readers."""
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
    """Who will read the tables a future migration creates, from the rows of postgres.health.default_readers."""
    roles = sorted({role for role, _, _ in rows})
    if not roles:
        return ""
    owner = rows[0][1]
    return (f"{', '.join(roles)} will read the tables created from now on "
            f'(default privileges of "{owner}": a future migration\'s tables)')


def vector_check(settings: Settings, info: vectors.IndexInfo | None, missing: int,
                 embed_dim: int | None = None) -> Check:
    """The vectors: made with the configured embedding model, of the size the embedding server
    returns (`embed_dim`, when known), and one for every active memory."""
    if info is not None and info.model != settings.embed_model:
        return Check("vector index", False,
                     f"vectors made with {info.model!r}, OLLAMA_EMBED_MODEL is {settings.embed_model!r}", "muninn reindex")
    if info is not None and embed_dim is not None and embed_dim != info.dim:
        return Check("vector index", False, f"the index holds {info.dim}-dimensional vectors of {info.model}, the "
                                            f"embedding server returns {embed_dim}-dimensional ones",
                     "muninn reindex (or point the embedding settings back at a server whose model gives "
                     f"{info.dim} dimensions)")
    detail = (f"{info.model}, {info.dim} dimensions" if info else "no vectors yet") + \
        f"; {missing} active memories without a vector"
    return Check("vector index", missing == 0, detail, "" if missing == 0 else "muninn maintain")


def permission_check(db_path: Path, fix: bool) -> Check:
    """The database files readable by their owner only (with `fix`, made so)."""
    loose = files.loose_modes(db_path)
    if loose and fix:
        files.tighten_modes(db_path)
        return Check("permissions", True, f"made private: {'; '.join(loose)}")
    if loose:
        return Check("permissions", False, f"other users can read your memories: {'; '.join(loose)}",
                     f"muninn doctor --fix (or chmod 600 {db_path}* and chmod 700 {db_path.parent}); "
                     "keep .env private too (chmod 600 .env)")
    return Check("permissions", True, "database files readable by their owner only")


def stored_values_check(conn: Connection, fix: bool) -> Check:
    """No nonsense stored values (repair.RULES; with `fix`, clamped)."""
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
    """Every LLM server (chat and embeddings, either kind) reachable, with its models (bot/cli/llm_doctor.py)."""
    return await llm_checks(settings)


async def run_doctor(settings: Settings, *, fix: bool = False) -> list[Check]:
    """Every check: the database's (off the event loop, told the size of the embedding server's
    vectors when it has the model), then the LLM servers'."""
    import asyncio
    llm = await ollama_checks(settings)
    dim = await embedding_size(settings, llm)
    database = await asyncio.to_thread(database_checks, settings, fix=fix, embed_dim=dim)
    return database + llm
