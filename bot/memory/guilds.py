"""`engine.guilds`: the servers Muninn was removed from, and the purge of what it kept of them.

Named methods over the SQL of `sql/guilds.py`, run on the engine's threads. The Discord adapter
records departures and returns (cogs/guilds.py); maintenance purges the servers gone longer than
MUNINN_GUILD_RETENTION_DAYS (bot/lifecycle/maintenance.py).
"""
from __future__ import annotations

import time
from typing import Callable, Collection

from bot.memory.connection import Connection
from bot.memory.jobs import Jobs
from bot.memory.sql import guilds
from bot.memory.sql.guilds import Purged, Reconciled
from bot.memory.storage import storage_of

__all__ = ["Guilds", "Purged", "Reconciled"]

DAY_S = 86_400.0


class Guilds:
    """`engine.guilds`: record departures and returns, purge the servers gone long enough."""

    def __init__(self, jobs: Jobs) -> None:
        self._jobs = jobs

    async def departed(self, guild_id: int, at: float | None = None) -> bool:
        """Muninn left or was removed from a server (now, unless `at`); False when its departure
        was recorded already (the earlier time stays)."""
        return await self._jobs.write(guilds.depart, guild_id, time.time() if at is None else at,
                                      what=f"record leaving server {guild_id}")

    async def returned(self, guild_id: int) -> bool:
        """Muninn was added to a server (again): nothing of it is purged; False when it had not left."""
        return await self._jobs.write(guilds.clear, guild_id, what=f"record joining server {guild_id}")

    async def reconcile(self, present: Collection[int], judged: Callable[[int], bool],
                        at: float | None = None) -> Reconciled:
        """At a start: the servers the database knows that this process may judge (`judged`, e.g.
        its shards' servers) and that are not `present` are recorded as departed, an earlier
        departure kept; departures of servers `present` are cleared. One transaction, queued on
        the writer when called, so a join handled after the call is recorded after it."""
        return await self._jobs.write(guilds.reconcile, frozenset(present), judged,
                                      time.time() if at is None else at, what="check which servers Muninn left")

    async def departures(self) -> dict[int, float]:
        """Every recorded departure: guild id -> when it was recorded (unix seconds)."""
        return await self._jobs.read(guilds.departures)

    async def purge_departed(self, retention_days: float, *, now: float | None = None) -> list[Purged]:
        """Purge every server departed more than `retention_days` ago (0: every departed one), one
        transaction each, then scrub the database files once; returns what each purge deleted."""
        cutoff = (time.time() if now is None else now) - retention_days * DAY_S
        purged = []
        for guild_id in await self._jobs.read(guilds.due, cutoff):
            done = await self._jobs.write(guilds.purge, guild_id, cutoff, what=f"purge departed server {guild_id}")
            if done is not None:
                purged.append(done)
        if any(p.memories or p.messages for p in purged):
            await self._jobs.write(_scrub, what="scrub the purged servers' words")
        return purged


def _scrub(conn: Connection) -> bool:
    """What the purges marked (and any other forget's mark): the whole scrub, tables rewritten
    whatever their size on PostgreSQL (maintenance may hold their locks), marks cleared after."""
    return storage_of(conn).finish_scrub(conn)
