"""What people control about their own memories beyond /memory forget: pausing Muninn's memory
of them, finding the personal memories a message or a phrase produced, and forgetting those.

Plain synchronous functions on one connection (SQLite, or PostgreSQL through PgConnection's
portable SQL); deleting and scrubbing go through the connection's storage backend.
"""
from __future__ import annotations

import time
from typing import Any, Sequence

from bot.memory import records
from bot.memory.connection import Connection
from bot.memory.scope import ACTIVE
from bot.memory.sql import store
from bot.memory.sql.queries import query_one
from bot.memory.sql.transactions import write_transaction
from bot.memory.storage import storage_of


def pause(conn: Connection, user_id: int, now: float | None = None) -> bool:
    """Pause; False when it already was (the first pause time and notice state are kept)."""
    with write_transaction(conn):
        conn.execute("INSERT OR IGNORE INTO memory_pauses (user_id, paused_at) VALUES (?, ?)",
                     (user_id, time.time() if now is None else now))
        return conn.changes() > 0


def resume(conn: Connection, user_id: int) -> bool:
    """Resume; False when it was not paused."""
    with write_transaction(conn):
        conn.execute("DELETE FROM memory_pauses WHERE user_id = ?", (user_id,))
        return conn.changes() > 0


def paused_users(conn: Connection) -> set[int]:
    """The ids of everyone whose memory is paused."""
    return {row[0] for row in conn.execute("SELECT user_id FROM memory_pauses")}


def take_pause_notice(conn: Connection, user_id: int) -> bool:
    """True once per pause: the first time Muninn answers someone whose memory is paused."""
    with write_transaction(conn):
        conn.execute("UPDATE memory_pauses SET notified = 1 WHERE user_id = ? AND notified = 0", (user_id,))
        return conn.changes() > 0


def personal_from_messages(conn: Connection, owner_id: int, message_ids: Sequence[int]) -> list[records.Memory]:
    """The owner's active personal memories learned from any of these messages."""
    wanted = [str(m) for m in message_ids]
    if not wanted:
        return []
    marks = ",".join("?" * len(wanted))
    rows: list[Any] = conn.execute(
        f"SELECT DISTINCT m.id FROM memory_sources s JOIN memories m ON m.id = s.memory_id "
        f"WHERE s.message_id IN ({marks}) AND m.owner_id = ? AND m.scope = 'personal' AND m.{ACTIVE} "
        "ORDER BY m.id", (*wanted, owner_id)).fetchall()
    found = store.get_many(conn, [row[0] for row in rows])
    return [found[row[0]] for row in rows if row[0] in found]


def own_memory(conn: Connection, owner_id: int, memory_id: int) -> records.Memory:
    """A memory that is this person's data: personal, a room memory they taught (alone or with
    others: sql/teachers.py), or another's that mentions them; archived or not; MemoryNotFound
    otherwise, with no hint whether the id exists."""
    row = query_one(conn, f"SELECT {records.COLUMNS} FROM memories WHERE id = ? AND scope IN ('personal', 'room') "
                          "AND (owner_id = ? OR (scope = 'room' AND EXISTS (SELECT 1 FROM memory_teachers t "
                          "WHERE t.memory_id = memories.id AND t.user_id = ?)) "
                          "OR id IN (SELECT memory_id FROM memory_mentions WHERE user_id = ?))",
                    (memory_id, owner_id, owner_id, owner_id))
    if row is None:
        raise records.MemoryNotFound(f"no memory #{memory_id} of yours")
    return records.Memory.from_row(row)


def forget_personal(conn: Connection, owner_id: int, memory_ids: Sequence[int]) -> int:
    """Delete those of `memory_ids` that are the owner's personal memories, and scrub the
    database so their text is not recoverable. Returns how many went."""
    marks = ",".join("?" * len(memory_ids)) or "NULL"
    ids = [row[0] for row in conn.execute(
        f"SELECT id FROM memories WHERE id IN ({marks}) AND owner_id = ? AND scope = 'personal'",
        (*memory_ids, owner_id))]
    storage = storage_of(conn)
    removed = storage.delete(conn, ids)
    if removed:
        storage.scrub(conn, ("memories",))
    return removed


def last_message_of(conn: Connection, channel_id: int, author_id: int, before: int | None = None) -> int | None:
    """The id of the author's latest message in the channel's history (before message `before`)."""
    row = query_one(conn, "SELECT id FROM messages WHERE channel_id = ? AND author_id = ? AND role = 'user' "
                          "AND deleted_at IS NULL AND (? IS NULL OR id != ?) ORDER BY created_at DESC, id DESC LIMIT 1",
                    (channel_id, author_id, before, before))
    return row[0] if row else None


def drop_own_message(conn: Connection, author_id: int, message_id: int) -> bool:
    """Take one of the author's messages out of the conversation history, leaving no trace."""
    with write_transaction(conn):
        conn.execute("DELETE FROM messages WHERE id = ? AND author_id = ?", (message_id, author_id))
        dropped = conn.changes() > 0
    if dropped:
        storage_of(conn).scrub(conn, ("messages",))
    return dropped
