"""`muninn migrate --to postgresql://...`: copy the SQLite database into PostgreSQL.

The source (MUNINN_DB_PATH or --db) is opened read-only and never changed; stop the bot
first, so that nothing is written to it during the copy. The target is migrated to the
same schema version and must be empty (or a copy of this same source that was cut short).

Every table is copied in key order, in batches; each batch is one transaction that also
records, in the target's meta table, the last key it copied (`migrate.cursor.<table>`).
A copy killed at any point (kill -9, Ctrl-C, a lost connection) therefore resumes with the
next batch when run again, and never duplicates a row (inserts are ON CONFLICT DO NOTHING
as well). Ids are copied as they are, so "#N" stays the memory it was; the memories id
sequence is moved past SQLite's AUTOINCREMENT high-water mark (ids of deleted memories are
not handed out again). Vectors are read from sqlite-vec's chunk tables and sent in
pgvector's binary form; the embedding model is recorded at the end. The copy ends with a
check per table: row counts and a checksum of the keys on both sides.

Not copied: vector_changes (each process's vector-cache log; on PostgreSQL a trigger logs the
copied vectors itself), leases (held by running processes) and SQLite's own vector-layout meta.
"""
from __future__ import annotations

import hashlib
import json
import logging
import struct
import sys
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import apsw

from bot.cli.args import positive_int
from bot.cli.progress import Progress
from bot.memory.errors import DatabaseError, explain
from bot.memory.sql import queries
from bot.memory.sqlite import db
from bot.memory.sqlite import vec0 as vectors
from bot.memory.sqlite.migrations import MIGRATIONS as SQLITE_MIGRATIONS

log = logging.getLogger(__name__)

BATCH = 2000
SOURCE_KEY = "migrate.source"       # target meta: which SQLite file this database is a copy of
DONE_KEY = "migrate.done"           # target meta: when the copy was verified
CURSOR_PREFIX = "migrate.cursor."   # target meta: last key copied, per table
# SQLite-only meta (the vec0 layout) or set by the target's own index (embed_*), or per process.
SKIPPED_META = ("embed_model", "embed_dim", "vec_buckets", "vec_layout", "vec_epoch")
SKIPPED_META_PREFIXES = ("lease.", "migrate.")


class MigrationError(Exception):
    """A reason to stop, said in one line (the target is left as the last committed batch)."""


class Interrupted(Exception):
    """Stopped on purpose after the requested number of batches (tests)."""


@dataclass(frozen=True)
class Table:
    """One table to copy: `select` reads the source in key order after a key (a `{after}` slot
    for the keyset condition); rows are inserted into the target's `columns`."""
    name: str
    columns: tuple[str, ...]
    key: tuple[str, ...]
    select: str
    text_columns: frozenset[str] = frozenset()  # read as bytes: SQLite may hold invalid UTF-8 / NUL

    def after(self) -> str:
        """The keyset condition, as SQLite row values."""
        if len(self.key) == 1:
            return f"{self.key[0]} > ?"
        return f"({', '.join(self.key)}) > ({', '.join('?' * len(self.key))})"


def _text(name: str) -> str:
    return f"CAST({name} AS BLOB) AS {name}"


MEMORY_COLUMNS = ("id", "text", "scope", "owner_id", "channel_id", "guild_id", "vis_key", "importance", "stability",
                  "access_count", "last_accessed", "created_at", "updated_at", "archived_at", "archive_reason",
                  "source_message_ids", "external_id", "embedded")
MEMORY_TEXTS = frozenset({"text", "vis_key", "archive_reason", "source_message_ids", "external_id"})
MESSAGE_COLUMNS = ("id", "channel_id", "guild_id", "author_id", "author_name", "role", "content", "created_at",
                   "edited_at", "deleted_at", "reply_to", "reply_to_author")
MESSAGE_TEXTS = frozenset({"author_name", "content"})


def _select(table: str, columns: Sequence[str], key: Sequence[str], texts: frozenset[str] = frozenset(),
            where: str = "") -> str:
    cols = ", ".join(_text(c) if c in texts else c for c in columns)
    return (f"SELECT {cols} FROM {table} WHERE {where}{{after}} ORDER BY {', '.join(key)} LIMIT ?")


TABLES: tuple[Table, ...] = (
    Table("memories", MEMORY_COLUMNS, ("id",), _select("memories", MEMORY_COLUMNS, ("id",), MEMORY_TEXTS), MEMORY_TEXTS),
    # memory_vectors: a special reader (the vec0 chunk tables), see _vector_rows
    Table("memory_vectors", ("memory_id", "vis_key", "created_at", "embedding"), ("memory_id",), ""),
    Table("memory_links", ("source_id", "target_id", "kind", "weight", "created_at"), ("source_id", "target_id", "kind"),
          _select("memory_links", ("source_id", "target_id", "kind", "weight", "created_at"),
                  ("source_id", "target_id", "kind"))),
    Table("memory_sources", ("message_id", "memory_id"), ("message_id", "memory_id"),
          _select("memory_sources", ("message_id", "memory_id"), ("message_id", "memory_id"),
                  frozenset({"message_id"})), frozenset({"message_id"})),
    Table("messages", MESSAGE_COLUMNS, ("id",), _select("messages", MESSAGE_COLUMNS, ("id",), MESSAGE_TEXTS),
          MESSAGE_TEXTS),
    Table("channel_settings", ("channel_id", "guild_id", "always_answer", "updated_at"), ("channel_id",),
          _select("channel_settings", ("channel_id", "guild_id", "always_answer", "updated_at"), ("channel_id",))),
    Table("memory_pauses", ("user_id", "paused_at", "notified"), ("user_id",),
          _select("memory_pauses", ("user_id", "paused_at", "notified"), ("user_id",))),
    Table("meta", ("key", "value"), ("key",), _select("meta", ("key", "value"), ("key",), frozenset({"key", "value"}),
                                                      where=" AND ".join(
                                                          [f"key != '{k}'" for k in SKIPPED_META]
                                                          + [f"key NOT LIKE '{p}%'" for p in SKIPPED_META_PREFIXES])
                                                      + " AND "), frozenset({"key", "value"})),
)
DATA_TABLES = ("memories", "memory_vectors", "memory_links", "memory_sources", "messages", "channel_settings",
               "memory_pauses")


@dataclass
class Report:
    copied: dict[str, int] = field(default_factory=dict)   # rows inserted by this run, per table
    repaired_texts: int = 0                                 # invalid UTF-8 / NUL characters replaced
    resumed: bool = False
    counts: dict[str, tuple[int, int]] = field(default_factory=dict)  # table -> (source, target)
    mismatched: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.mismatched

    def line(self) -> str:
        tables = ", ".join(f"{name} {source}" for name, (source, _) in self.counts.items())
        if self.ok:
            return f"verified: {tables} (row counts and key checksums match) in {self.seconds:.1f} s"
        wrong = "; ".join(f"{name}: source {self.counts[name][0]}, target {self.counts[name][1]}"
                          + ("" if self.counts[name][0] != self.counts[name][1] else " (different keys)")
                          for name in self.mismatched)
        return (f"MISMATCH after the copy: {wrong}; if the source was written to meanwhile, stop the bot and run "
                "the command again (a target the bot already writes to has rows the source lacks)")


# -- the source ------------------------------------------------------------------------

def open_source(path: Path) -> apsw.Connection:
    """The SQLite file, read-only (no write, no checkpoint, no new files when it has no WAL)."""
    if not path.is_file():
        raise MigrationError(f"no SQLite database at {str(path)!r} (MUNINN_DB_PATH or --db)")
    try:
        from bot.memory.sqlite.files import check_before_open
        check_before_open(path)
        if Path(f"{path}-wal").exists():
            conn = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READONLY)
        else:
            uri = "file:" + urllib.parse.quote(str(path.resolve())) + "?immutable=1"
            conn = apsw.Connection(uri, flags=apsw.SQLITE_OPEN_READONLY | apsw.SQLITE_OPEN_URI)
        conn.set_busy_timeout(db.BUSY_TIMEOUT_MS)
        db.load_vec(conn)
        version: Any = conn.execute("PRAGMA user_version").fetchall()[0][0]
    except DatabaseError as exc:
        raise MigrationError(str(exc)) from exc
    except apsw.Error as exc:
        raise MigrationError(f"cannot read {str(path)!r}: {explain(exc) or exc}") from exc
    if int(version) != len(SQLITE_MIGRATIONS):
        conn.close()
        raise MigrationError(f"{str(path)!r} has schema version {version}, this Muninn {len(SQLITE_MIGRATIONS)}: "
                             "run `muninn stats` on it once to upgrade it, then migrate")
    return conn


def _clean(value: Any, report: Report) -> Any:
    """Text as PostgreSQL accepts it: valid UTF-8 without NUL (SQLite stores any bytes)."""
    if not isinstance(value, bytes):
        return value
    text = value.decode("utf-8", errors="replace")
    if "\x00" in text:
        text = text.replace("\x00", "\ufffd")
    if "\ufffd" in text and b"\xef\xbf\xbd" not in value:
        report.repaired_texts += 1
    return text


def _source_rows(source: apsw.Connection, table: Table, after: list[Any] | None, limit: int,
                 report: Report) -> list[tuple]:
    sql = table.select.replace("{after}", table.after() if after is not None else "1")
    params = [*(after or []), limit]
    texts = [i for i, name in enumerate(table.columns) if name in table.text_columns]
    rows = []
    for row in source.execute(sql, params):
        if texts:
            row = tuple(_clean(v, report) if i in texts else v for i, v in enumerate(row))
        rows.append(tuple(row))
    return rows


def _vector_rows(source: apsw.Connection, info: vectors.IndexInfo, after: list[Any] | None,
                 limit: int) -> list[tuple]:
    """(memory_id, vis_key, created_at, float32 bytes) in memory_id order, each chunk read once per batch."""
    start = int(after[0]) if after else -(2 ** 63)
    size = info.dim * 4
    if vectors.has_chunk_tables(source):
        placed: list[Any] = source.execute(
            "SELECT r.rowid, m.vis_key, m.created_at, r.chunk_id, r.chunk_offset FROM vec_memories_rowids r "
            "JOIN memories m ON m.id = r.rowid WHERE r.rowid > ? ORDER BY r.rowid LIMIT ?", (start, limit)).fetchall()
        chunk_ids = sorted({row[3] for row in placed})
        chunks: dict[int, bytes] = {}
        for i in range(0, len(chunk_ids), 500):
            part = chunk_ids[i:i + 500]
            for chunk_id, blob in source.execute(
                    f"SELECT rowid, vectors FROM vec_memories_vector_chunks00 WHERE rowid IN ({','.join('?' * len(part))})",
                    part):
                chunks[int(chunk_id)] = bytes(blob)
        return [(mid, key, created, chunks[chunk_id][offset * size:(offset + 1) * size])
                for mid, key, created, chunk_id, offset in placed]
    rows: list[Any] = source.execute(
        "SELECT v.memory_id, m.vis_key, m.created_at, v.embedding FROM vec_memories v JOIN memories m "
        "ON m.id = v.memory_id WHERE v.memory_id > ? ORDER BY v.memory_id LIMIT ?", (start, limit)).fetchall()
    return [(mid, key, created, bytes(blob)) for mid, key, created, blob in rows]


def source_count(source: apsw.Connection, table: Table) -> int:
    if table.name == "memory_vectors":
        if not vectors.table_exists(source):
            return 0
        return int(queries.query_value(source, "SELECT count(*) FROM vec_memories v JOIN memories m ON m.id = v.memory_id"))
    sql = table.select.split(" ORDER BY ")[0].replace("{after}", "1")
    return int(queries.query_value(source, f"SELECT count(*) FROM ({sql})"))


def _source_keys(source: apsw.Connection, table: Table) -> Iterator[tuple]:
    if table.name == "memory_vectors":
        if vectors.table_exists(source):
            yield from source.execute("SELECT v.memory_id FROM vec_memories v JOIN memories m ON m.id = v.memory_id "
                                      "ORDER BY v.memory_id")
        return
    sql = table.select.split(" ORDER BY ")[0].replace("{after}", "1")
    keys = ", ".join(f"CAST({k} AS BLOB)" if k in table.text_columns else k for k in table.key)
    inner = sql.split(" FROM ", 1)[1]
    for row in source.execute(f"SELECT {keys} FROM {inner} ORDER BY {', '.join(table.key)}"):
        yield tuple(v.decode("utf-8", errors="replace") if isinstance(v, bytes) else v for v in row)


# -- the target ------------------------------------------------------------------------

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


def open_target(url: str) -> Any:
    """The target, migrated to this Muninn's schema (one-line errors for a bad URL, a server
    that is down, a newer schema, no pgvector)."""
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme not in ("postgresql", "postgres") or not (parsed.netloc or parsed.query):
        raise MigrationError("--to must be a postgresql:// URL such as postgresql://muninn@localhost/muninn")
    try:
        from bot.memory.postgres.backend import PostgresStorage
    except ImportError as exc:
        raise MigrationError(f"PostgreSQL support is not installed ({exc.name}): pip install 'muninn[postgres]'") from exc
    try:
        return PostgresStorage(url).open_writer()
    except DatabaseError as exc:
        raise MigrationError(str(exc)) from exc
    except RuntimeError as exc:  # migrations: the target's schema is newer than this Muninn
        raise MigrationError(f"target: {exc}") from exc


def _target_meta(pg: Any, key: str) -> str | None:
    from bot.memory.postgres.backend import _meta  # the backend's own (psycopg is an optional dependency)
    from bot.memory.postgres.connection import PgConnection
    return _meta(PgConnection(pg), key)


def _set_target_meta(pg: Any, key: str, value: str) -> None:
    from bot.memory.postgres.backend import _set_meta
    from bot.memory.postgres.connection import PgConnection
    _set_meta(PgConnection(pg), key, value)


def claim_target(pg: Any, source_id: str) -> bool:
    """Refuse a target holding other data; mark it as this source's copy. Returns whether a
    previous copy of this source is being resumed."""
    with pg.transaction():
        pg.execute("LOCK TABLE meta IN SHARE ROW EXCLUSIVE MODE")  # two copies at once: the second waits, then resumes
        claimed = _target_meta(pg, SOURCE_KEY)
        if claimed is not None and claimed != source_id:
            raise MigrationError(f"the target already holds a copy of another database ({claimed}); "
                                 "migrate into an empty PostgreSQL database")
        if claimed is None:
            busy = [name for name in DATA_TABLES
                    if pg.execute(f"SELECT EXISTS (SELECT 1 FROM {name})".encode()).fetchone()[0]]
            if busy:
                raise MigrationError(f"the target database is not empty (rows in {', '.join(busy)}); "
                                     "migrate into an empty PostgreSQL database")
            _set_target_meta(pg, SOURCE_KEY, source_id)
        return claimed is not None


def _insert_sql(table: Table) -> bytes:
    values = ", ".join("%b" if name == "embedding" else "%s" for name in table.columns)
    return (f"INSERT INTO {table.name} ({', '.join(table.columns)}) VALUES ({values}) "
            f"ON CONFLICT DO NOTHING").encode()


def _target_keys(pg: Any, table: Table) -> Iterator[tuple]:
    order = ", ".join(f'{k} COLLATE "C"' if k in ("kind", "message_id", "key") else k for k in table.key)
    with pg.cursor(name=f"keys_{table.name}") as cursor:  # server-side: streams (call inside a transaction)
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
    source = open_source(source_path)
    try:
        conn = open_target(url)
        try:
            _copy(source, conn.pg, str(source_path.resolve()), report, batch, stop_after_batches, on_progress,
                  on_step or (lambda what: None), target=conn)
        except psycopg.Error as exc:  # a lost connection, a full disk on the server, ...
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise MigrationError(f"PostgreSQL: {reason}; the batches committed so far are kept: "
                                 "run the same command again to continue") from exc
        except apsw.Error as exc:
            raise MigrationError(f"reading {str(source_path)!r}: {explain(exc) or exc}") from exc
        finally:
            conn.close()
    finally:
        source.close()
    report.seconds = time.monotonic() - started
    return report


def _copy(source: apsw.Connection, pg: Any, source_id: str, report: Report, batch: int,
          stop_after_batches: int | None, on_progress: Callable[[int, int], None] | None,
          on_step: Callable[[str], None], *, target: Any) -> None:
    """`pg` is the psycopg connection of `target`, the backend's connection (open_target)."""
    import psycopg

    info = vectors.index_info(source) if vectors.table_exists(source) else None
    target_info = _target_meta(pg, "embed_model"), _target_meta(pg, "embed_dim")
    if info is not None and target_info[0] is not None and target_info != (info.model, str(info.dim)):
        raise MigrationError(f"the target's vector index is for {target_info[0]} ({target_info[1]} dimensions), "
                             f"the source's for {info.model} ({info.dim}); migrate into an empty database")
    report.resumed = claim_target(pg, source_id)
    oid = pg.execute("SELECT 'vector'::regtype::oid").fetchone()[0]
    pg.adapters.register_dumper(Float32Vector, _vector_dumper(int(oid)))
    totals = {table.name: source_count(source, table) for table in TABLES if table.name != "memory_vectors"
              or info is not None}
    done = 0
    for table in TABLES:
        raw = _target_meta(pg, CURSOR_PREFIX + table.name)
        if raw == "done":
            done += totals.get(table.name, 0)
    total = sum(totals.values())
    batches = 0
    # The keyword index batches its new words while the rows pour in (PostgreSQL migration 13 turns
    # that off for the bot's one-at-a-time writes); the VACUUM at the end merges them.
    pg.execute("ALTER INDEX memories_text_search SET (fastupdate = on)")
    try:
        for table in TABLES:
            if table.name not in totals:
                continue
            cursor_key = CURSOR_PREFIX + table.name
            raw = _target_meta(pg, cursor_key)
            if raw == "done":
                continue
            after: list[Any] | None = json.loads(raw) if raw else None
            sql = _insert_sql(table)
            copied = 0
            while True:
                if table.name == "memory_vectors":
                    assert info is not None
                    rows: list[tuple] = [(mid, key, created, Float32Vector(blob, info.dim))
                                         for mid, key, created, blob in _vector_rows(source, info, after, batch)]
                else:
                    rows = _source_rows(source, table, after, batch, report)
                if not rows:
                    break
                last = [rows[-1][table.columns.index(k)] for k in table.key]
                with pg.transaction():
                    with pg.cursor() as cursor:
                        cursor.executemany(sql, rows)
                    _set_target_meta(pg, cursor_key, json.dumps(last))
                after = last
                copied += len(rows)
                done += len(rows)
                batches += 1
                if on_progress:
                    on_progress(min(done, total), total)
                if stop_after_batches is not None and batches >= stop_after_batches:
                    raise Interrupted(f"stopped after {batches} batches")
            _finish_table(pg, source, table)  # also on a resumed copy: it always ends here
            _set_target_meta(pg, cursor_key, "done")
            report.copied[table.name] = copied
        if info is not None:
            # The backend's own index_for records the model (no approximate index: migration 9).
            on_step(f"recording the embedding model ({info.dim} dimensions)")
            # The trigger logged each copied vector for the vector caches (migration 8); no cache has
            # seen this database yet, and index_for starts a new epoch: the log is not needed.
            pg.execute("TRUNCATE vector_changes")
            try:
                target.storage.index_for(target, info.model, info.dim)
            except psycopg.Error as exc:
                raise MigrationError(f"recording the embedding model failed: {exc}") from exc
    finally:  # an interrupted or failed copy must not leave it on for the bot's writes
        _fastupdate_off(pg)
    # Fresh statistics and visibility map now, not when autovacuum gets round to it: without
    # them the planner guesses each visibility key's row count.
    on_step("vacuuming and analysing the copied tables")
    pg.execute("VACUUM (ANALYZE) memories")
    pg.execute("VACUUM (ANALYZE) memory_vectors")
    on_step("verifying: row counts and key checksums per table")
    verify(source, pg, report, info)
    if report.ok:
        _set_target_meta(pg, DONE_KEY, repr(time.time()))


def _fastupdate_off(pg: Any) -> None:
    """The keyword index back to migration 13's setting; on a broken connection the copy's own
    error is the one to report (the next migrate turns it off at its end)."""
    import psycopg
    try:
        pg.execute("ALTER INDEX memories_text_search SET (fastupdate = off)")
    except psycopg.Error as exc:
        log.warning("could not turn the keyword index's fastupdate off: %s", exc)


def _move_identity(pg: Any, source: apsw.Connection) -> None:
    """The memories id sequence past every id SQLite ever handed out (AUTOINCREMENT keeps the
    highest even after that memory was deleted), never backwards."""
    sqlite_high = queries.query_value(source, "SELECT seq FROM sqlite_sequence WHERE name = 'memories'", default=0) or 0
    row = pg.execute("SELECT pg_get_serial_sequence('memories', 'id'), (SELECT coalesce(max(id), 0) FROM memories), "
                     "coalesce(pg_sequence_last_value(pg_get_serial_sequence('memories', 'id')::regclass), 0)").fetchone()
    sequence, copied_high, current = row
    high = max(int(sqlite_high), int(copied_high))
    if high > int(current):
        pg.execute("SELECT setval(%s::regclass, %s)", (sequence, high))


def _finish_table(pg: Any, source: apsw.Connection, table: Table) -> None:
    if table.name == "memories":
        _move_identity(pg, source)
    if table.name == "memory_vectors":
        # `embedded` = a vector is there: a row whose vector was missing in SQLite gets embedded later
        pg.execute("UPDATE memories SET embedded = 0 WHERE embedded = 1 AND NOT EXISTS "
                   "(SELECT 1 FROM memory_vectors v WHERE v.memory_id = memories.id)")


def verify(source: apsw.Connection, pg: Any, report: Report, info: vectors.IndexInfo | None) -> None:
    """Per table: the rows and a checksum of the keys, source against target (meta: the copied keys present)."""
    for table in TABLES:
        if table.name == "memory_vectors" and info is None:
            continue
        if table.name == "meta":
            wanted = [row[0] for row in _source_keys(source, table)]
            present = pg.execute("SELECT count(*) FROM meta WHERE key = ANY(%s)", (wanted,)).fetchone()[0]
            report.counts["meta"] = (len(wanted), int(present))
            if int(present) != len(wanted):
                report.mismatched.append("meta")
            continue
        src = _digest(_source_keys(source, table))
        with pg.transaction():
            dst = _digest(_target_keys(pg, table))
        report.counts[table.name] = (src[0], dst[0])
        if src != dst:
            report.mismatched.append(table.name)


# -- the command -----------------------------------------------------------------------

async def cmd_migrate(args: Any, settings: Any) -> int:
    """`muninn migrate --to URL`: blocking on purpose (a one-shot command with nothing else on
    its event loop), so that Ctrl-C stops it between two statements and the open batch rolls back."""
    source = Path(settings.db_path)
    bar = Progress(f"copying {source.name}", None)

    def progress(done: int, total: int) -> None:
        bar.total = total
        bar.update(done)

    def step(what: str) -> None:
        bar.finish()
        print(what, file=sys.stderr, flush=True)
    try:
        report = copy_database(source, args.to, batch=args.batch, on_progress=progress, on_step=step)
    except MigrationError as exc:
        print(f"muninn migrate: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        bar.finish()
        print("muninn migrate: interrupted; the batches copied so far are kept: run the same command to continue",
              file=sys.stderr)
        return 130
    if report.repaired_texts:
        print(f"{report.repaired_texts} texts had invalid UTF-8 or NUL characters: replaced with U+FFFD",
              file=sys.stderr)
    data = {"ok": report.ok, "resumed": report.resumed, "copied": report.copied,
            "counts": {name: {"source": s, "target": t} for name, (s, t) in report.counts.items()},
            "mismatched": report.mismatched, "repaired_texts": report.repaired_texts,
            "seconds": round(report.seconds, 2)}
    if getattr(args, "json", False):
        print(json.dumps(data), flush=True)
    else:
        print(report.line(), flush=True)
        if report.ok:
            print(f"next: set MUNINN_DATABASE_URL to the target (and keep {source} as a backup)", flush=True)
    return 0 if report.ok else 1


def add_parser(sub: Any, common: Any) -> None:
    p = sub.add_parser("migrate", parents=[common],
                       help="copy the SQLite database into PostgreSQL (resumable, verified)")
    p.add_argument("--to", required=True, metavar="postgresql://...",
                   help="the target database (empty, or a copy of this source cut short)")
    p.add_argument("--batch", type=positive_int, default=BATCH, help=f"rows per transaction (default {BATCH})")
    p.set_defaults(handler=cmd_migrate)


