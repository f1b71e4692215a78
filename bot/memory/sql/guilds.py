"""Servers Muninn was removed from (the `guild_departures` table), and the purge of what it kept
of one once it has been gone long enough.

A departure is recorded when Muninn leaves or is removed from a server, or at a start when the
database knows a server Muninn is no longer in (removed while it was offline); the first time
stays, so a later start does not push the purge back. Being added back clears it. The purge
deletes, in one transaction, the server's room memories and the personal memories learned
there (their vectors, links and sources with them), its channels' history and channel options,
then the departure itself; the caller scrubs the files after the commit. Memories learned in
DMs and global memories are not the server's and stay.

Portable SQL (`?` parameters), both backends.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Collection

from bot.memory.connection import Connection
from bot.memory.sql.marks import mark_pending
from bot.memory.sql.queries import query_one
from bot.memory.sql.transactions import write_transaction
from bot.memory.storage import storage_of

# Discord ids (snowflakes) are above this; smaller guild ids are local ones (`muninn chat`'s
# guild 0, `muninn remember --guild 5`): never a server Muninn could have been removed from.
DISCORD_IDS_FROM = 1 << 22


@dataclass(frozen=True)
class Reconciled:
    """What a start-up check changed: servers found gone (departures recorded now) and servers
    found back (departures cleared)."""
    departed: tuple[int, ...] = ()
    returned: tuple[int, ...] = ()


@dataclass(frozen=True)
class Purged:
    """What the purge of one departed server deleted."""
    guild_id: int
    departed_at: float
    memories: int   # its room memories and the personal memories learned there
    messages: int   # its channels' history
    channels: int   # its channels' options


def depart(conn: Connection, guild_id: int, at: float) -> bool:
    """Record that Muninn left `guild_id` at `at`; False when a departure was already recorded
    (its earlier time stays)."""
    with write_transaction(conn):
        conn.execute("INSERT INTO guild_departures (guild_id, departed_at) VALUES (?, ?) "
                     "ON CONFLICT (guild_id) DO NOTHING", (guild_id, at))
        return conn.changes() > 0


def clear(conn: Connection, guild_id: int) -> bool:
    """Muninn is in `guild_id` again: forget its departure; False when none was recorded.
    Reads first: a join of a server never left takes no write lock."""
    if query_one(conn, "SELECT 1 FROM guild_departures WHERE guild_id = ?", (guild_id,)) is None:
        return False
    with write_transaction(conn):
        conn.execute("DELETE FROM guild_departures WHERE guild_id = ?", (guild_id,))
        return conn.changes() > 0


def departures(conn: Connection) -> dict[int, float]:
    """Every recorded departure: guild id -> when (unix seconds)."""
    return {int(row[0]): float(row[1]) for row in conn.execute("SELECT guild_id, departed_at FROM guild_departures")}


def _distinct_guilds(table: str) -> str:
    """The distinct guild ids of a table, one index seek each (a loose scan of its guild index)."""
    step = f"SELECT min(guild_id) FROM {table} WHERE guild_id > "
    return (f"WITH RECURSIVE g(id) AS ({step}-1 UNION ALL SELECT ({step}g.id) FROM g WHERE g.id IS NOT NULL) "
            "SELECT id FROM g WHERE id IS NOT NULL")


def known(conn: Connection) -> set[int]:
    """The Discord servers the database holds anything of: memories, history or channel options."""
    found = {int(row[0]) for table in ("memories", "messages") for row in conn.execute(_distinct_guilds(table))}
    found |= {int(row[0]) for row in conn.execute(
        "SELECT DISTINCT guild_id FROM channel_options WHERE guild_id IS NOT NULL")}
    return {guild_id for guild_id in found if guild_id >= DISCORD_IDS_FROM}


def reconcile(conn: Connection, present: Collection[int], judged: Callable[[int], bool], at: float) -> Reconciled:
    """At a start, in one transaction: every server the database knows that `judged` says this
    process may judge and that is not `present` is recorded as departed at `at` (an earlier
    departure stays); the recorded departures of servers `present` are cleared."""
    here = set(present)
    with write_transaction(conn):
        recorded = departures(conn)
        gone = sorted(g for g in known(conn) if g not in here and g not in recorded and judged(g))
        for guild_id in gone:
            conn.execute("INSERT INTO guild_departures (guild_id, departed_at) VALUES (?, ?) "
                         "ON CONFLICT (guild_id) DO NOTHING", (guild_id, at))
        back = sorted(g for g in recorded if g in here)
        for guild_id in back:
            conn.execute("DELETE FROM guild_departures WHERE guild_id = ?", (guild_id,))
    return Reconciled(tuple(gone), tuple(back))


def due(conn: Connection, cutoff: float) -> list[int]:
    """The servers departed at or before `cutoff`, earliest first: the purge's work."""
    return [int(row[0]) for row in conn.execute(
        "SELECT guild_id FROM guild_departures WHERE departed_at <= ? ORDER BY departed_at, guild_id", (cutoff,))]


def purge(conn: Connection, guild_id: int, cutoff: float) -> Purged | None:
    """Delete what Muninn kept of a server departed at or before `cutoff`, and its departure, in
    one transaction; None when it is not (any more) such a server: added back meanwhile, or
    purged by another process. The words are left marked for the scrub (marks.mark_pending), so
    a crash before it still leaves them to the next maintenance run."""
    with write_transaction(conn):
        row = query_one(conn, "SELECT departed_at FROM guild_departures WHERE guild_id = ? AND departed_at <= ?",
                        (guild_id, cutoff))
        if row is None:
            return None
        ids = [int(r[0]) for r in conn.execute(
            "SELECT id FROM memories WHERE guild_id = ? AND scope IN ('personal', 'room') ORDER BY id", (guild_id,))]
        memories = storage_of(conn).delete(conn, ids) if ids else 0
        conn.execute("DELETE FROM messages WHERE guild_id = ?", (guild_id,))
        messages = conn.changes()
        conn.execute("DELETE FROM channel_options WHERE guild_id = ?", (guild_id,))
        channels = conn.changes()
        # the server's own settings and its moderators' log end with it too
        conn.execute("DELETE FROM guild_settings WHERE guild_id = ?", (guild_id,))
        conn.execute("DELETE FROM moderation_log WHERE guild_id = ?", (guild_id,))
        conn.execute("DELETE FROM guild_departures WHERE guild_id = ?", (guild_id,))
        if memories or messages:
            mark_pending(conn)
    return Purged(guild_id, float(row[0]), memories, messages, channels)
