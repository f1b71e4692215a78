"""/memory forget-all: a person's memories, messages and words out of the database, in one
transaction (the scrub after it is the caller's: bot/memory/messages.py). Portable SQL.

What goes:
- their personal memories, learned anywhere;
- the room memories they taught that nobody else taught (sql/teachers.py); one that others
  taught too stays, without them: their messages leave its sources, the earliest other teacher
  owns it;
- their messages everywhere, Muninn's replies to them, and whole DM conversations with them
  (history.forget_author);
- Muninn's replies to other people that may repeat their words, wherever they were said: each
  written while one of their messages was in its conversation (`reply_context`, recorded with
  the reply, so a history pruned since does not hide it), and each holding a distinctive run of
  their words or a rare word of theirs (bot/memory/echoes.py) from their messages or from the
  memories that go. Those replies are emptied, as a deleted message is: the row stays (still
  Muninn's, so a reply to it is still a reply to Muninn), its text goes, and no prompt shows it.
Facts other people's messages taught are theirs and stay. What Muninn recalled for a prompt is
never stored.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

from bot.memory.connection import Connection
from bot.memory.echoes import TheirWords
from bot.memory.sql import history, rooms, store, teachers
from bot.memory.sql.marks import mark_pending
from bot.memory.sql.transactions import write_transaction
from bot.memory.storage import storage_of

CHUNK = 500  # ids per statement (well under both backends' limits on parameters)


@dataclass(frozen=True)
class Forgotten:
    """What forgetting a person removed."""
    personal: int     # their personal memories
    taught: int       # room memories only they taught
    messages: int     # history rows: theirs, Muninn's replies to them, whole DM conversations with them
    shared: int = 0   # room memories others taught too: kept, without them
    replies: int = 0  # Muninn's replies to others that may have repeated their words: emptied
    mentioning: int = 0  # other people's memories that mentioned them: deleted


def forget_person(conn: Connection, user_id: int, now: float | None = None) -> Forgotten:
    """Everything above, in one transaction (no scrub)."""
    storage = storage_of(conn)
    with write_transaction(conn):
        said = [(int(row[0]), str(row[1])) for row in conn.execute(
            "SELECT id, content FROM messages WHERE author_id = ? AND role = 'user'", (user_id,)).fetchall()]
        personal = [m for m in store.memories_of(conn, user_id, ("personal",)) if m.owner_id == user_id]
        released = teachers.release(conn, user_id, [message_id for message_id, _ in said])
        alone = store.get_many(conn, released.alone)
        gone = {m.id for m in personal} | set(released.alone)
        mentioning = [m for m in store.mentioning(conn, user_id) if m.id not in gone]
        texts = ([content for _, content in said] + [m.text for m in personal] + [m.text for m in alone.values()]
                 + [m.text for m in mentioning])
        storage.delete(conn, [m.id for m in personal] + released.alone + [m.id for m in mentioning])
        messages = history.forget_author(conn, user_id)
        rooms.forget_moderator(conn, user_id)  # what they approved stays approved, no longer by their id
        heard = [int(row[0]) for row in conn.execute(
            "SELECT reply_id FROM reply_context WHERE author_id = ?", (user_id,)).fetchall()]
        replies = empty_replies(conn, [*heard, *echoes(conn, user_id, TheirWords.of(texts))],
                                time.time() if now is None else now)
        conn.execute("DELETE FROM reply_context WHERE author_id = ?", (user_id,))
    return Forgotten(personal=len(personal), taught=len(released.alone), messages=messages,
                     shared=len(released.shared), replies=replies, mentioning=len(mentioning))


def echoes(conn: Connection, user_id: int, theirs: TheirWords) -> list[int]:
    """Muninn's replies anywhere that hold a distinctive run of their words or a rare word of
    theirs (bot/memory/echoes.py); one pass over the history: the other people's messages say
    which words are not theirs alone."""
    if not theirs:
        return []
    found: list[int] = []
    maybe: list[tuple[int, set[str]]] = []   # a reply holding words that are rare unless someone else wrote them
    for message_id, role, content in conn.execute(
            "SELECT id, role, content FROM messages WHERE author_id != ? AND deleted_at IS NULL", (user_id,)):
        if role == "user":
            theirs.seen_elsewhere(content)
            continue
        run, rare = theirs.found_in(content)
        if run:
            found.append(int(message_id))
        elif rare:
            maybe.append((int(message_id), rare))
    return found + [message_id for message_id, rare in maybe if rare & theirs.rare]


def empty_replies(conn: Connection, message_ids: Sequence[int], now: float) -> int:
    """Muninn's replies emptied as deleted messages are (row kept, text gone); returns how many."""
    ids = sorted(set(message_ids))
    emptied = 0
    with write_transaction(conn):
        for start in range(0, len(ids), CHUNK):
            chunk = ids[start:start + CHUNK]
            conn.execute(f"UPDATE messages SET content = '', deleted_at = coalesce(deleted_at, ?) "
                         f"WHERE id IN ({','.join('?' * len(chunk))}) AND role = 'assistant' "
                         "AND (content != '' OR deleted_at IS NULL)", (now, *chunk))
            emptied += conn.changes()
    return emptied


def forget_taught(conn: Connection, user_id: int, memory_id: int) -> bool:
    """One room memory its teacher forgets (/memory forget): deleted when nobody else taught it
    (True; its words left for maintenance's scrub), else it stays the others', without this
    person (False), as in forget-all. One transaction."""
    with write_transaction(conn):
        released = teachers.release(conn, user_id, only=[memory_id])
        if memory_id in released.shared:
            return False
        if storage_of(conn).delete(conn, [memory_id]):
            mark_pending(conn)
    return True
