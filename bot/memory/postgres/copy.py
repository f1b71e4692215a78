"""`muninn migrate`'s copy of a SQLite database into PostgreSQL: resumable, verified.

The source (bot/memory/sqlite/copy_source.py) is opened read-only and never changed; stop the
bot first, so that nothing is written to it during the copy. The target is migrated to the
same schema version and must be empty (or a copy of this same source that was cut short).

Every table is copied in key order, in batches; each batch is one transaction that also
records, in the target's meta table, the last key it copied (`migrate.cursor.<table>`).
A copy killed at any point (kill -9, Ctrl-C, a lost connection) therefore resumes with the
next batch when run again, and never duplicates a row (inserts are ON CONFLICT DO NOTHING
as well). Ids are copied as they are, so "#N" stays the memory it was; the memories id
sequence is moved past SQLite's AUTOINCREMENT high-water mark (ids of deleted memories are
not handed out again). Vectors are sent in pgvector's binary form; the embedding model is
recorded at the end. The copy ends with a check per table: row counts and a checksum of
the keys on both sides.

psycopg is imported where it is used: the command line imports this module without the
`postgres` extra installed.
"""
from __future__ import annotations

import hashlib
import json
import logging
import struct
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import apsw

from bot.memory.errors import DatabaseError, explain
from bot.memory.sql.queries import get_meta, set_meta
from bot.memory.sqlite import copy_source
from bot.memory.sqlite.copy_source import DATA_TABLES, TABLES, Table
from bot.memory.vectors.index import IndexInfo

if TYPE_CHECKING:
    from bot.memory.postgres.connection import PgConnection

log = logging.getLogger(__name__)

BATCH = 2000
SOURCE_KEY = "migrate.source"       # target meta: which SQLite file this database is a copy of
DONE_KEY = "migrate.done"           # target meta: when the copy was verified
CURSOR_PREFIX = "migrate.cursor."   # target meta: last key copied, per table


class MigrationError(Exception):
    """A reason to stop, said in one line (the target is left as the last committed batch)."""


class Interrupted(Exception):
    """Stopped on purpose after the requested number of batches (tests)."""


@dataclass
class Report:
    """What a copy did and found: rows copied by this run, texts repaired, and per table the
    rows on both sides after it."""
    copied: dict[str, int] = field(default_factory=dict)   # rows inserted by this run, per table
    repaired_texts: int = 0                                 # invalid UTF-8 / NUL characters replaced
    resumed: bool = False
    counts: dict[str, tuple[int, int]] = field(default_factory=dict)  # table -> (source, target)
    mismatched: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """Every table has the same rows on both sides."""
        return not self.mismatched

    def line(self) -> str:
        """The outcome in one line."""
        tables = ", ".join(f"{name} {source}" for name, (source, _) in self.counts.items())
        if self.ok:
            return f"verified: {tables} (row counts and key checksums match) in {self.seconds:.1f} s"
        wrong = "; ".join(f"{name}: source {self.counts[name][0]}, target {self.counts[name][1]}"
                          + ("" if self.counts[name][0] != self.counts[name][1] else " (different keys)")
                          for name in self.mismatched)
        return (f"MISMATCH after the copy: {wrong}; if the source was written to meanwhile, stop the bot and run "
                "the command again (a target the bot already writes to has rows the source lacks)")


@dataclass
class _Run:
    """One run's progress across the tables: rows done of the total, batches committed."""
    batch: int
    stop_after_batches: int | None
    on_progress: Callable[[int, int], None] | None
    total: int = 0
    done: int = 0
    batches: int = 0

    def committed(self, rows: int) -> None:
        """A batch of `rows` is committed: say so, and stop here when asked to."""
        self.done += rows
        self.batches += 1
        if self.on_progress:
            self.on_progress(min(self.done, self.total), self.total)
        if self.stop_after_batches is not None and self.batches >= self.stop_after_batches:
            raise Interrupted(f"stopped after {self.batches} batches")


# -- the target ------------------------------------------------------------------------

def _one_row(target: PgConnection, sql: str | bytes, params: Any = None) -> tuple:
    """The row of a statement that always returns one (a count, EXISTS, a catalog lookup)."""
    row = target.pg.execute(sql, params).fetchone()
    assert row is not None
    return row


def _vector_dumper(oid: int) -> type:
    """psycopg dumper sending a `Float32Vector` in pgvector's binary form (no float-to-text)."""
    from psycopg.adapt import Dumper
    from psycopg.pq import Format

    class VectorDumper(Dumper):
        format = Format.BINARY

        def dump(self, obj: Any) -> bytes:
            return bytes(obj.binary)
    VectorDumper.oid = oid
    return VectorDumper


class Float32Vector:
    """A stored SQLite vector (little-endian float32 bytes) as pgvector's binary value."""
    __slots__ = ("binary",)

    def __init__(self, raw: bytes, dim: int) -> None:
        count = len(raw) // 4
        if count != dim:
            raise MigrationError(f"a stored vector has {count} dimensions, the index {dim}")
        self.binary = struct.pack(">HH", dim, 0) + struct.pack(f">{dim}f", *struct.unpack(f"<{dim}f", raw))


def open_target(url: str) -> PgConnection:
    """The target, migrated to this Muninn's schema (one-line errors for a bad URL, a server
    that is down, a newer schema, no pgvector)."""
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme not in ("postgresql", "postgres") or not (parsed.netloc or parsed.query):
        raise MigrationError("--to must be a postgresql:// URL such as postgresql://muninn@localhost/muninn")
    try:
        from bot.memory.postgres.backend import PostgresStorage
    except ImportError as exc:
        raise MigrationError(f"PostgreSQL support is not installed ({exc.name}): pip install 'muninn-bot[postgres]'") from exc
    try:
        return PostgresStorage(url).open_writer()
    except DatabaseError as exc:
        raise MigrationError(str(exc)) from exc
    except RuntimeError as exc:  # migrations: the target's schema is newer than this Muninn
        raise MigrationError(f"target: {exc}") from exc


def claim_target(target: PgConnection, source_id: str) -> bool:
    """Refuse a target holding other data; mark it as this source's copy. Returns whether a
    previous copy of this source is being resumed."""
    with target.pg.transaction():
        # two copies at once: the second waits, then resumes
        target.pg.execute("LOCK TABLE meta IN SHARE ROW EXCLUSIVE MODE")
        claimed = get_meta(target, SOURCE_KEY)
        if claimed is not None and claimed != source_id:
            raise MigrationError(f"the target already holds a copy of another database ({claimed}); "
                                 "migrate into an empty PostgreSQL database")
        if claimed is None:
            busy = [name for name in DATA_TABLES
                    if _one_row(target, f"SELECT EXISTS (SELECT 1 FROM {name})".encode())[0]]
            if busy:
                raise MigrationError(f"the target database is not empty (rows in {', '.join(busy)}); "
                                     "migrate into an empty PostgreSQL database")
            set_meta(target, SOURCE_KEY, source_id)
        return claimed is not None


def _check_same_index(target: PgConnection, info: IndexInfo | None) -> None:
    """Refuse a target whose vectors are of another model or size than the source's."""
    model, dim = get_meta(target, "embed_model"), get_meta(target, "embed_dim")
    if info is not None and model is not None and (model, dim) != (info.model, str(info.dim)):
        raise MigrationError(f"the target's vector index is for {model} ({dim} dimensions), "
                             f"the source's for {info.model} ({info.dim}); migrate into an empty database")


def _register_vector_dumper(target: PgConnection) -> None:
    oid = _one_row(target, "SELECT 'vector'::regtype::oid")[0]
    target.pg.adapters.register_dumper(Float32Vector, _vector_dumper(int(oid)))


def _insert_sql(table: Table) -> bytes:
    values = ", ".join("%b" if name == "embedding" else "%s" for name in table.columns)
    return (f"INSERT INTO {table.name} ({', '.join(table.columns)}) VALUES ({values}) "
            f"ON CONFLICT DO NOTHING").encode()


def _insert_batch(target: PgConnection, sql: bytes, rows: list[tuple], cursor_key: str, last: list[Any]) -> None:
    """One batch and the last key it holds, in one transaction."""
    with target.pg.transaction():
        with target.pg.cursor() as cursor:
            cursor.executemany(sql, rows)
        set_meta(target, cursor_key, json.dumps(last))


def _set_fastupdate(target: PgConnection, on: bool) -> None:
    target.pg.execute(f"ALTER INDEX memories_text_search SET (fastupdate = {'on' if on else 'off'})")


def _fastupdate_off(target: PgConnection) -> None:
    """The keyword index back to migration 13's setting; on a broken connection the copy's own
    error is the one to report (the next migrate turns it off at its end)."""
    import psycopg
    try:
        _set_fastupdate(target, False)
    except psycopg.Error as exc:
        log.warning("could not turn the keyword index's fastupdate off: %s", exc)


def _move_identity(target: PgConnection, source: apsw.Connection) -> None:
    """The memories id sequence past every id SQLite ever handed out (AUTOINCREMENT keeps the
    highest even after that memory was deleted), never backwards."""
    sqlite_high = copy_source.autoincrement_high(source)
    sequence, copied_high, current = _one_row(
        target, "SELECT pg_get_serial_sequence('memories', 'id'), (SELECT coalesce(max(id), 0) FROM memories), "
        "coalesce(pg_sequence_last_value(pg_get_serial_sequence('memories', 'id')::regclass), 0)")
    high = max(sqlite_high, int(copied_high))
    if high > int(current):
        target.pg.execute("SELECT setval(%s::regclass, %s)", (sequence, high))


def _finish_table(target: PgConnection, source: apsw.Connection, table: Table) -> None:
    if table.name == "memories":
        _move_identity(target, source)
    if table.name in ("moderation_log", "console_log"):  # ids copied as they are: the next one follows them
        target.pg.execute(f"SELECT setval(pg_get_serial_sequence('{table.name}', 'id'), max(id)) FROM {table.name} "
                          "HAVING max(id) IS NOT NULL")
    if table.name == "memory_vectors":
        # `embedded` = a vector is there: a row whose vector was missing in SQLite gets embedded later
        target.pg.execute("UPDATE memories SET embedded = 0 WHERE embedded = 1 AND NOT EXISTS "
                          "(SELECT 1 FROM memory_vectors v WHERE v.memory_id = memories.id)")


def _record_model(target: PgConnection, info: IndexInfo, on_step: Callable[[str], None]) -> None:
    """The backend's own index_for records the model (no approximate index: migration 9)."""
    import psycopg
    on_step(f"recording the embedding model ({info.dim} dimensions)")
    # The trigger logged each copied vector for the vector caches (migration 8); no cache has
    # seen this database yet, and index_for starts a new epoch: the log is not needed.
    target.pg.execute("TRUNCATE vector_changes")
    try:
        target.storage.index_for(target, info.model, info.dim)
    except psycopg.Error as exc:
        raise MigrationError(f"recording the embedding model failed: {exc}") from exc


def vacuum(target: PgConnection) -> None:
    """Fresh statistics and visibility map for the big tables now, not when autovacuum gets
    round to it: without them the planner guesses each visibility key's row count."""
    target.pg.execute("VACUUM (ANALYZE) memories")
    target.pg.execute("VACUUM (ANALYZE) memory_vectors")


def _target_keys(target: PgConnection, table: Table) -> Iterator[tuple]:
    order = ", ".join(f'{k} COLLATE "C"' if k in ("kind", "message_id", "key") else k for k in table.key)
    with target.pg.cursor(name=f"keys_{table.name}") as cursor:  # server-side: streams (call inside a transaction)
        cursor.execute(f"SELECT {', '.join(table.key)} FROM {table.name} ORDER BY {order}".encode())
        for row in cursor:
            yield tuple(row)


def _digest(rows: Iterator[tuple]) -> tuple[int, str]:
    digest = hashlib.sha256()
    count = 0
    for row in rows:
        digest.update(repr(tuple(int(v) if isinstance(v, int) else v for v in row)).encode("utf-8", "surrogatepass"))
        count += 1
    return count, digest.hexdigest()


def _verify_meta(source: apsw.Connection, target: PgConnection, table: Table, report: Report) -> None:
    """meta: the copied keys present (the target adds keys of its own)."""
    wanted = [row[0] for row in copy_source.keys(source, table)]
    present = _one_row(target, "SELECT count(*) FROM meta WHERE key = ANY(%s)", (wanted,))[0]
    report.counts["meta"] = (len(wanted), int(present))
    if int(present) != len(wanted):
        report.mismatched.append("meta")


def verify(source: apsw.Connection, target: PgConnection, report: Report, info: IndexInfo | None) -> None:
    """Per table: the rows and a checksum of the keys, source against target (meta: the copied keys present)."""
    for table in TABLES:
        if table.name == "memory_vectors" and info is None:
            continue
        if table.name == "meta":
            _verify_meta(source, target, table, report)
            continue
        src = _digest(copy_source.keys(source, table))
        with target.pg.transaction():
            dst = _digest(_target_keys(target, table))
        report.counts[table.name] = (src[0], dst[0])
        if src != dst:
            report.mismatched.append(table.name)


# -- the copy --------------------------------------------------------------------------

def copy_database(source_path: Path, url: str, *, batch: int = BATCH, stop_after_batches: int | None = None,
                  on_progress: Callable[[int, int], None] | None = None,
                  on_step: Callable[[str], None] | None = None) -> Report:
    """Copy the SQLite file at `source_path` into the PostgreSQL database at `url`, resuming
    a copy of the same source that was cut short, and verify it. `on_progress(done, total)`
    sees rows, `on_step(what)` the slow steps after the copy; `stop_after_batches` raises
    Interrupted after that many committed batches."""
    import psycopg

    started = time.monotonic()
    report = Report()
    try:
        source = copy_source.open_source(source_path)
    except DatabaseError as exc:
        raise MigrationError(str(exc)) from exc
    try:
        target = open_target(url)
        try:
            _copy(source, target, str(source_path.resolve()), report, _Run(batch, stop_after_batches, on_progress),
                  on_step or (lambda what: None))
        except psycopg.Error as exc:  # a lost connection, a full disk on the server, ...
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise MigrationError(f"PostgreSQL: {reason}; the batches committed so far are kept: "
                                 "run the same command again to continue") from exc
        except apsw.Error as exc:
            raise MigrationError(f"reading {str(source_path)!r}: {explain(exc) or exc}") from exc
        finally:
            target.close()
    finally:
        source.close()
    report.seconds = time.monotonic() - started
    return report


def _copy(source: apsw.Connection, target: PgConnection, source_id: str, report: Report, run: _Run,
          on_step: Callable[[str], None]) -> None:
    """Every table, then the model, the vacuum and the verification; `target` is the backend's
    connection (open_target)."""
    info = copy_source.index_info(source)
    _check_same_index(target, info)
    report.resumed = claim_target(target, source_id)
    _register_vector_dumper(target)
    totals = {table.name: copy_source.row_count(source, table) for table in TABLES
              if table.name != "memory_vectors" or info is not None}
    run.total = sum(totals.values())
    run.done = sum(count for name, count in totals.items() if get_meta(target, CURSOR_PREFIX + name) == "done")
    # The keyword index batches its new words while the rows pour in (PostgreSQL migration 13 turns
    # that off for the bot's one-at-a-time writes); the VACUUM at the end merges them.
    _set_fastupdate(target, True)
    try:
        for table in TABLES:
            if table.name in totals:
                _copy_table(source, target, table, info, report, run)
        if info is not None:
            _record_model(target, info, on_step)
    finally:  # an interrupted or failed copy must not leave it on for the bot's writes
        _fastupdate_off(target)
    on_step("vacuuming and analysing the copied tables")
    vacuum(target)
    on_step("verifying: row counts and key checksums per table")
    verify(source, target, report, info)
    if report.ok:
        set_meta(target, DONE_KEY, repr(time.time()))


def _copy_table(source: apsw.Connection, target: PgConnection, table: Table, info: IndexInfo | None,
                report: Report, run: _Run) -> None:
    """One table, batch after batch from where an earlier run stopped (its cursor in meta)."""
    cursor_key = CURSOR_PREFIX + table.name
    raw = get_meta(target, cursor_key)
    if raw == "done":
        return
    after: list[Any] | None = json.loads(raw) if raw else None
    sql = _insert_sql(table)
    copied = 0
    while rows := _next_rows(source, table, info, after, run.batch, report):
        after = [rows[-1][table.columns.index(k)] for k in table.key]
        _insert_batch(target, sql, rows, cursor_key, after)
        copied += len(rows)
        run.committed(len(rows))
    _finish_table(target, source, table)  # also on a resumed copy: it always ends here
    set_meta(target, cursor_key, "done")
    report.copied[table.name] = copied


def _next_rows(source: apsw.Connection, table: Table, info: IndexInfo | None, after: list[Any] | None,
               limit: int, report: Report) -> list[tuple]:
    """The next batch of `table` as the target takes it (vectors in pgvector's binary form)."""
    if table.name == "memory_vectors":
        assert info is not None
        return [(mid, key, created, Float32Vector(blob, info.dim))
                for mid, key, created, blob in copy_source.vector_rows(source, info, after, limit)]
    rows, repaired = copy_source.table_rows(source, table, after, limit)
    report.repaired_texts += repaired
    return rows
