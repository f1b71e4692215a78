"""Plain, synchronous memory storage on one apsw connection.

Each public function that writes is one transaction: the memory row, its FTS row
(kept in sync by triggers), its vector and its links commit or roll back together.
Callers on the event loop reach these through `engine.Engine`, which runs them on
the database thread.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any, Iterable, Iterator, Sequence

from bot import validate
from bot.memory import decay
from bot.memory.connection import Connection
from bot.memory.scope import (
    ACTIVE,
    SCOPES,
    Viewer,
    is_private,
    key_filter,
    memory_key,
    visible_keys,
)
from bot.memory.sql import removals
from bot.memory.sql.queries import query_one, query_value
from bot.memory.sql.transactions import after_commit, write_transaction
from bot.memory.sqlite import fts
from bot.memory.sqlite import vec0 as vectors

# Times Python can render (datetime covers years 1 to 9999): a stored value outside is
# shown clamped, never allowed to crash a recall or an export.
RENDERABLE_FROM = datetime(1, 1, 2, tzinfo=timezone.utc).timestamp()
RENDERABLE_UNTIL = datetime(9999, 12, 30, tzinfo=timezone.utc).timestamp()

LINK_KINDS = ("co_extracted", "consolidated", "semantic", "superseded_by")
MAX_TEXT_CHARS = 4000

# Free text comes back as bytes and is decoded leniently (Memory.from_row): SQLite never checks
# that TEXT is UTF-8, and one bad byte written by another program must not break every read.
COLUMNS = ("id, CAST(text AS BLOB), scope, owner_id, channel_id, guild_id, vis_key, importance, stability, "
           "access_count, last_accessed, created_at, updated_at, archived_at, CAST(archive_reason AS BLOB), "
           "source_message_ids, CAST(external_id AS BLOB), embedded")


class MemoryNotFound(LookupError):
    pass


@dataclass
class NewMemory:
    text: str
    scope: str
    owner_id: int | None = None
    channel_id: int | None = None
    guild_id: int | None = None
    importance: float = 0.5
    created_at: float | None = None
    source_message_ids: Sequence[int | str] = ()
    external_id: str | None = None
    private: bool = False  # learned in a guild channel not everyone there can read (scope.memory_key)

    def __post_init__(self):
        # The last line of defence for every writer (import, CLI, slash commands, LLM output):
        # nothing that would fail to store or later fail to render gets in.
        self.text = clean_text(validate.stored_text(self.text))
        if self.scope not in SCOPES:
            raise ValueError(f"unknown scope {validate.replace_invalid(repr(self.scope))}; "
                             f"use one of {', '.join(SCOPES)}")
        self.importance = validate.number(self.importance, "importance", low=0.0, high=1.0)
        self.owner_id = validate.snowflake(self.owner_id, "owner id")
        self.channel_id = validate.snowflake(self.channel_id, "channel id")
        self.guild_id = validate.snowflake(self.guild_id, "guild id")
        if self.created_at is not None:
            self.created_at = validate.number(self.created_at, "created_at", low=0.0, high=RENDERABLE_UNTIL)
        if self.external_id is not None:
            self.external_id = validate.stored_text(self.external_id, "external_id")
        self.source_message_ids = [validate.stored_text(str(s), "source_message_ids")
                                   for s in self.source_message_ids]
        memory_key(self.scope, self.owner_id, self.channel_id, self.guild_id, self.private)  # validates ids

    @property
    def vis_key(self) -> str:
        return memory_key(self.scope, self.owner_id, self.channel_id, self.guild_id, self.private)


@dataclass
class Memory:
    id: int
    text: str
    scope: str
    owner_id: int | None
    channel_id: int | None
    guild_id: int | None
    vis_key: str
    importance: float
    stability: float
    access_count: int
    last_accessed: float | None
    created_at: float
    updated_at: float
    archived_at: float | None
    archive_reason: str | None
    source_message_ids: list = field(default_factory=list)
    external_id: str | None = None
    embedded: bool = False

    @classmethod
    def from_row(cls, row) -> "Memory":
        """A memory as stored; whatever is in the file (an odd type, broken JSON), this does not raise."""
        values = list(row)
        for index in (1, 14, 16):  # text, archive_reason, external_id
            if isinstance(values[index], bytes):
                values[index] = lenient_text(values[index])
        values[15] = _id_list(values[15])
        values[17] = bool(values[17])
        for index in (7, 8, 10, 11, 12, 13):  # importance, stability and the times: numbers or None
            if values[index] is not None and not isinstance(values[index], (int, float)):
                values[index] = _as_float(values[index])
        if values[11] is None:
            values[11] = 0.0
        if values[12] is None:
            values[12] = values[11]
        if not isinstance(values[1], str):
            values[1] = str(values[1])
        return cls(*values)

    @property
    def private(self) -> bool:
        """Learned in a private channel (its key names the channel): copies must keep that."""
        return is_private(self.vis_key)

    def retention(self, now: float | None = None) -> float:
        """Retention now; a stored value that makes no sense (stability 0, a NaN) gives 0.0 or 1.0."""
        try:
            value = decay.retention(now or time.time(), self.last_accessed or self.created_at, self.stability)
        except (ArithmeticError, TypeError, ValueError):
            return 0.0
        return value if math.isfinite(value) else 0.0

    def to_dict(self, now: float | None = None) -> dict:
        out = asdict(self)
        for key in ("last_accessed", "created_at", "updated_at", "archived_at"):
            out[key] = iso(out[key])
        out["retention"] = round(self.retention(now), 4)
        return out


def clean_text(text: str) -> str:
    """Normalise whitespace and reject what cannot be a memory, with a clear message."""
    if not isinstance(text, str):
        raise ValueError("memory text must be a string")
    text = text.replace("\x00", "").strip()
    if not text:
        raise ValueError("memory text is empty")
    if len(text) > MAX_TEXT_CHARS:
        raise ValueError(f"memory text is {len(text)} characters; the limit is {MAX_TEXT_CHARS}")
    return text


def iso(ts: float | None) -> str | None:
    """ISO-8601 UTC; a time Python cannot render (year < 1 or > 9999, NaN) is clamped and marked
    with a trailing "?" so that a damaged row still shows, and shows that it is damaged."""
    if ts is None:
        return None
    if isinstance(ts, (int, float)) and math.isfinite(ts) and RENDERABLE_FROM <= ts <= RENDERABLE_UNTIL:
        return datetime.fromtimestamp(ts, timezone.utc).isoformat(timespec="seconds")
    if not isinstance(ts, (int, float)) or math.isnan(ts):
        return "invalid?"
    edge = RENDERABLE_FROM if ts < RENDERABLE_FROM else RENDERABLE_UNTIL
    return datetime.fromtimestamp(edge, timezone.utc).isoformat(timespec="seconds") + "?"


def lenient_text(raw: bytes) -> str:
    """Stored bytes as text; invalid UTF-8 becomes U+FFFD (`muninn doctor` reports such rows)."""
    return raw.decode("utf-8", "replace")


def _id_list(raw) -> list:
    try:
        value = json.loads(raw or "[]")
    except (ValueError, TypeError):
        return []
    return value if isinstance(value, list) else []


def _as_float(value) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


# -- writes ------------------------------------------------------------------

def insert_many(conn: Connection, memories: Sequence[NewMemory], *, base_stability_days: float,
                vector_info: vectors.IndexInfo | None = None,
                vectors_: Sequence[Sequence[float] | None] | None = None,
                now: float | None = None) -> list[int]:
    """Insert memories (and their vectors, if given) in one transaction."""
    now = time.time() if now is None else now
    ids: list[int] = []
    with write_transaction(conn):
        for index, memory in enumerate(memories):
            created = memory.created_at if memory.created_at is not None else now
            memory_id = int(query_value(
                conn,
                "INSERT INTO memories (text, scope, owner_id, channel_id, guild_id, vis_key, importance, "
                "stability, created_at, updated_at, source_message_ids, external_id) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
                (memory.text, memory.scope, memory.owner_id, memory.channel_id, memory.guild_id,
                 memory.vis_key, memory.importance,
                 decay.initial_stability(memory.importance, base_stability_days), created, now,
                 json.dumps([str(s) for s in memory.source_message_ids]), memory.external_id)))
            ids.append(memory_id)
            vector = vectors_[index] if vectors_ else None
            if vector is not None and vector_info is not None:
                vectors.put(conn, vector_info, memory_id, memory.vis_key, created, vector)
    return ids


def add_link(conn: Connection, source_id: int, target_id: int, kind: str, weight: float = 1.0,
             now: float | None = None) -> bool:
    """Link two memories (an existing link keeps the larger weight). A link never joins two
    people's personal memories: refused, returns False."""
    if kind not in LINK_KINDS:
        raise ValueError(f"unknown link kind {kind!r}")
    if query_value(conn, "SELECT count(*) FROM memories a, memories b WHERE a.id = ? AND b.id = ? AND "
                         "a.scope = 'personal' AND b.scope = 'personal' AND a.owner_id != b.owner_id",
                   (source_id, target_id)):
        return False
    conn.execute(
        "INSERT INTO memory_links (source_id, target_id, kind, weight, created_at) VALUES (?, ?, ?, ?, ?) "
        "ON CONFLICT (source_id, target_id, kind) DO UPDATE SET weight = max(weight, excluded.weight)",
        (source_id, target_id, kind, weight, time.time() if now is None else now))
    return True


def link_pairwise(conn: Connection, ids: Sequence[int], kind: str, *, now: float | None = None) -> None:
    """Link memories pairwise (as add_link allows), e.g. the facts of one exchange."""
    for a, b in pairs(ids):
        add_link(conn, a, b, kind, now=now)


def pairs(ids: Sequence[int]) -> Iterator[tuple[int, int]]:
    """Each unordered pair of distinct ids once, in the order the ids came."""
    unique = list(dict.fromkeys(ids))
    for i, a in enumerate(unique):
        for b in unique[i + 1:]:
            yield a, b


def delete(conn: Connection, memory_ids: Iterable[int]) -> int:
    """Hard-delete memories with their FTS rows, vectors and links; returns how many went."""
    ids = list(memory_ids)
    with write_transaction(conn):
        vectors.remove(conn, ids)
        removed = 0
        for memory_id in ids:  # links and source rows go by ON DELETE CASCADE, the FTS row by trigger
            conn.execute("DELETE FROM memories WHERE id = ?", (memory_id,))
            removed += conn.changes()
        added = removals.add(conn, removed)  # other processes' word counts (one writer: no wait)
    after_commit(conn, lambda: _counts_after_removal(conn, removed, added))
    return removed


def _counts_after_removal(conn: Connection, removed: int, added: int | None) -> None:
    """Once the removal is committed (a caller's transaction included): before it, a recall that
    counted a word still saw the removed rows and would cache the old count again."""
    fts.forget_counts(conn, removed)
    removals.seen_own(fts.database_of(conn), added, removed)


def taught_anything(conn: Any, message_ids: Sequence[int], learned_before: float | None = None) -> bool:
    """Whether a memory was learned from any of these messages (before `learned_before`, when
    given; portable SQL, both backends): read before a take-back takes the write lock, which most
    deleted or edited messages never need."""
    wanted = [str(m) for m in message_ids]
    if not wanted:
        return False
    marks = ",".join("?" * len(wanted))
    if learned_before is None:
        rows = conn.execute(f"SELECT 1 FROM memory_sources WHERE message_id IN ({marks}) LIMIT 1", wanted).fetchall()
    else:
        rows = conn.execute("SELECT 1 FROM memory_sources s JOIN memories m ON m.id = s.memory_id "
                            f"WHERE s.message_id IN ({marks}) AND m.created_at < ? LIMIT 1",
                            [*wanted, learned_before]).fetchall()
    return bool(rows)


def forget_sources(conn: Connection, message_ids: Sequence[int], learned_before: float | None = None) -> list[int]:
    """Messages were deleted: take them out of the memories learned from them (before
    `learned_before`, when given), and delete the memories that were learned from nothing else
    (a retraction). Returns the deleted ids."""
    wanted = [str(m) for m in message_ids]
    if not wanted:
        return []
    marks = ",".join("?" * len(wanted))
    before = "" if learned_before is None else " AND m.created_at < ?"
    with write_transaction(conn):
        rows: list[Any] = conn.execute(
            "SELECT DISTINCT m.id, m.source_message_ids FROM memory_sources s JOIN memories m ON m.id = s.memory_id "
            f"WHERE s.message_id IN ({marks}){before}",
            wanted if learned_before is None else [*wanted, learned_before]).fetchall()
        emptied: list[int] = []
        for memory_id, sources in rows:
            left = [s for s in json.loads(sources) if str(s) not in wanted]
            if left:
                conn.execute("UPDATE memories SET source_message_ids = ? WHERE id = ?", (json.dumps(left), memory_id))
            else:
                emptied.append(memory_id)
        delete(conn, emptied)
    return emptied


def scrub(conn: Connection) -> None:
    """Leave no recoverable trace of deleted text: FTS5 keeps deleted terms in its segments
    until they merge, and old pages linger in the WAL (free pages are zeroed by
    `secure_delete`, set in db.connect)."""
    with write_transaction(conn):
        conn.execute("INSERT INTO memories_fts(memories_fts) VALUES ('optimize')")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def archive(conn: Connection, memory_id: int, reason: str, now: float | None = None) -> None:
    """Take a memory out of retrieval (its FTS row and vector go; the row stays, restorable)."""
    with write_transaction(conn):
        conn.execute("UPDATE memories SET archived_at = ?, archive_reason = ?, embedded = 0, updated_at = ? "
                     "WHERE id = ? AND " + ACTIVE,
                     (time.time() if now is None else now, reason, time.time(), memory_id))
        archived = conn.changes()
        added = removals.add(conn, archived)
        vectors.remove(conn, [memory_id])
    if archived:
        after_commit(conn, lambda: _counts_after_removal(conn, archived, added))


def restore(conn: Connection, memory_id: int, now: float | None = None) -> None:
    """Bring an archived memory back; its vector is rebuilt by the next backfill."""
    now = time.time() if now is None else now
    with write_transaction(conn):
        conn.execute("UPDATE memories SET archived_at = NULL, archive_reason = NULL, last_accessed = ?, "
                     "updated_at = ? WHERE id = ?", (now, now, memory_id))


def touch_many(conn: Connection, recalls: Iterable[tuple[Iterable[int], float]], *, growth: float) -> None:
    """Several recalls' touches (their ids, their time), in order, in one transaction: each
    memory ends as if every recall had been its own transaction (bot/memory/recall/touches.py)."""
    with write_transaction(conn):
        for memory_ids, now in recalls:
            ids = list(memory_ids)
            if ids:  # one statement a recall (not one per memory: each step hands the GIL over)
                conn.execute(
                    "UPDATE memories SET access_count = access_count + 1, last_accessed = max(?, coalesce(last_accessed, 0)), "
                    f"stability = min(stability * ?, ?) WHERE id IN ({','.join('?' * len(ids))}) AND {ACTIVE}",
                    (now, growth, decay.MAX_STABILITY_DAYS, *ids))


def set_vector(conn: Connection, info: vectors.IndexInfo, memory_id: int, vector: Sequence[float]) -> None:
    with write_transaction(conn):
        row = query_one(conn, "SELECT vis_key, created_at FROM memories WHERE id = ? AND " + ACTIVE, (memory_id,))
        if row is not None:  # archived or deleted meanwhile: nothing to index
            vectors.put(conn, info, memory_id, row[0], row[1], vector)


# -- reads -------------------------------------------------------------------

def get(conn: Connection, memory_id: int) -> Memory:
    row = query_one(conn, f"SELECT {COLUMNS} FROM memories WHERE id = ?", (memory_id,))
    if row is None:
        raise MemoryNotFound(f"no memory #{memory_id}")
    return Memory.from_row(row)


def get_many(conn: Connection, memory_ids: Sequence[int]) -> dict[int, Memory]:
    if not memory_ids:
        return {}
    rows = conn.execute(f"SELECT {COLUMNS} FROM memories WHERE id IN ({','.join('?' * len(memory_ids))})",
                        tuple(memory_ids))
    return {row[0]: Memory.from_row(row) for row in rows}


def get_visible(conn: Connection, viewer: Viewer, memory_id: int) -> Memory:
    """The memory if this viewer may see it; otherwise MemoryNotFound (never reveal it exists)."""
    keys = visible_keys(conn, viewer)
    where, params = key_filter(keys)
    row = query_one(conn, f"SELECT {COLUMNS} FROM memories WHERE id = ? AND {where} AND {ACTIVE}",
                    (memory_id, *params))
    if row is None:
        raise MemoryNotFound(f"no memory #{memory_id} here")
    return Memory.from_row(row)


def list_visible(conn: Connection, viewer: Viewer, *, scope: str | None = None, limit: int = 50,
                 offset: int = 0) -> tuple[list[Memory], int]:
    """Active memories this viewer may see, newest first, and how many there are in all."""
    keys = visible_keys(conn, viewer)
    where, params = key_filter(keys)
    sql_filter = f"{where} AND {ACTIVE}"
    if scope is not None:
        if scope not in SCOPES:
            raise ValueError(f"unknown scope {scope!r}")
        sql_filter += " AND scope = ?"
        params = (*params, scope)
    total = query_value(conn, f"SELECT count(*) FROM memories WHERE {sql_filter}", params)
    rows = conn.execute(f"SELECT {COLUMNS} FROM memories WHERE {sql_filter} ORDER BY created_at DESC, id DESC "
                        "LIMIT ? OFFSET ?", (*params, limit, offset))
    return [Memory.from_row(row) for row in rows], total


def memories_of(conn: Connection, user_id: int, scopes: Sequence[str] = ("personal", "room")) -> list[Memory]:
    """What forget-all and export cover: a person's personal memories (learned anywhere) and the
    room memories they taught, archived ones included, oldest first."""
    marks = ",".join("?" * len(scopes))
    rows = conn.execute(f"SELECT {COLUMNS} FROM memories WHERE owner_id = ? AND scope IN ({marks}) ORDER BY id",
                        (user_id, *scopes))
    return [Memory.from_row(row) for row in rows]


def existing_external_ids(conn: Connection, ids: Sequence[str]) -> set[str]:
    """Which of these external ids (of an imported data set) are stored already."""
    if not ids:
        return set()
    rows = conn.execute(f"SELECT external_id FROM memories WHERE external_id IN ({','.join('?' * len(ids))})",
                        list(ids))
    return {row[0] for row in rows}


def unembedded_ids(conn: Connection, limit: int) -> list[tuple[int, str]]:
    return [(row[0], lenient_text(row[1])) for row in conn.execute(
        "SELECT id, CAST(text AS BLOB) FROM memories WHERE embedded = 0 AND " + ACTIVE + " ORDER BY id LIMIT ?",
        (limit,))]


def stats(conn: Connection) -> dict:
    out = {
        "memories": query_value(conn, "SELECT count(*) FROM memories"),
        "active": query_value(conn, "SELECT count(*) FROM memories WHERE " + ACTIVE),
        "archived": query_value(conn, "SELECT count(*) FROM memories WHERE archived_at IS NOT NULL"),
        "embedded": query_value(conn, "SELECT count(*) FROM memories WHERE embedded = 1"),
        "missing_vectors": query_value(conn, "SELECT count(*) FROM memories WHERE embedded = 0 AND " + ACTIVE),
        "links": query_value(conn, "SELECT count(*) FROM memory_links"),
        "by_scope": {row[0]: row[1] for row in conn.execute(
            "SELECT scope, count(*) FROM memories WHERE " + ACTIVE + " GROUP BY scope")},
        "links_by_kind": {row[0]: row[1] for row in conn.execute(
            "SELECT kind, count(*) FROM memory_links GROUP BY kind")},
    }
    info = vectors.index_info(conn)
    out["embedding_model"] = info.model if info else None
    out["embedding_dim"] = info.dim if info else None
    return out
