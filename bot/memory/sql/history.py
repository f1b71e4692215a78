"""The local channel history the prompt is built from, and per-channel options.

Plain synchronous functions on one apsw connection (callers on the event loop go
through `Engine.read`/`Engine.write`). Rows mirror Discord messages by id; `muninn chat` uses small
local ids, which can never collide with Discord snowflakes (those are above 2^22).
A deleted message keeps its row (so a late edit event cannot resurrect it) but loses
its text: Muninn should not remember what a person took back. Each channel keeps its
last `keep` messages (`prune`); older ones are deleted.
"""
from __future__ import annotations

import enum
import time
from dataclasses import dataclass
from typing import Sequence

from bot.memory.connection import Connection
from bot.memory.sql.marks import MESSAGES_PENDING, mark_pending
from bot.memory.sql.queries import query_one, query_value
from bot.memory.sql.store import taught_anything
from bot.memory.sql.transactions import write_transaction
from bot.memory.storage import storage_of

ROLES = ("user", "assistant")


@dataclass(frozen=True)
class HistoryMessage:
    """One row of a channel's history: a person's message (role
    "user") or Muninn's reply ("assistant"); times in unix seconds."""
    id: int
    channel_id: int
    guild_id: int | None
    author_id: int
    author_name: str
    role: str
    content: str
    created_at: float
    edited_at: float | None = None


COLUMNS = "id, channel_id, guild_id, author_id, author_name, role, content, created_at, edited_at"


def storable(text: str) -> str:
    """Text both backends can store: a lone surrogate (which Discord's JSON can carry) becomes '?'
    instead of failing the write with UnicodeEncodeError, and NUL (PostgreSQL's text refuses
    it) goes, as it does from memories (records.clean_text)."""
    return text.encode("utf-8", "replace").decode("utf-8").replace("\x00", "")


def record(conn: Connection, *, channel_id: int, guild_id: int | None, author_id: int, author_name: str,
           role: str, content: str, created_at: float | None = None, message_id: int | None = None,
           reply_to: int | None = None, reply_to_author: int | None = None,
           context_authors: Sequence[int] = ()) -> int:
    """Store one message (idempotent: a re-delivered Discord message is ignored); returns its id.
    With no `message_id` a local id is allocated (`muninn chat`, replies that were not posted).
    `context_authors`, for one of Muninn's replies: the people whose messages were in the
    conversation it answered from (`reply_context`: their forget-all empties it, whatever the
    history keeps by then)."""
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}")
    created_at = time.time() if created_at is None else created_at
    content, author_name = storable(content), storable(author_name)
    authors = list(dict.fromkeys(int(a) for a in [*context_authors, *([reply_to_author] if reply_to_author else [])]))
    with write_transaction(conn):
        row_id: int = next_local_id(conn) if message_id is None else message_id
        conn.execute(
            "INSERT INTO messages (id, channel_id, guild_id, author_id, author_name, role, content, created_at, "
            "reply_to, reply_to_author) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO NOTHING",
            (row_id, channel_id, guild_id, author_id, author_name, role, content, created_at, reply_to,
             reply_to_author))
        if role == "assistant" and authors:  # one statement for all of them (one round trip on PostgreSQL)
            conn.execute("INSERT INTO reply_context (reply_id, author_id) VALUES "
                         + ", ".join(["(?, ?)"] * len(authors)) + " ON CONFLICT DO NOTHING",
                         [value for author in authors for value in (row_id, author)])
    return row_id


def next_local_id(conn: Connection) -> int:
    """Ids for messages that have no Discord id: small numbers, below any snowflake."""
    return query_value(conn, "SELECT coalesce(max(id), 0) + 1 FROM messages WHERE id < ?", (1 << 22,))


class Edit(enum.Enum):
    """What `edit` did to a message."""
    UNKNOWN = "unknown"        # not in the history, or deleted: nothing changed
    SAME_WORDS = "same words"  # Discord also sends edits of embeds and pins: only edited_at moved
    NEW_WORDS = "new words"
    WORDS_DROPPED = "words dropped"  # new words of someone who paused Muninn's memory: not kept, the old go


def edit(conn: Connection, message_id: int, content: str, edited_at: float | None = None) -> Edit:
    """Replace the text of a message we know (not of a deleted one). The old text goes as a
    deleted message's does: out of the files too, at the next maintenance (`marks.mark_pending`:
    the row's old version stays in SQLite's WAL and in PostgreSQL's table file until a scrub).
    A message of someone who paused Muninn's memory keeps neither: the old words were taken back
    by the edit, and the new ones are said while Muninn keeps nothing of what they say (as their
    new messages are never recorded), so the message goes as a deleted one does."""
    content = storable(content)
    when = time.time() if edited_at is None else edited_at
    with write_transaction(conn):
        old = query_one(conn, "SELECT m.content, p.user_id FROM messages m LEFT JOIN memory_pauses p "
                        "ON p.user_id = m.author_id WHERE m.id = ? AND m.deleted_at IS NULL", (message_id,))
        if old is None:
            return Edit.UNKNOWN
        if old[0] == content:
            conn.execute("UPDATE messages SET edited_at = ? WHERE id = ?", (when, message_id))
            return Edit.SAME_WORDS
        if old[1] is not None:
            conn.execute("UPDATE messages SET content = '', edited_at = ?, deleted_at = ? WHERE id = ?",
                         (when, when, message_id))
            kind = Edit.WORDS_DROPPED
        else:
            conn.execute("UPDATE messages SET content = ?, edited_at = ? WHERE id = ?", (content, when, message_id))
            kind = Edit.NEW_WORDS
        mark_pending(conn, MESSAGES_PENDING)  # facts learned from the old words mark their own (forget_sources)
    return kind


@dataclass(frozen=True)
class Edited:
    """What recording an edit did, read in the transaction that did it."""
    kind: Edit
    taken_back: tuple[int, ...] = ()         # memories learned from the old words alone: deleted
    message: HistoryMessage | None = None    # NEW_WORDS: the message, with its new words
    reply: HistoryMessage | None = None      # Muninn's reply to it; None: it was never answered
    before: tuple[HistoryMessage, ...] = ()  # the conversation before it (who took part)


def edit_and_take_back(conn: Connection, message_id: int, content: str, edited_at: float | None = None,
                       context: int = 0) -> Edited:
    """`edit`, and in the same transaction take back what the old words alone taught
    (`forget_sources`; also for a message the history no longer holds: pruned, it may still have
    taught facts). For new words of a message Muninn answered, it returns what extracting them
    again needs (the message, the reply, `context` messages before it): the pipeline queues them
    as it queues a new message. An edit of a message Muninn never stored and that taught nothing
    takes no write lock.

    With no old words to compare, a message the history no longer holds is taken back from only
    for an edit (`edited_at` given), and only what was learned before `edited_at`: Discord also
    sends updates for pins, link previews and threads, carrying the message's last edit time, and
    what was learned after that edit came from the words it still has."""
    known = query_one(conn, "SELECT 1 FROM messages WHERE id = ? AND deleted_at IS NULL", (message_id,))
    learned_before = None if known is not None else edited_at
    if known is None and (edited_at is None or not taught_anything(conn, [message_id], learned_before)):
        return Edited(Edit.UNKNOWN)
    with write_transaction(conn):
        kind = edit(conn, message_id, content, edited_at)
        if kind is Edit.SAME_WORDS:
            return Edited(kind)
        taken_back = take_back(conn, [message_id], learned_before)
        message = get(conn, message_id) if kind is Edit.NEW_WORDS else None
        if message is None:
            return Edited(kind, tuple(taken_back))
        # reply_to has no index: the (channel_id, created_at) one finds the messages after it
        row = query_one(conn, f"SELECT {COLUMNS} FROM messages WHERE channel_id = ? AND created_at >= ? "
                        "AND reply_to = ? AND role = 'assistant' AND deleted_at IS NULL ORDER BY created_at, id "
                        "LIMIT 1", (message.channel_id, message.created_at, message_id))
        return Edited(kind, tuple(taken_back), message, None if row is None else HistoryMessage(*row),
                      tuple(recent(conn, message.channel_id, context, before=message)))


def delete(conn: Connection, message_ids: list[int] | tuple[int, ...],
           deleted_at: float | None = None) -> int:
    """Mark messages deleted and drop their text (from the files too, at the next maintenance:
    `marks.mark_pending`); returns how many were known."""
    now = time.time() if deleted_at is None else deleted_at
    changed = 0
    ids = [int(i) for i in message_ids]
    if not ids or query_value(conn, f"SELECT count(*) FROM messages WHERE id IN ({','.join('?' * len(ids))}) "
                              "AND deleted_at IS NULL", ids) == 0:
        return 0  # read first: a message Muninn never stored (or deleted already) takes no write lock
    with write_transaction(conn):
        for message_id in message_ids:
            conn.execute("UPDATE messages SET content = '', deleted_at = ? WHERE id = ? AND deleted_at IS NULL",
                         (now, message_id))
            changed += conn.changes()
        if changed:
            mark_pending(conn, MESSAGES_PENDING)
    return changed


def delete_and_take_back(conn: Connection, message_ids: list[int] | tuple[int, ...],
                         deleted_at: float | None = None) -> int:
    """`delete`, and in the same transaction take back what those messages alone taught (also
    for messages the history no longer holds): a crash between the two cannot leave a deleted
    message's facts behind. Returns how many history rows were marked. Messages Muninn never
    stored and that taught nothing take no write lock."""
    ids = [int(i) for i in message_ids]
    if not taught_anything(conn, ids):
        return delete(conn, ids, deleted_at)  # it reads first too: no write lock for what it never stored
    with write_transaction(conn):
        removed = delete(conn, ids, deleted_at)
        take_back(conn, ids)
    return removed


def forget_author(conn: Connection, author_id: int) -> int:
    """Erase a person from the history: their messages everywhere, Muninn's replies to them
    (which may repeat what they said), and whole DM conversations with them. Returns rows removed."""
    with write_transaction(conn):
        dm_channels = [row[0] for row in conn.execute(
            "SELECT DISTINCT channel_id FROM messages WHERE author_id = ? AND guild_id IS NULL", (author_id,))]
        conn.execute("DELETE FROM messages WHERE reply_to_author = ?", (author_id,))
        removed = conn.changes()
        conn.execute("DELETE FROM messages WHERE author_id = ?", (author_id,))
        removed += conn.changes()
        for channel_id in dm_channels:
            conn.execute("DELETE FROM messages WHERE channel_id = ? AND guild_id IS NULL", (channel_id,))
            removed += conn.changes()
    return removed


def remove(conn: Connection, message_ids: list[int] | tuple[int, ...]) -> int:
    """Delete rows outright (no tombstone); returns how many went."""
    removed = 0
    with write_transaction(conn):
        for message_id in message_ids:
            conn.execute("DELETE FROM messages WHERE id = ?", (message_id,))
            removed += conn.changes()
    return removed


def prune(conn: Connection, channel_id: int, keep: int) -> int:
    """Delete all but the newest `keep` messages of a channel; returns how many went.
    Cheap: it walks `keep` entries of the (channel_id, created_at) index."""
    with write_transaction(conn):
        conn.execute(
            "DELETE FROM messages WHERE id IN (SELECT id FROM messages WHERE channel_id = ? "
            "ORDER BY created_at DESC, id DESC LIMIT -1 OFFSET ?)", (channel_id, keep))
        removed = conn.changes()
    return removed


def prune_all(conn: Connection, keep: int) -> int:
    """`prune` every channel (for maintenance, or after lowering MUNINN_HISTORY_KEEP)."""
    channels = [row[0] for row in conn.execute(
        "SELECT channel_id FROM messages GROUP BY channel_id HAVING count(*) > ?", (keep,))]
    return sum(prune(conn, channel_id, keep) for channel_id in channels)


def get(conn: Connection, message_id: int) -> HistoryMessage | None:
    """A message by id, deleted ones included (their content empty), or None when the history does not hold it."""
    row = query_one(conn, f"SELECT {COLUMNS} FROM messages WHERE id = ?", (message_id,))
    return None if row is None else HistoryMessage(*row)


@dataclass(frozen=True)
class Linked:
    """A message of the history with what it answers (`reply_to`: for Muninn's replies, the
    message it answered) and whether it was deleted (its content is then empty)."""
    message: HistoryMessage
    reply_to: int | None
    deleted: bool


def in_channel(conn: Connection, channel_id: int, message_id: int) -> Linked | None:
    """The message if the history holds it in that channel (deleted ones included), else None."""
    row = query_one(conn, f"SELECT {COLUMNS}, reply_to, deleted_at FROM messages WHERE id = ? AND channel_id = ?",
                    (message_id, channel_id))
    if row is None:
        return None
    return Linked(HistoryMessage(*row[:-2]), None if row[-2] is None else int(row[-2]), row[-1] is not None)


def is_assistant_message(conn: Connection, message_id: int) -> bool:
    """Whether the id is one of Muninn's replies in the history (False when the history does not hold it)."""
    return query_value(conn, "SELECT 1 FROM messages WHERE id = ? AND role = 'assistant'", (message_id,)) == 1


def recent(conn: Connection, channel_id: int, limit: int, *, before: HistoryMessage | None = None
           ) -> list[HistoryMessage]:
    """The last `limit` messages of a channel, oldest first, leaving out deleted ones.

    With `before`, the context for answering that message: it is left out itself, and so
    are people's messages that came after it; Muninn's own replies are kept even when
    they were posted after it (it is answered in turn, after the earlier ones)."""
    if limit <= 0:
        return []
    sql = f"SELECT {COLUMNS} FROM messages WHERE channel_id = ? AND deleted_at IS NULL"
    params: list = [channel_id]
    if before is not None:
        sql += " AND id != ? AND (role = 'assistant' OR created_at < ? OR (created_at = ? AND id < ?))"
        params += [before.id, before.created_at, before.created_at, before.id]
    sql += " ORDER BY created_at DESC, id DESC LIMIT ?"
    params.append(limit)
    rows = [HistoryMessage(*row) for row in conn.execute(sql, params)]
    rows.reverse()
    return rows


def take_back(conn: Connection, message_ids: Sequence[int], learned_before: float | None = None) -> list[int]:
    """Messages were deleted or their words edited: take back what was learned from them alone
    (`Storage.forget_sources`; only memories learned before `learned_before`, when given) and
    leave their facts' words for maintenance to scrub. Runs inside the caller's transaction (a
    savepoint there), so the history's change and the take-back land together; returns the
    deleted memory ids. Read first: no write lock for what taught nothing."""
    ids = list(message_ids)
    if not taught_anything(conn, ids, learned_before):
        return []
    with write_transaction(conn):
        forgotten = storage_of(conn).forget_sources(conn, ids, learned_before)
        if forgotten:
            mark_pending(conn)
    return forgotten


def of_person(conn: Connection, user_id: int) -> list[HistoryMessage]:
    """What `forget_author` would erase of a person, oldest first, for their data export: their
    messages everywhere, Muninn's replies to them, and whole DM conversations with them (deleted
    messages, whose text is gone, left out)."""
    dm_channels = [row[0] for row in conn.execute(
        "SELECT DISTINCT channel_id FROM messages WHERE author_id = ? AND guild_id IS NULL", (user_id,))]
    in_dms = f" OR (guild_id IS NULL AND channel_id IN ({','.join('?' * len(dm_channels))}))" if dm_channels else ""
    rows = conn.execute(f"SELECT {COLUMNS} FROM messages WHERE deleted_at IS NULL AND "
                        f"(author_id = ? OR reply_to_author = ?{in_dms}) ORDER BY created_at, id",
                        (user_id, user_id, *dm_channels))
    return [HistoryMessage(*row) for row in rows]
