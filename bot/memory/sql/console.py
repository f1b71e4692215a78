"""What the operator's console reads and records (portable SQL, both backends): the servers and
channels memories were learned in, the people they belong to, pages of memories by filter, one
memory's provenance, counts over time, and the console's own log of actions (never a text).

The console is the operator's view of everything: nothing here applies the scope rule, and no
path of the bot calls it (bot/web/ does, behind its login).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Sequence

from bot.memory.connection import Connection
from bot.memory.records import PENDING_REASON, Memory
from bot.memory.sql.marks import mark_pending
from bot.memory.sql.queries import query_value
from bot.memory.sql.transactions import write_transaction
from bot.memory.storage import storage_of

DAY = 86400.0
STATES = ("active", "archived", "pending", "all")
ACTIONS = ("forget", "restore", "approve", "reject", "export-user", "forget-user")


@dataclass(frozen=True)
class Place:
    """A channel (or DM, or no channel) memories were learned in, with how many of each kind."""
    guild_id: int | None
    channel_id: int | None
    room: int = 0
    personal: int = 0
    pending: int = 0
    archived: int = 0


@dataclass(frozen=True)
class Person:
    """Someone memories belong to or were taught by, with the name they last used."""
    user_id: int
    name: str | None
    personal: int
    room: int


@dataclass(frozen=True)
class Filter:
    """Which memories a page lists; None is "any"."""
    owner_id: int | None = None
    guild_id: int | None = None
    channel_id: int | None = None
    scope: str | None = None
    state: str = "active"
    dm: bool = False  # learned in no server (DMs, the terminal, the command line)


@dataclass(frozen=True)
class Link:
    """A link of a memory to another, seen from the memory: `outgoing` when it is the source."""
    other_id: int
    kind: str
    weight: float
    outgoing: bool
    created_at: float


@dataclass(frozen=True)
class Source:
    """A message a memory was learned from, as the history still holds it (None: pruned or forgotten)."""
    message_id: str
    author_id: int | None = None
    author_name: str | None = None
    content: str | None = None
    created_at: float | None = None


@dataclass
class Provenance:
    """Where a memory came from and what it is tied to."""
    memory: Memory
    teachers: list[tuple[int, float]] = field(default_factory=list)   # (user id, first taught at)
    mentions: list[int] = field(default_factory=list)
    sources: list[Source] = field(default_factory=list)
    links: list[Link] = field(default_factory=list)
    others: dict[int, Memory] = field(default_factory=dict)            # the linked memories
    approval: tuple[str, int | None, float] | None = None              # (how, moderator id, at)
    names: dict[int, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Timeline:
    """Counts per day (days since the epoch, UTC) over a window ending today."""
    first_day: int
    days: int
    created: dict[str, list[int]]     # scope -> count per day
    archived: dict[str, list[int]]    # archive reason -> count per day


@dataclass(frozen=True)
class LogEntry:
    """One action taken in the console."""
    id: int
    at: float
    action: str
    memory_id: int | None
    user_id: int | None


def _place_rows(conn: Connection) -> list[tuple[int | None, int | None, str, str, int]]:
    """(guild, channel, scope, state, count) over all memories, read from the memories_place index alone."""
    out = []
    for channel_id, guild_id, scope, reason, total, active in conn.execute(
            "SELECT channel_id, guild_id, scope, archive_reason, count(*), "
            "sum(CASE WHEN archived_at IS NULL THEN 1 ELSE 0 END) FROM memories "
            "GROUP BY channel_id, guild_id, scope, archive_reason"):
        guild = None if guild_id is None else int(guild_id)
        channel = None if channel_id is None else int(channel_id)
        if int(active):
            out.append((guild, channel, str(scope), "active", int(active)))
        if int(total) > int(active):
            out.append((guild, channel, str(scope), "pending" if reason == PENDING_REASON else "archived",
                        int(total) - int(active)))
    return out


def places(conn: Connection) -> list[Place]:
    """Every channel that holds memories, with counts by kind, servers first then DMs."""
    counts: dict[tuple[int | None, int | None], dict[str, int]] = {}
    for guild_id, channel_id, scope, state, n in _place_rows(conn):
        if scope == "global":
            continue
        slot = counts.setdefault((guild_id, channel_id), {})
        name = scope if state == "active" else state
        slot[name] = slot.get(name, 0) + n
    out = [Place(g, c, c_.get("room", 0), c_.get("personal", 0), c_.get("pending", 0), c_.get("archived", 0))
           for (g, c), c_ in counts.items()]
    return sorted(out, key=lambda p: (p.guild_id is None, p.guild_id or 0, p.channel_id or 0))


def _owner_counts(conn: Connection, user_id: int | None = None) -> dict[int, dict[str, int]]:
    """Active memories per owner and scope, read from the memories_owner index alone."""
    where, params = ("owner_id = ?", (user_id,)) if user_id is not None else ("owner_id IS NOT NULL", ())
    out: dict[int, dict[str, int]] = {}
    for owner, scope, n in conn.execute(f"SELECT owner_id, scope, count(*) FROM memories WHERE {where} AND "
                                        "archived_at IS NULL GROUP BY owner_id, scope", params):
        out.setdefault(int(owner), {})[str(scope)] = int(n)
    return out


def people(conn: Connection, *, limit: int = 50, offset: int = 0) -> tuple[list[Person], int]:
    """One page of the people active memories belong to or were taught by, the most memories first."""
    owners = _owner_counts(conn)
    ranked = sorted(owners.items(), key=lambda item: (-sum(item[1].values()), item[0]))[offset:offset + limit]
    names = last_names(conn, [owner for owner, _ in ranked])
    return [Person(owner, names.get(owner), c.get("personal", 0), sum(c.values()) - c.get("personal", 0))
            for owner, c in ranked], len(owners)


def person(conn: Connection, user_id: int) -> Person:
    """One person's counts (zeros when nothing belongs to them)."""
    c = _owner_counts(conn, user_id).get(user_id, {})
    return Person(user_id, last_names(conn, [user_id]).get(user_id), c.get("personal", 0),
                  sum(c.values()) - c.get("personal", 0))


def last_names(conn: Connection, user_ids: Sequence[int]) -> dict[int, str]:
    """The display name each person last used anywhere in the history (absent: no message kept)."""
    names: dict[int, str] = {}
    for user_id in dict.fromkeys(user_ids):
        name = query_value(conn, "SELECT author_name FROM messages WHERE author_id = ? AND role = 'user' "
                                 "ORDER BY id DESC LIMIT 1", (user_id,))
        if name:
            names[user_id] = name.decode("utf-8", "replace") if isinstance(name, bytes) else str(name)
    return names


def _where(f: Filter) -> tuple[str, list]:
    clauses: list[str] = []
    params: list = []
    for column, value in (("owner_id", f.owner_id), ("guild_id", f.guild_id), ("channel_id", f.channel_id),
                          ("scope", f.scope)):
        if value is not None:
            clauses.append(f"{column} = ?")
            params.append(value)
    if f.dm:
        clauses.append("guild_id IS NULL")
    if f.state == "active":
        clauses.append("archived_at IS NULL")
    elif f.state == "pending":  # a literal, so that the partial index memories_pending serves it
        clauses.append(f"archived_at IS NOT NULL AND archive_reason = '{PENDING_REASON}'")
    elif f.state == "archived":
        clauses.append("archived_at IS NOT NULL AND archive_reason != ?")
        params.append(PENDING_REASON)
    return (" WHERE " + " AND ".join(clauses)) if clauses else "", params


def memory_page(conn: Connection, f: Filter, *, limit: int = 50, offset: int = 0) -> tuple[list[Memory], int]:
    """One page of the memories `f` selects, newest first, and how many it selects."""
    where, params = _where(f)
    total = int(query_value(conn, f"SELECT count(*) FROM memories{where}", params, 0))
    ids = [int(r[0]) for r in conn.execute(f"SELECT id FROM memories{where} ORDER BY id DESC LIMIT ? OFFSET ?",
                                           (*params, limit, offset))]
    found = storage_of(conn).get_many(conn, ids)
    return [found[i] for i in ids if i in found], total


def provenance(conn: Connection, memory_id: int) -> Provenance:
    """A memory with its teachers, the people it names, its source messages, its links and the
    memories at their other ends, and its approval; MemoryNotFound when there is no such memory."""
    store = storage_of(conn)
    memory = store.get(conn, memory_id)
    out = Provenance(memory)
    out.teachers = [(int(r[0]), float(r[1])) for r in conn.execute(
        "SELECT user_id, first_taught_at FROM memory_teachers WHERE memory_id = ? ORDER BY first_taught_at",
        (memory_id,))]
    out.mentions = [int(r[0]) for r in conn.execute(
        "SELECT user_id FROM memory_mentions WHERE memory_id = ? ORDER BY user_id", (memory_id,))]
    for message_id in memory.source_message_ids[:20]:
        row = None
        if str(message_id).isdigit():
            row = next(iter(conn.execute("SELECT author_id, author_name, content, created_at FROM messages "
                                         "WHERE id = ? AND deleted_at IS NULL", (int(message_id),))), None)
        out.sources.append(Source(str(message_id)) if row is None else
                           Source(str(message_id), int(row[0]), _text(row[1]), _text(row[2]), float(row[3])))
    for source, target, kind, weight, at in conn.execute(
            "SELECT source_id, target_id, kind, weight, created_at FROM memory_links WHERE source_id = ? "
            "UNION ALL SELECT source_id, target_id, kind, weight, created_at FROM memory_links WHERE target_id = ? "
            "ORDER BY 5 DESC LIMIT 40", (memory_id, memory_id)):
        outgoing = int(source) == memory_id
        out.links.append(Link(int(target) if outgoing else int(source), str(kind), float(weight), outgoing, float(at)))
    out.others = store.get_many(conn, [link.other_id for link in out.links])
    row = next(iter(conn.execute("SELECT how, moderator_id, approved_at FROM memory_approvals WHERE memory_id = ?",
                                 (memory_id,))), None)
    if row is not None:
        out.approval = (str(row[0]), None if row[1] is None else int(row[1]), float(row[2]))
    people = [memory.owner_id] if memory.owner_id is not None else []
    people += [t for t, _ in out.teachers] + out.mentions + [s.author_id for s in out.sources if s.author_id]
    out.names = last_names(conn, people)
    return out


def _text(value) -> str | None:
    if value is None:
        return None
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def counts(conn: Connection) -> dict[str, int]:
    """Memories by state and scope: active room/personal/global, pending, archived, all."""
    out = {"room": 0, "personal": 0, "global": 0, "pending": 0, "archived": 0}
    for _, _, scope, state, n in _place_rows(conn):
        out[scope if state == "active" else state] += n
    out["all"] = sum(out.values())
    return out


def archived_by_reason(conn: Connection) -> dict[str, int]:
    """Archived memories (not counting claims waiting for a moderator) by the reason they were archived."""
    return {str(reason or "unknown"): int(n) for reason, n in conn.execute(
        "SELECT archive_reason, count(*) FROM memories WHERE archived_at IS NOT NULL AND "
        "(archive_reason IS NULL OR archive_reason != ?) GROUP BY 1 ORDER BY 2 DESC", (PENDING_REASON,))}


def timeline(conn: Connection, days: int = 60, now: float | None = None, *, archived: bool = True) -> Timeline:
    """Memories learned per day by scope, and (`archived`) archived per day by reason, over the last `days` days."""
    today = int((time.time() if now is None else now) // DAY)
    first = today - days + 1
    created: dict[str, list[int]] = {}
    for day, scope, n in conn.execute(
            "SELECT floor(created_at / 86400), scope, count(*) FROM memories WHERE created_at >= ? GROUP BY 1, 2",
            (first * DAY,)):
        index = int(day) - first
        if 0 <= index < days:
            created.setdefault(str(scope), [0] * days)[index] += int(n)
    by_reason: dict[str, list[int]] = {}
    for day, reason, n in ([] if not archived else conn.execute(
            "SELECT floor(archived_at / 86400), archive_reason, count(*) FROM memories WHERE archived_at >= ? "
            "AND (archive_reason IS NULL OR archive_reason != ?) GROUP BY 1, 2", (first * DAY, PENDING_REASON))):
        index = int(day) - first
        if 0 <= index < days:
            by_reason.setdefault(str(reason or "unknown"), [0] * days)[index] += int(n)
    return Timeline(first, days, created, by_reason)


def record(conn: Connection, action: str, *, memory_id: int | None = None, user_id: int | None = None,
           now: float | None = None) -> None:
    """Record one console action (inside the caller's transaction when it has one): never a text."""
    if action not in ACTIONS:
        raise ValueError(f"unknown console action {action!r}")
    conn.execute("INSERT INTO console_log (at, action, memory_id, user_id) VALUES (?, ?, ?, ?)",
                 (time.time() if now is None else now, action, memory_id, user_id))


def record_alone(conn: Connection, action: str, *, memory_id: int | None = None, user_id: int | None = None) -> None:
    """Record one console action in a transaction of its own."""
    with write_transaction(conn):
        record(conn, action, memory_id=memory_id, user_id=user_id)


def log_entries(conn: Connection, limit: int = 50) -> list[LogEntry]:
    """The latest console actions, newest first."""
    return [LogEntry(int(r[0]), float(r[1]), str(r[2]), None if r[3] is None else int(r[3]),
                     None if r[4] is None else int(r[4]))
            for r in conn.execute("SELECT id, at, action, memory_id, user_id FROM console_log ORDER BY id DESC LIMIT ?",
                                  (limit,))]


# -- actions (each with its log line, in one transaction) -----------------------------------

def forget(conn: Connection, memory_id: int) -> Memory | None:
    """Delete a memory (any scope or state), its words scrubbed from the files by the next
    maintenance run, and record it. Returns it, or None when there is no such memory."""
    store = storage_of(conn)
    with write_transaction(conn):
        found = store.get_many(conn, [memory_id]).get(memory_id)
        if found is None:
            return None
        store.delete(conn, [memory_id])
        mark_pending(conn)
        record(conn, "forget", memory_id=memory_id)
    return found


def restore(conn: Connection, memory_id: int) -> Memory | None:
    """Bring back a memory archived by decay or consolidation (not a claim waiting for a
    moderator: approve it instead), and record it. Returns it, or None when nothing was restored."""
    store = storage_of(conn)
    with write_transaction(conn):
        found = store.get_many(conn, [memory_id]).get(memory_id)
        if found is None or found.archived_at is None or found.archive_reason == PENDING_REASON:
            return None
        store.restore(conn, memory_id)
        record(conn, "restore", memory_id=memory_id)
    return store.get(conn, memory_id)
