"""Plain, synchronous memory storage on one apsw connection.

Each public function that writes is one transaction: the memory row, its FTS row
(kept in sync by triggers), its vector and its links commit or roll back together.
Callers on the event loop reach these through `engine.Engine`, which runs them on
the database thread.
"""
from __future__ import annotations

import json
import time
from typing import Any, Iterable, Iterator, Sequence

from bot.memory import decay, records
from bot.memory.connection import Connection
from bot.memory.recall import keywords
from bot.memory.records import COLUMNS, LINK_KINDS, Memory, MemoryNotFound, NewMemory, lenient_text
from bot.memory.scope import (
    ACTIVE,
    SCOPES,
    Viewer,
    key_filter,
    visible_keys,
)
from bot.memory.sql import removals, teachers
from bot.memory.sql.marks import mark_pending
from bot.memory.sql.queries import query_one, query_value
from bot.memory.sql.transactions import after_commit, write_transaction
from bot.memory.sqlite import vec0 as vectors

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
                "stability, created_at, updated_at, source_message_ids, external_id, happens_on) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
                (memory.text, memory.scope, memory.owner_id, memory.channel_id, memory.guild_id,
                 memory.vis_key, memory.importance,
                 decay.initial_stability(memory.importance, base_stability_days), created, now,
                 json.dumps([str(s) for s in memory.source_message_ids]), memory.external_id, memory.happens_on)))
            ids.append(memory_id)
            if memory.scope == "room" and memory.owner_id is not None:  # its first teacher (sql/teachers.py)
                conn.execute("INSERT INTO memory_teachers (memory_id, user_id, first_taught_at, source_message_ids) "
                             "VALUES (?, ?, ?, ?)", (memory_id, memory.owner_id, created,
                                                     json.dumps([str(s) for s in memory.source_message_ids])))
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
    keywords.forget_counts(conn, removed)
    removals.seen_own(keywords.database_of(conn), added, removed)


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
    (a retraction); a room memory goes when no teacher is left (sql/teachers.py: another
    person who taught it keeps it). Returns the deleted ids."""
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
        emptied = retract(conn, [(int(memory_id), sources) for memory_id, sources in rows], wanted)
        delete(conn, emptied)
    return emptied


def retract(conn: Connection, rows: Sequence[tuple[int, Any]], wanted: Sequence[str]) -> list[int]:
    """forget_sources' rule for the memories learned from deleted messages (`rows`: id and
    JSON sources), inside the caller's transaction: the messages leave each memory's sources and
    its teachers'; returns the memories to delete: those with teachers when none is left, the
    others when no source is left (both backends)."""
    taught, orphaned = teachers.take_back(conn, [memory_id for memory_id, _ in rows], wanted)
    emptied: list[int] = []
    for memory_id, sources in rows:
        left = [s for s in records._id_list(sources) if str(s) not in wanted]
        if memory_id in orphaned or (memory_id not in taught and not left):
            emptied.append(memory_id)
        else:
            conn.execute("UPDATE memories SET source_message_ids = ? WHERE id = ?", (json.dumps(left), memory_id))
    return emptied


TRUNCATE_ATTEMPTS = 3  # each waits up to the busy timeout for readers on an older snapshot


def scrub(conn: Connection) -> None:
    """Leave no recoverable trace of deleted text: FTS5 keeps deleted terms in its segments
    until they merge, and old pages linger in the WAL (free pages are zeroed by
    `secure_delete`, set in db.connect)."""
    with write_transaction(conn):
        conn.execute("INSERT INTO memories_fts(memories_fts) VALUES ('optimize')")
    if not truncate_wal(conn):
        with write_transaction(conn):
            mark_pending(conn)  # the next maintenance run scrubs again


def truncate_wal(conn: Connection, attempts: int = TRUNCATE_ATTEMPTS) -> bool:
    """Copy the WAL into the database file and empty it, so the old pages it holds (deleted words
    among them) are gone. A reader still on an older snapshot (a long read: the vector cache
    loading a big key) keeps the WAL from being emptied beyond the busy timeout: try again a few
    times. False when a reader held on throughout (the caller leaves the scrub for later)."""
    for attempt in range(attempts):
        if attempt:
            time.sleep(0.2 * attempt)
        busy = query_one(conn, "PRAGMA wal_checkpoint(TRUNCATE)")
        if busy is None or not busy[0]:
            return True
    return False


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
    """Store or replace an active memory's vector in vec0 (SQLite), in one
    transaction; a memory archived or deleted meanwhile is skipped."""
    with write_transaction(conn):
        row = query_one(conn, "SELECT vis_key, created_at FROM memories WHERE id = ? AND " + ACTIVE, (memory_id,))
        if row is not None:  # archived or deleted meanwhile: nothing to index
            vectors.put(conn, info, memory_id, row[0], row[1], vector)


# -- reads -------------------------------------------------------------------

def get(conn: Connection, memory_id: int) -> Memory:
    """A memory by id, archived or not, with no scope check; MemoryNotFound when there is none."""
    row = query_one(conn, f"SELECT {COLUMNS} FROM memories WHERE id = ?", (memory_id,))
    if row is None:
        raise MemoryNotFound(f"no memory #{memory_id}")
    return Memory.from_row(row)


def get_many(conn: Connection, memory_ids: Sequence[int]) -> dict[int, Memory]:
    """Those of `memory_ids` that exist, by id, archived ones included, with no scope check."""
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
    """What forget-all and export cover: a person's personal memories (learned anywhere), the
    room memories they taught (alone or with others: sql/teachers.py) and the memories of others
    that mention them (memory_mentions), archived ones included, oldest first."""
    marks = ",".join("?" * len(scopes))
    taught = ("OR (scope = 'room' AND id IN (SELECT memory_id FROM memory_teachers WHERE user_id = ?))"
              if "room" in scopes else "")
    rows = conn.execute(f"SELECT {COLUMNS} FROM memories WHERE (owner_id = ? AND scope IN ({marks})) {taught} "
                        f"OR (scope IN ({marks}) AND id IN (SELECT memory_id FROM memory_mentions WHERE user_id = ?)) "
                        "ORDER BY id", (user_id, *scopes, *([user_id] if taught else []), *scopes, user_id))
    return [Memory.from_row(row) for row in rows]


def taught_since(conn: Connection, owner_id: int, channel_id: int, since: float) -> int:
    """How many memories `owner_id` taught in `channel_id` (a DM's included) that were stored at or
    after `since`: their personal and room memories learned there, archived ones included (a fact
    later replaced was still taught). Portable SQL, both backends; the (owner_id, channel_id,
    created_at) index answers it without reading the memories."""
    return int(query_value(conn, "SELECT count(*) FROM memories WHERE owner_id = ? AND channel_id = ? AND created_at >= ?",
                           (owner_id, channel_id, since), 0))


def add_mentions(conn: Connection, memory_id: int, user_ids: Sequence[int]) -> None:
    """Record that the memory names these people (inside the caller's transaction)."""
    for user_id in user_ids:
        conn.execute("INSERT INTO memory_mentions (memory_id, user_id) VALUES (?, ?) ON CONFLICT DO NOTHING",
                     (memory_id, user_id))


def copy_mentions(conn: Connection, from_ids: Sequence[int], to_id: int) -> None:
    """The memory `to_id` names everyone the memories `from_ids` name (a consolidation's survivor)."""
    if from_ids:
        conn.execute("INSERT INTO memory_mentions (memory_id, user_id) SELECT DISTINCT ?, user_id FROM memory_mentions "
                     f"WHERE memory_id IN ({','.join('?' * len(from_ids))}) ON CONFLICT DO NOTHING",
                     (to_id, *from_ids))


def mentioning(conn: Connection, user_id: int) -> list[Memory]:
    """Other people's memories that mention this person (memory_mentions), archived ones included."""
    rows = conn.execute(f"SELECT {COLUMNS} FROM memories WHERE (owner_id IS NULL OR owner_id != ?) AND id IN "
                        "(SELECT memory_id FROM memory_mentions WHERE user_id = ?) ORDER BY id", (user_id, user_id))
    return [Memory.from_row(row) for row in rows]


def mentioned(conn: Connection, memory_id: int) -> set[int]:
    """The ids of the people a memory mentions besides its owner."""
    return {row[0] for row in conn.execute("SELECT user_id FROM memory_mentions WHERE memory_id = ?", (memory_id,))}


def existing_external_ids(conn: Connection, ids: Sequence[str]) -> set[str]:
    """Which of these external ids (of an imported data set) are stored already."""
    if not ids:
        return set()
    rows = conn.execute(f"SELECT external_id FROM memories WHERE external_id IN ({','.join('?' * len(ids))})",
                        list(ids))
    return {row[0] for row in rows}


def unembedded_ids(conn: Connection, limit: int) -> list[tuple[int, str]]:
    """Up to `limit` active memories without a vector, as (id, text), lowest id first (records.lenient_text)."""
    return [(row[0], lenient_text(row[1])) for row in conn.execute(
        "SELECT id, CAST(text AS BLOB) FROM memories WHERE embedded = 0 AND " + ACTIVE + " ORDER BY id LIMIT ?",
        (limit,))]


def stats(conn: Connection) -> dict:
    """The counts `muninn stats` shows: memories (all, active, archived, embedded, active without a vector),
    links, active memories by scope, links by kind, and vec0's index model and dimension (None without one)."""
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
