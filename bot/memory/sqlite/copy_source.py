"""A SQLite file as the source of `muninn migrate`'s copy (bot/memory/postgres/copy.py): read-only, table by table in key order.

Text is read as bytes (SQLite holds any bytes in a TEXT column) and cleaned into what
PostgreSQL accepts; vectors are read straight from sqlite-vec's chunk tables, each chunk
once per batch. Not copied: vector_changes (each process's vector-cache log), leases (held
by running processes) and SQLite's own vector-layout meta.
"""
from __future__ import annotations

import urllib.parse
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import apsw

from bot.memory.errors import DatabaseError, explain
from bot.memory.sql.queries import query_value
from bot.memory.sqlite import db, files
from bot.memory.sqlite import vec0 as vectors
from bot.memory.sqlite.migrations import MIGRATIONS
from bot.memory.vectors.index import IndexInfo

# SQLite-only meta (the vec0 layout) or set by the target's own index (embed_*), or per process,
# or the database's own (its instance token: its vector snapshots are its own).
SKIPPED_META = ("embed_model", "embed_dim", "vec_buckets", "vec_layout", "vec_epoch", "instance")
SKIPPED_META_PREFIXES = ("lease.", "migrate.")
# How many chunk ids one statement asks for (well under SQLite's limit on parameters).
CHUNKS_PER_STATEMENT = 500


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
                  "source_message_ids", "external_id", "embedded", "happens_on")
MEMORY_TEXTS = frozenset({"text", "vis_key", "archive_reason", "source_message_ids", "external_id", "happens_on"})
MESSAGE_COLUMNS = ("id", "channel_id", "guild_id", "author_id", "author_name", "role", "content", "created_at",
                   "edited_at", "deleted_at", "reply_to", "reply_to_author")
MESSAGE_TEXTS = frozenset({"author_name", "content"})
GUILD_SETTING_COLUMNS = ("guild_id", "key", "value", "updated_at")
CHANNEL_OPTION_COLUMNS = ("channel_id", "guild_id", "key", "value", "updated_at")
APPROVAL_COLUMNS = ("memory_id", "how", "moderator_id", "approved_at")
LOG_COLUMNS = ("id", "at", "guild_id", "channel_id", "moderator_id", "action", "memory_id")
TEACHER_COLUMNS = ("memory_id", "user_id", "first_taught_at", "source_message_ids")
CONSOLE_COLUMNS = ("id", "at", "action", "memory_id", "user_id")


def _select(table: str, columns: Sequence[str], key: Sequence[str], texts: frozenset[str] = frozenset(),
            where: str = "") -> str:
    cols = ", ".join(_text(c) if c in texts else c for c in columns)
    return (f"SELECT {cols} FROM {table} WHERE {where}{{after}} ORDER BY {', '.join(key)} LIMIT ?")


TABLES: tuple[Table, ...] = (
    Table("memories", MEMORY_COLUMNS, ("id",), _select("memories", MEMORY_COLUMNS, ("id",), MEMORY_TEXTS), MEMORY_TEXTS),
    # memory_vectors: a special reader (the vec0 chunk tables), see vector_rows
    Table("memory_vectors", ("memory_id", "vis_key", "created_at", "embedding"), ("memory_id",), ""),
    Table("memory_links", ("source_id", "target_id", "kind", "weight", "created_at"), ("source_id", "target_id", "kind"),
          _select("memory_links", ("source_id", "target_id", "kind", "weight", "created_at"),
                  ("source_id", "target_id", "kind"))),
    Table("memory_sources", ("message_id", "memory_id"), ("message_id", "memory_id"),
          _select("memory_sources", ("message_id", "memory_id"), ("message_id", "memory_id"),
                  frozenset({"message_id"})), frozenset({"message_id"})),
    Table("memory_mentions", ("memory_id", "user_id"), ("memory_id", "user_id"),
          _select("memory_mentions", ("memory_id", "user_id"), ("memory_id", "user_id"))),
    Table("messages", MESSAGE_COLUMNS, ("id",), _select("messages", MESSAGE_COLUMNS, ("id",), MESSAGE_TEXTS),
          MESSAGE_TEXTS),
    Table("memory_teachers", TEACHER_COLUMNS, ("memory_id", "user_id"),
          _select("memory_teachers", TEACHER_COLUMNS, ("memory_id", "user_id"), frozenset({"source_message_ids"})),
          frozenset({"source_message_ids"})),
    Table("reply_context", ("reply_id", "author_id"), ("reply_id", "author_id"),
          _select("reply_context", ("reply_id", "author_id"), ("reply_id", "author_id"))),
    Table("channel_options", CHANNEL_OPTION_COLUMNS, ("channel_id", "key"),
          _select("channel_options", CHANNEL_OPTION_COLUMNS, ("channel_id", "key"), frozenset({"key", "value"})),
          frozenset({"key", "value"})),
    Table("memory_pauses", ("user_id", "paused_at", "notified"), ("user_id",),
          _select("memory_pauses", ("user_id", "paused_at", "notified"), ("user_id",))),
    Table("guild_departures", ("guild_id", "departed_at"), ("guild_id",),
          _select("guild_departures", ("guild_id", "departed_at"), ("guild_id",))),
    Table("guild_settings", GUILD_SETTING_COLUMNS, ("guild_id", "key"),
          _select("guild_settings", GUILD_SETTING_COLUMNS, ("guild_id", "key"), frozenset({"key", "value"})),
          frozenset({"key", "value"})),
    Table("memory_approvals", APPROVAL_COLUMNS, ("memory_id",), _select("memory_approvals", APPROVAL_COLUMNS,
                                                                        ("memory_id",))),
    Table("moderation_log", LOG_COLUMNS, ("id",), _select("moderation_log", LOG_COLUMNS, ("id",))),
    Table("console_log", CONSOLE_COLUMNS, ("id",), _select("console_log", CONSOLE_COLUMNS, ("id",))),
    Table("meta", ("key", "value"), ("key",), _select("meta", ("key", "value"), ("key",), frozenset({"key", "value"}),
                                                      where=" AND ".join(
                                                          [f"key != '{k}'" for k in SKIPPED_META]
                                                          + [f"key NOT LIKE '{p}%'" for p in SKIPPED_META_PREFIXES])
                                                      + " AND "), frozenset({"key", "value"})),
)
DATA_TABLES = ("memories", "memory_vectors", "memory_links", "memory_sources", "memory_mentions", "messages",
               "memory_teachers", "reply_context", "channel_options", "memory_pauses", "guild_departures",
               "guild_settings", "memory_approvals", "moderation_log", "console_log")


def open_source(path: Path) -> apsw.Connection:
    """The SQLite file, read-only (no write, no checkpoint, no new files when it has no WAL).
    DatabaseError, in one line, for a file that is missing, not Muninn's or of another schema."""
    if not path.is_file():
        raise DatabaseError(f"no SQLite database at {str(path)!r} (MUNINN_DB_PATH or --db)")
    try:
        files.check_before_open(path)
        if Path(f"{path}-wal").exists():
            conn = apsw.Connection(str(path), flags=apsw.SQLITE_OPEN_READONLY)
        else:
            uri = "file:" + urllib.parse.quote(str(path.resolve())) + "?immutable=1"
            conn = apsw.Connection(uri, flags=apsw.SQLITE_OPEN_READONLY | apsw.SQLITE_OPEN_URI)
        conn.set_busy_timeout(db.BUSY_TIMEOUT_MS)
        db.load_vec(conn)
        version: Any = conn.execute("PRAGMA user_version").fetchall()[0][0]
    except apsw.Error as exc:
        raise DatabaseError(f"cannot read {str(path)!r}: {explain(exc) or exc}") from exc
    if int(version) != len(MIGRATIONS):
        conn.close()
        raise DatabaseError(f"{str(path)!r} has schema version {version}, this Muninn {len(MIGRATIONS)}: "
                            "run `muninn stats` on it once to upgrade it, then migrate")
    return conn


def index_info(source: apsw.Connection) -> IndexInfo | None:
    """The source's vector index (model and dimension), or None when it has no vectors."""
    return vectors.index_info(source) if vectors.table_exists(source) else None


def _clean(value: Any) -> tuple[Any, bool]:
    """Text as PostgreSQL accepts it: valid UTF-8 without NUL (SQLite stores any bytes); and
    whether something had to be replaced."""
    if not isinstance(value, bytes):
        return value, False
    text = value.decode("utf-8", errors="replace")
    if "\x00" in text:
        text = text.replace("\x00", "\ufffd")
    return text, "\ufffd" in text and b"\xef\xbf\xbd" not in value


def table_rows(source: apsw.Connection, table: Table, after: list[Any] | None, limit: int) -> tuple[list[tuple], int]:
    """Up to `limit` rows of `table` after the key `after` (None: from the start), in key order,
    their text cleaned; and how many texts had invalid UTF-8 or NUL characters replaced."""
    sql = table.select.replace("{after}", table.after() if after is not None else "1")
    params = [*(after or []), limit]
    texts = [i for i, name in enumerate(table.columns) if name in table.text_columns]
    rows, repaired = [], 0
    for row in source.execute(sql, params):
        if texts:
            cleaned = []
            for i, value in enumerate(row):
                if i in texts:
                    value, replaced = _clean(value)
                    repaired += replaced
                cleaned.append(value)
            row = tuple(cleaned)
        rows.append(tuple(row))
    return rows, repaired


def vector_rows(source: apsw.Connection, info: IndexInfo, after: list[Any] | None, limit: int) -> list[tuple]:
    """(memory_id, vis_key, created_at, float32 bytes) in memory_id order, each chunk read once per batch."""
    start = int(after[0]) if after else -(2 ** 63)
    if vectors.has_chunk_tables(source):
        return _chunked_vector_rows(source, info, start, limit)
    rows: list[Any] = source.execute(
        "SELECT v.memory_id, m.vis_key, m.created_at, v.embedding FROM vec_memories v JOIN memories m "
        "ON m.id = v.memory_id WHERE v.memory_id > ? ORDER BY v.memory_id LIMIT ?", (start, limit)).fetchall()
    return [(mid, key, created, bytes(blob)) for mid, key, created, blob in rows]


def _chunked_vector_rows(source: apsw.Connection, info: IndexInfo, start: int, limit: int) -> list[tuple]:
    """vector_rows from vec0's shadow tables: where each vector is, then the chunks that hold them."""
    size = info.dim * 4
    placed: list[Any] = source.execute(
        "SELECT r.rowid, m.vis_key, m.created_at, r.chunk_id, r.chunk_offset FROM vec_memories_rowids r "
        "JOIN memories m ON m.id = r.rowid WHERE r.rowid > ? ORDER BY r.rowid LIMIT ?", (start, limit)).fetchall()
    chunk_ids = sorted({row[3] for row in placed})
    chunks: dict[int, bytes] = {}
    for i in range(0, len(chunk_ids), CHUNKS_PER_STATEMENT):
        part = chunk_ids[i:i + CHUNKS_PER_STATEMENT]
        for chunk_id, blob in source.execute(
                f"SELECT rowid, vectors FROM vec_memories_vector_chunks00 WHERE rowid IN ({','.join('?' * len(part))})",
                part):
            chunks[int(chunk_id)] = bytes(blob)
    return [(mid, key, created, chunks[chunk_id][offset * size:(offset + 1) * size])
            for mid, key, created, chunk_id, offset in placed]


def row_count(source: apsw.Connection, table: Table) -> int:
    """How many rows of `table` the copy reads (memory_vectors: the vectors of memories)."""
    if table.name == "memory_vectors":
        if not vectors.table_exists(source):
            return 0
        return int(query_value(source, "SELECT count(*) FROM vec_memories v JOIN memories m ON m.id = v.memory_id"))
    sql = table.select.split(" ORDER BY ")[0].replace("{after}", "1")
    return int(query_value(source, f"SELECT count(*) FROM ({sql})"))


def keys(source: apsw.Connection, table: Table) -> Iterator[tuple]:
    """The keys of every row the copy reads, in key order (text decoded as the copy cleans it)."""
    if table.name == "memory_vectors":
        if vectors.table_exists(source):
            yield from source.execute("SELECT v.memory_id FROM vec_memories v JOIN memories m ON m.id = v.memory_id "
                                      "ORDER BY v.memory_id")
        return
    sql = table.select.split(" ORDER BY ")[0].replace("{after}", "1")
    columns = ", ".join(f"CAST({k} AS BLOB)" if k in table.text_columns else k for k in table.key)
    inner = sql.split(" FROM ", 1)[1]
    for row in source.execute(f"SELECT {columns} FROM {inner} ORDER BY {', '.join(table.key)}"):
        yield tuple(v.decode("utf-8", errors="replace") if isinstance(v, bytes) else v for v in row)


def autoincrement_high(source: apsw.Connection) -> int:
    """The highest memory id SQLite ever handed out (AUTOINCREMENT keeps it after that memory is deleted)."""
    return int(query_value(source, "SELECT seq FROM sqlite_sequence WHERE name = 'memories'", default=0) or 0)
