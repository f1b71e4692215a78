"""Who taught each room memory: everyone whose messages taught it, when each first did, and
through which of their messages (`memory_teachers`). Portable SQL, both backends.

A room memory belongs to its channel, but people teach it. The first teacher's fact is stored
(its owner_id names them); the same fact told again by someone else reinforces it
(bot/memory/writing/facts.py) and makes them a teacher too; consolidation gives the memory that
stands for a cluster the teachers of all its members. The owner is always the earliest teacher
still there. A teacher stops teaching a memory when they forget everything (`release`) or when
every message through which they taught it is deleted (`take_back`): the memory stays while
another teacher remains, owned by the earliest one, and goes with its last teacher. Personal
memories have no teachers: they are never shared.
"""
from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from bot.memory.connection import Connection


@dataclass(frozen=True)
class Teacher:
    """One person teaching one memory."""
    memory_id: int
    user_id: int
    first_taught_at: float
    sources: tuple[str, ...]  # the message ids (as text) through which they taught it


def _marks(values: Sequence[Any]) -> str:
    return ",".join("?" * len(values)) or "NULL"


def _ids(raw: Any) -> list[str]:
    """A JSON list of message ids as text (a memory's `source_message_ids`)."""
    return [str(s) for s in json.loads(raw or "[]")]


def of_memories(conn: Connection, memory_ids: Sequence[int]) -> dict[int, list[Teacher]]:
    """The teachers of these memories, earliest first; a memory without any is left out."""
    ids = list(dict.fromkeys(int(i) for i in memory_ids))
    found: dict[int, list[Teacher]] = defaultdict(list)
    if not ids:
        return found
    for memory_id, user_id, at, sources in conn.execute(
            "SELECT memory_id, user_id, first_taught_at, source_message_ids FROM memory_teachers "
            f"WHERE memory_id IN ({_marks(ids)}) ORDER BY memory_id, first_taught_at, user_id", ids).fetchall():
        found[int(memory_id)].append(Teacher(int(memory_id), int(user_id), float(at), tuple(_ids(sources))))
    return found


def upsert_statement() -> str:
    """The statement that makes someone a teacher of a memory, or updates the messages they taught
    it through (parameters: memory id, user id, first taught at, JSON list of message ids)."""
    return ("INSERT INTO memory_teachers (memory_id, user_id, first_taught_at, source_message_ids) "
            "VALUES (?, ?, ?, ?) ON CONFLICT (memory_id, user_id) DO UPDATE SET "
            "source_message_ids = excluded.source_message_ids")


def merged_sources(known: Any, more: Iterable[Any]) -> str:
    """A teacher's JSON list of message ids (`known`, None for a new teacher) with `more` added."""
    sources = _ids(known)
    sources += [str(s) for s in more if str(s) not in sources]
    return json.dumps(list(dict.fromkeys(sources)))


def reown(conn: Connection, memory_ids: Iterable[int]) -> None:
    """Each of these memories owned by its earliest teacher (those without teachers stay as they are)."""
    ids = list(dict.fromkeys(int(i) for i in memory_ids))
    if not ids:
        return
    earliest = ("(SELECT t.user_id FROM memory_teachers t WHERE t.memory_id = memories.id "
                "ORDER BY t.first_taught_at, t.user_id LIMIT 1)")
    conn.execute(f"UPDATE memories SET owner_id = {earliest} WHERE id IN ({_marks(ids)}) "
                 f"AND EXISTS (SELECT 1 FROM memory_teachers t WHERE t.memory_id = memories.id) "
                 f"AND owner_id IS DISTINCT FROM {earliest}", ids)


def take_back(conn: Connection, memory_ids: Sequence[int], message_ids: Sequence[str]) -> tuple[set[int], set[int]]:
    """Messages were deleted: take them out of the teachers' messages for these memories; a
    teacher left with none of the messages they taught through stops teaching it (one who taught
    with no message, by /memory remember, stays). Inside the caller's transaction. Returns the
    memories that have teachers and, of them, those with no teacher left (the caller deletes
    those); the others are owned by their earliest remaining teacher."""
    wanted = {str(m) for m in message_ids}
    teachers = of_memories(conn, memory_ids)
    orphaned: set[int] = set()
    for memory_id, rows in teachers.items():
        remaining = 0
        for teacher in rows:
            left = [s for s in teacher.sources if s not in wanted]
            if len(left) == len(teacher.sources):
                remaining += 1
            elif left:
                conn.execute("UPDATE memory_teachers SET source_message_ids = ? WHERE memory_id = ? AND user_id = ?",
                             (json.dumps(left), memory_id, teacher.user_id))
                remaining += 1
            else:
                conn.execute("DELETE FROM memory_teachers WHERE memory_id = ? AND user_id = ?",
                             (memory_id, teacher.user_id))
        if not remaining:
            orphaned.add(memory_id)
    reown(conn, set(teachers) - orphaned)
    return set(teachers), orphaned


def taught_by(conn: Connection, user_id: int) -> list[int]:
    """The memories this person teaches, archived ones included, by id."""
    return [int(row[0]) for row in conn.execute(
        "SELECT memory_id FROM memory_teachers WHERE user_id = ? ORDER BY memory_id", (user_id,)).fetchall()]


@dataclass(frozen=True)
class Released:
    """What `release` did with the room memories a person taught."""
    alone: list[int]    # taught by nobody else: the caller deletes them
    shared: list[int]   # taught by others too: they stay, without this person


def release(conn: Connection, user_id: int, their_messages: Iterable[Any] = (),
            only: Iterable[int] | None = None) -> Released:
    """A person forgets everything: the room memories they taught (as a teacher, or as the owner
    of one with no teacher recorded) that nobody else taught are returned to delete; the others
    stay, without this person: their teacher row goes, their messages leave the memory's sources
    and the other teachers' (`their_messages`: the ids of the messages they wrote that the
    history still holds, besides those recorded as they taught), and the earliest remaining
    teacher owns it. `only`: just these memories (one memory its teacher forgets). Inside the
    caller's transaction."""
    ids = taught_by(conn, user_id)
    ids += [int(row[0]) for row in conn.execute(
        "SELECT id FROM memories WHERE owner_id = ? AND scope = 'room'", (user_id,)).fetchall() if int(row[0]) not in ids]
    if only is not None:
        wanted = set(only)
        ids = [memory_id for memory_id in ids if memory_id in wanted]
    teachers = of_memories(conn, ids)
    alone: list[int] = []
    shared: list[int] = []
    mine = {str(m) for m in their_messages}
    for memory_id in sorted(ids):
        rows = teachers.get(memory_id, [])
        others = [t for t in rows if t.user_id != user_id]
        if not others:
            alone.append(memory_id)
            continue
        shared.append(memory_id)
        gone = mine | {s for t in rows if t.user_id == user_id for s in t.sources}
        conn.execute("DELETE FROM memory_teachers WHERE memory_id = ? AND user_id = ?", (memory_id, user_id))
        for teacher in others:
            if any(s in gone for s in teacher.sources):
                conn.execute("UPDATE memory_teachers SET source_message_ids = ? WHERE memory_id = ? AND user_id = ?",
                             (json.dumps([s for s in teacher.sources if s not in gone]), memory_id, teacher.user_id))
        raw = conn.execute("SELECT source_message_ids FROM memories WHERE id = ?", (memory_id,)).fetchall()
        sources = _ids(raw[0][0]) if raw else []
        if any(s in gone for s in sources):
            conn.execute("UPDATE memories SET source_message_ids = ? WHERE id = ?",
                         (json.dumps([s for s in sources if s not in gone]), memory_id))
    reown(conn, shared)
    return Released(alone, shared)


def merge(conn: Connection, survivor_id: int, member_ids: Sequence[int]) -> None:
    """Consolidation: the memory that now stands for a cluster is taught by everyone who taught a
    member (each person's earliest time, the union of their messages), and owned by the earliest
    of them. The members keep their own teachers (archived, each is still someone's to forget).
    Inside the caller's transaction; nothing happens for memories without teachers (personal ones)."""
    teachers = of_memories(conn, member_ids)  # a new survivor's own row (its insert's) is replaced
    people: dict[int, tuple[float, list[str]]] = {}
    for memory_id in member_ids:
        for teacher in teachers.get(memory_id, []):
            at, sources = people.get(teacher.user_id, (teacher.first_taught_at, []))
            sources += [s for s in teacher.sources if s not in sources]
            people[teacher.user_id] = (min(at, teacher.first_taught_at), sources)
    if not people:
        return
    conn.execute("DELETE FROM memory_teachers WHERE memory_id = ?", (survivor_id,))
    for user_id, (at, sources) in sorted(people.items(), key=lambda item: (item[1][0], item[0])):
        conn.execute(upsert_statement(), (survivor_id, user_id, at, json.dumps(sources)))
    reown(conn, [survivor_id])
