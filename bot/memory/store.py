"""Plain, synchronous memory storage on one apsw connection.

Each public function that writes is one transaction: the memory row, its FTS row
(kept in sync by triggers), its vector and its links commit or roll back together.
Callers on the event loop reach these through `engine.Engine`, which runs them on
the database thread.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any, Iterable, Sequence

import apsw

from bot.memory import decay, fts, vectors
from bot.memory.db import query_one, query_value
from bot.memory.scope import (
    ACTIVE,
    SCOPES,
    Viewer,
    is_private,
    key_filter,
    memory_key,
    visible_keys,
)

LINK_KINDS = ("co_extracted", "consolidated", "semantic", "superseded_by")
MAX_TEXT_CHARS = 4000

COLUMNS = ("id, text, scope, owner_id, channel_id, guild_id, vis_key, importance, stability, access_count, "
           "last_accessed, created_at, updated_at, archived_at, archive_reason, source_message_ids, "
           "external_id, embedded")


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
        self.text = clean_text(self.text)
        if self.scope not in SCOPES:
            raise ValueError(f"unknown scope {self.scope!r}; use one of {', '.join(SCOPES)}")
        if not (0.0 <= float(self.importance) <= 1.0):
            raise ValueError(f"importance {self.importance!r} must be between 0 and 1")
        self.importance = float(self.importance)
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
        values = list(row)
        values[15] = json.loads(values[15] or "[]")
        values[17] = bool(values[17])
        return cls(*values)

    @property
    def private(self) -> bool:
        """Learned in a private channel (its key names the channel): copies must keep that."""
        return is_private(self.vis_key)

    def retention(self, now: float | None = None) -> float:
        return decay.retention(now or time.time(), self.last_accessed or self.created_at, self.stability)

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
    return None if ts is None else datetime.fromtimestamp(ts, timezone.utc).isoformat(timespec="seconds")


# -- writes ------------------------------------------------------------------

def insert_many(conn: apsw.Connection, memories: Sequence[NewMemory], *, base_stability_days: float,
                vector_info: vectors.IndexInfo | None = None,
                vectors_: Sequence[Sequence[float] | None] | None = None,
                now: float | None = None) -> list[int]:
    """Insert memories (and their vectors, if given) in one transaction."""
    now = time.time() if now is None else now
    ids: list[int] = []
    with conn:
        for index, memory in enumerate(memories):
            created = memory.created_at if memory.created_at is not None else now
            conn.execute(
                "INSERT INTO memories (text, scope, owner_id, channel_id, guild_id, vis_key, importance, "
                "stability, created_at, updated_at, source_message_ids, external_id) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (memory.text, memory.scope, memory.owner_id, memory.channel_id, memory.guild_id,
                 memory.vis_key, memory.importance,
                 decay.initial_stability(memory.importance, base_stability_days), created, now,
                 json.dumps([str(s) for s in memory.source_message_ids]), memory.external_id))
            memory_id = conn.last_insert_rowid()
            ids.append(memory_id)
            vector = vectors_[index] if vectors_ else None
            if vector is not None and vector_info is not None:
                vectors.put(conn, vector_info, memory_id, memory.vis_key, created, vector)
    return ids


def add_link(conn: apsw.Connection, source_id: int, target_id: int, kind: str, weight: float = 1.0,
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


def link_pairwise(conn: apsw.Connection, ids: Sequence[int], kind: str, *, now: float | None = None) -> None:
    """Link memories pairwise (as add_link allows), e.g. the facts of one exchange."""
    unique = list(dict.fromkeys(ids))
    for i, a in enumerate(unique):
        for b in unique[i + 1:]:
            add_link(conn, a, b, kind, now=now)


def delete(conn: apsw.Connection, memory_ids: Iterable[int]) -> int:
    """Hard-delete memories with their FTS rows, vectors and links; returns how many went."""
    ids = list(memory_ids)
    fts.forget_counts(conn)
    with conn:
        vectors.remove(conn, ids)
        removed = 0
        for memory_id in ids:  # links and source rows go by ON DELETE CASCADE, the FTS row by trigger
            conn.execute("DELETE FROM memories WHERE id = ?", (memory_id,))
            removed += conn.changes()
    return removed


def forget_sources(conn: apsw.Connection, message_ids: Sequence[int]) -> list[int]:
    """Messages were deleted: take them out of the memories learned from them, and delete the
    memories that were learned from nothing else (a retraction). Returns the deleted ids."""
    wanted = [str(m) for m in message_ids]
    if not wanted:
        return []
    marks = ",".join("?" * len(wanted))
    with conn:
        rows: list[Any] = conn.execute(
            "SELECT DISTINCT m.id, m.source_message_ids FROM memory_sources s JOIN memories m ON m.id = s.memory_id "
            f"WHERE s.message_id IN ({marks})", wanted).fetchall()
        emptied: list[int] = []
        for memory_id, sources in rows:
            left = [s for s in json.loads(sources) if str(s) not in wanted]
            if left:
                conn.execute("UPDATE memories SET source_message_ids = ? WHERE id = ?", (json.dumps(left), memory_id))
            else:
                emptied.append(memory_id)
        delete(conn, emptied)
    return emptied


def scrub(conn: apsw.Connection) -> None:
    """Leave no recoverable trace of deleted text: FTS5 keeps deleted terms in its segments
    until they merge, and old pages linger in the WAL (free pages are zeroed by
    `secure_delete`, set in db.connect)."""
    conn.execute("INSERT INTO memories_fts(memories_fts) VALUES ('optimize')")
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def archive(conn: apsw.Connection, memory_id: int, reason: str, now: float | None = None) -> None:
    """Take a memory out of retrieval (its FTS row and vector go; the row stays, restorable)."""
    fts.forget_counts(conn)
    with conn:
        conn.execute("UPDATE memories SET archived_at = ?, archive_reason = ?, embedded = 0, updated_at = ? "
                     "WHERE id = ? AND " + ACTIVE,
                     (time.time() if now is None else now, reason, time.time(), memory_id))
        vectors.remove(conn, [memory_id])


def restore(conn: apsw.Connection, memory_id: int, now: float | None = None) -> None:
    """Bring an archived memory back; its vector is rebuilt by the next backfill."""
    now = time.time() if now is None else now
    with conn:
        conn.execute("UPDATE memories SET archived_at = NULL, archive_reason = NULL, last_accessed = ?, "
                     "updated_at = ? WHERE id = ?", (now, now, memory_id))


def touch(conn: apsw.Connection, memory_ids: Iterable[int], *, growth: float, now: float | None = None) -> None:
    """Record a recall: count it, reset the decay clock, strengthen the memory."""
    now = time.time() if now is None else now
    with conn:
        for memory_id in memory_ids:
            conn.execute(
                "UPDATE memories SET access_count = access_count + 1, last_accessed = max(?, coalesce(last_accessed, 0)), "
                "stability = min(stability * ?, ?) WHERE id = ?",
                (now, growth, decay.MAX_STABILITY_DAYS, memory_id))


def set_vector(conn: apsw.Connection, info: vectors.IndexInfo, memory_id: int, vector: Sequence[float]) -> None:
    with conn:
        row = query_one(conn, "SELECT vis_key, created_at FROM memories WHERE id = ? AND " + ACTIVE, (memory_id,))
        if row is not None:  # archived or deleted meanwhile: nothing to index
            vectors.put(conn, info, memory_id, row[0], row[1], vector)


# -- reads -------------------------------------------------------------------

def get(conn: apsw.Connection, memory_id: int) -> Memory:
    row = query_one(conn, f"SELECT {COLUMNS} FROM memories WHERE id = ?", (memory_id,))
    if row is None:
        raise MemoryNotFound(f"no memory #{memory_id}")
    return Memory.from_row(row)


def get_many(conn: apsw.Connection, memory_ids: Sequence[int]) -> dict[int, Memory]:
    if not memory_ids:
        return {}
    rows = conn.execute(f"SELECT {COLUMNS} FROM memories WHERE id IN ({','.join('?' * len(memory_ids))})",
                        tuple(memory_ids))
    return {row[0]: Memory.from_row(row) for row in rows}


def get_visible(conn: apsw.Connection, viewer: Viewer, memory_id: int) -> Memory:
    """The memory if this viewer may see it; otherwise MemoryNotFound (never reveal it exists)."""
    keys = visible_keys(conn, viewer)
    where, params = key_filter(keys)
    row = query_one(conn, f"SELECT {COLUMNS} FROM memories WHERE id = ? AND {where} AND {ACTIVE}",
                    (memory_id, *params))
    if row is None:
        raise MemoryNotFound(f"no memory #{memory_id} here")
    return Memory.from_row(row)


def list_visible(conn: apsw.Connection, viewer: Viewer, *, scope: str | None = None, limit: int = 50,
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


def memories_of(conn: apsw.Connection, user_id: int, scopes: Sequence[str] = ("personal", "room")) -> list[Memory]:
    """What forget-all and export cover: a person's personal memories (learned anywhere) and the
    room memories they taught, archived ones included, oldest first."""
    marks = ",".join("?" * len(scopes))
    rows = conn.execute(f"SELECT {COLUMNS} FROM memories WHERE owner_id = ? AND scope IN ({marks}) ORDER BY id",
                        (user_id, *scopes))
    return [Memory.from_row(row) for row in rows]


def existing_external_ids(conn: apsw.Connection, ids: Sequence[str]) -> set[str]:
    """Which of these external ids (of an imported data set) are stored already."""
    if not ids:
        return set()
    rows = conn.execute(f"SELECT external_id FROM memories WHERE external_id IN ({','.join('?' * len(ids))})",
                        list(ids))
    return {row[0] for row in rows}


def unembedded_ids(conn: apsw.Connection, limit: int) -> list[tuple[int, str]]:
    return [(row[0], row[1]) for row in conn.execute(
        "SELECT id, text FROM memories WHERE embedded = 0 AND " + ACTIVE + " ORDER BY id LIMIT ?", (limit,))]


def stats(conn: apsw.Connection) -> dict:
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
