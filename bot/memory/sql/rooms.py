"""Shared memory under moderation (portable SQL, both backends): per-server settings, who vouched
for a room memory, room claims waiting for a moderator, and the moderators' log.

A room claim waiting for approval is an archived memory whose archive_reason is
`records.PENDING_REASON`. Every path that can surface a memory (recall's keyword, vector and
graph steps, the listings, get_visible) leaves archived memories out already, so a pending claim
reaches nobody until a moderator approves it (it becomes active, with its approval) or rejects
it (it is deleted). Its teacher still finds it in their export and forget-all (memories_of).
The log says who did what to which memory, where and when; never a memory's text.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterable, Sequence

from bot.memory.connection import Connection
from bot.memory.recall.words import tokens
from bot.memory.records import PENDING_REASON, SET, Memory, NewMemory
from bot.memory.scope import ACTIVE, memory_key
from bot.memory.sql.marks import mark_pending
from bot.memory.sql.queries import query_value
from bot.memory.sql.transactions import write_transaction
from bot.memory.storage import storage_of
from bot.memory.writing.rules import normalise

MODERATED, OPEN, OFF = "moderated", "open", "off"
MODES = (MODERATED, OPEN, OFF)
DEFAULT_MODE = MODERATED
ROOM_MODE = "room_memory"          # guild_settings key of the room memory mode
APPROVED = "approved"              # memory_approvals.how of a member's claim a moderator approved
ACTIONS = ("forget", "approve", "reject")
PENDING_TWINS = 200                # pending claims of a channel compared with a new one's text


@dataclass(frozen=True)
class Approval:
    """Who vouched for a room memory: `how` is SET (a moderator taught it) or APPROVED (a
    moderator approved a member's claim); `moderator_id` None once that person was forgotten."""
    how: str
    moderator_id: int | None
    at: float


@dataclass(frozen=True)
class RoomMemory:
    """A room memory of a channel with its approval (None: a member's claim)."""
    memory: Memory
    approval: Approval | None


@dataclass(frozen=True)
class LogEntry:
    """One moderator action: who, when, what (forget, approve, reject, mode:<mode>), which memory, where."""
    id: int
    at: float
    guild_id: int | None
    channel_id: int
    moderator_id: int
    action: str
    memory_id: int | None


# -- per-server settings -------------------------------------------------------------

def guild_setting(conn: Connection, guild_id: int, key: str) -> str | None:
    """A server's setting, or None when nobody has set it."""
    value = query_value(conn, "SELECT value FROM guild_settings WHERE guild_id = ? AND key = ?", (guild_id, key))
    return None if value is None else str(value)


def set_guild_setting(conn: Connection, guild_id: int, key: str, value: str, now: float | None = None) -> None:
    """Set a server's setting (inside the caller's transaction, or as one of its own)."""
    with write_transaction(conn):
        conn.execute("INSERT INTO guild_settings (guild_id, key, value, updated_at) VALUES (?, ?, ?, ?) "
                     "ON CONFLICT (guild_id, key) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at",
                     (guild_id, key, value, time.time() if now is None else now))


def room_mode(conn: Connection, guild_id: int | None) -> str:
    """The server's room memory mode: moderated (the default), open or off."""
    if guild_id is None:
        return DEFAULT_MODE
    value = guild_setting(conn, guild_id, ROOM_MODE)
    return value if value in MODES else DEFAULT_MODE


def set_room_mode(conn: Connection, guild_id: int, mode: str | None, *, moderator_id: int, channel_id: int,
                  now: float | None = None) -> None:
    """Set the server's room memory mode (None: unset it, back to the default) and log who did,
    in one transaction."""
    if mode is not None and mode not in MODES:
        raise ValueError(f"unknown room memory mode {mode!r}; use one of {', '.join(MODES)}")
    now = time.time() if now is None else now
    with write_transaction(conn):
        if mode is None:
            conn.execute("DELETE FROM guild_settings WHERE guild_id = ? AND key = ?", (guild_id, ROOM_MODE))
        else:
            set_guild_setting(conn, guild_id, ROOM_MODE, mode, now)
        log_action(conn, f"mode:{mode or DEFAULT_MODE}", channel_id=channel_id, guild_id=guild_id,
                   moderator_id=moderator_id, memory_id=None, now=now)


# -- approvals --------------------------------------------------------------------------

def vouch(conn: Connection, memory_id: int, how: str, moderator_id: int | None, now: float) -> None:
    """Record that a moderator set or approved a room memory (the first word stands)."""
    conn.execute("INSERT INTO memory_approvals (memory_id, how, moderator_id, approved_at) VALUES (?, ?, ?, ?) "
                 "ON CONFLICT (memory_id) DO NOTHING", (memory_id, how, moderator_id, now))


def settle(conn: Connection, memory_id: int, memory: NewMemory, now: float) -> None:
    """A room memory just inserted takes its standing, inside the caller's transaction: a
    moderator's is vouched for, a claim waiting for one is archived as pending."""
    if memory.standing == SET:
        vouch(conn, memory_id, SET, memory.owner_id, now)
    elif memory.standing is not None:
        storage_of(conn).archive(conn, memory_id, PENDING_REASON, now=now)


def approvals(conn: Connection, memory_ids: Sequence[int]) -> dict[int, Approval]:
    """The approvals of those of the memories that have one, by memory id."""
    if not memory_ids:
        return {}
    rows = conn.execute("SELECT memory_id, how, moderator_id, approved_at FROM memory_approvals "
                        f"WHERE memory_id IN ({','.join('?' * len(memory_ids))})", tuple(memory_ids))
    return {int(row[0]): Approval(str(row[1]), None if row[2] is None else int(row[2]), float(row[3]))
            for row in rows}


def forget_moderator(conn: Connection, user_id: int) -> None:
    """A moderator asked to be forgotten: their approvals stand, without their id."""
    conn.execute("UPDATE memory_approvals SET moderator_id = NULL WHERE moderator_id = ?", (user_id,))


def pending_twin(conn: Connection, vis_key: str, text: str) -> int | None:
    """A claim with the same words already waiting for a moderator under `vis_key`, if any."""
    wanted = normalise(text)
    rows = conn.execute("SELECT id, text FROM memories WHERE vis_key = ? AND archive_reason = ? ORDER BY id DESC "
                        "LIMIT ?", (vis_key, PENDING_REASON, PENDING_TWINS)).fetchall()
    for memory_id, other in rows:
        if normalise(str(other)) == wanted:
            return int(memory_id)
    return None


# -- a channel's room memories, for its moderators ----------------------------------------

def _room_key(channel_id: int) -> str:
    return memory_key("room", None, channel_id, None)


def _with_approvals(conn: Connection, memories: Iterable[Memory]) -> list[RoomMemory]:
    found = list(memories)
    vouched = approvals(conn, [m.id for m in found])
    return [RoomMemory(memory, vouched.get(memory.id)) for memory in found]


def room_page(conn: Connection, channel_id: int, *, pending: bool = False, limit: int = 20,
              offset: int = 0) -> tuple[list[RoomMemory], int]:
    """One page of the channel's active room memories (or, `pending`, of its claims waiting for a
    moderator), newest first, with their approvals; and how many there are."""
    where = "vis_key = ? AND " + ("archive_reason = ? AND archived_at IS NOT NULL" if pending else ACTIVE)
    params: tuple = (_room_key(channel_id), PENDING_REASON) if pending else (_room_key(channel_id),)
    total = int(query_value(conn, f"SELECT count(*) FROM memories WHERE {where}", params, 0))
    ids = [int(row[0]) for row in conn.execute(f"SELECT id FROM memories WHERE {where} ORDER BY id DESC LIMIT ? "
                                               "OFFSET ?", (*params, limit, offset))]
    memories = storage_of(conn).get_many(conn, ids)
    return _with_approvals(conn, (memories[i] for i in ids if i in memories)), total


def room_search(conn: Connection, channel_id: int, text: str, limit: int = 20) -> list[RoomMemory]:
    """The channel's active room memories holding any word of `text`, most relevant first."""
    words = tokens(text)
    if not words:
        return []
    hits = storage_of(conn).keyword_search(conn, words, [_room_key(channel_id)], all_words=False, limit=limit)
    memories = storage_of(conn).get_many(conn, [memory_id for memory_id, _ in hits])
    return _with_approvals(conn, (memories[i] for i, _ in hits if i in memories and memories[i].archived_at is None))


def approve(conn: Connection, memory_id: int, *, channel_id: int, guild_id: int | None, moderator_id: int,
            now: float | None = None) -> Memory | None:
    """A moderator approves a claim waiting in their channel: it becomes an active room memory,
    approved by them, in one transaction with the log. None when no such claim waits there."""
    now = time.time() if now is None else now
    with write_transaction(conn):
        conn.execute("UPDATE memories SET archived_at = NULL, archive_reason = NULL, last_accessed = ?, updated_at = ? "
                     "WHERE id = ? AND vis_key = ? AND archive_reason = ? AND archived_at IS NOT NULL",
                     (now, now, memory_id, _room_key(channel_id), PENDING_REASON))
        if conn.changes() == 0:
            return None
        vouch(conn, memory_id, APPROVED, moderator_id, now)
        log_action(conn, "approve", channel_id=channel_id, guild_id=guild_id, moderator_id=moderator_id,
                   memory_id=memory_id, now=now)
        return storage_of(conn).get(conn, memory_id)


def _remove(conn: Connection, memory_id: int, action: str, where: str, params: tuple, *, channel_id: int,
            guild_id: int | None, moderator_id: int, now: float | None) -> Memory | None:
    now = time.time() if now is None else now
    with write_transaction(conn):
        found = query_value(conn, f"SELECT id FROM memories WHERE id = ? AND vis_key = ? AND {where}",
                            (memory_id, _room_key(channel_id), *params))
        if found is None:
            return None
        memory = storage_of(conn).get(conn, memory_id)
        storage_of(conn).delete(conn, [memory_id])
        mark_pending(conn)  # its words leave the files at the next maintenance, as a /memory forget's do
        log_action(conn, action, channel_id=channel_id, guild_id=guild_id, moderator_id=moderator_id,
                   memory_id=memory_id, now=now)
    return memory


def reject(conn: Connection, memory_id: int, *, channel_id: int, guild_id: int | None, moderator_id: int,
           now: float | None = None) -> Memory | None:
    """A moderator rejects a claim waiting in their channel: it is deleted, in one transaction
    with the log. Returns it, or None when no such claim waits there."""
    return _remove(conn, memory_id, "reject", "archive_reason = ? AND archived_at IS NOT NULL", (PENDING_REASON,),
                   channel_id=channel_id, guild_id=guild_id, moderator_id=moderator_id, now=now)


def forget(conn: Connection, memory_id: int, *, channel_id: int, guild_id: int | None, moderator_id: int,
           now: float | None = None) -> Memory | None:
    """A moderator forgets a room memory of their channel (shown, waiting or archived), in one
    transaction with the log. Returns it, or None when the channel has no such memory."""
    return _remove(conn, memory_id, "forget", "1 = 1", (), channel_id=channel_id, guild_id=guild_id,
                   moderator_id=moderator_id, now=now)


# -- the moderators' log ----------------------------------------------------------------

def log_action(conn: Connection, action: str, *, channel_id: int, guild_id: int | None, moderator_id: int,
               memory_id: int | None, now: float | None = None) -> None:
    """Record one moderator action (inside the caller's transaction): never a memory's text."""
    conn.execute("INSERT INTO moderation_log (at, guild_id, channel_id, moderator_id, action, memory_id) "
                 "VALUES (?, ?, ?, ?, ?, ?)",
                 (time.time() if now is None else now, guild_id, channel_id, moderator_id, action, memory_id))


def log_entries(conn: Connection, channel_id: int, limit: int = 20) -> list[LogEntry]:
    """The channel's latest moderator actions, newest first."""
    rows = conn.execute("SELECT id, at, guild_id, channel_id, moderator_id, action, memory_id FROM moderation_log "
                        "WHERE channel_id = ? ORDER BY id DESC LIMIT ?", (channel_id, limit))
    return [LogEntry(int(r[0]), float(r[1]), None if r[2] is None else int(r[2]), int(r[3]), int(r[4]), str(r[5]),
                     None if r[6] is None else int(r[6])) for r in rows]


# -- names, for attributing what is recalled ---------------------------------------------

def last_names(conn: Connection, channel_id: int, user_ids: Iterable[int]) -> dict[int, str]:
    """The display name each person last used in this channel's history (none once their messages
    are gone: forgotten, or pruned)."""
    names: dict[int, str] = {}
    for user_id in dict.fromkeys(user_ids):
        name = query_value(conn, "SELECT author_name FROM messages WHERE channel_id = ? AND author_id = ? AND "
                                 "role = 'user' AND deleted_at IS NULL ORDER BY created_at DESC, id DESC LIMIT 1",
                           (channel_id, user_id))
        if name:
            names[user_id] = str(name)
    return names
