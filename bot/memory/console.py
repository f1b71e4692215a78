"""The operator's console's reads and actions (`engine.console`): every channel and person with
their memories, one memory's provenance, counts over time, and forgetting, restoring, approving
and rejecting, each recorded in the console's log.

Named methods over the SQL of `sql/console.py`, run on the engine's threads. Nothing here applies
the scope rule: the console is the operator's, behind its login (bot/web/).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from bot.memory.connection import Connection
from bot.memory.jobs import Jobs
from bot.memory.records import Memory
from bot.memory.rooms import Rooms
from bot.memory.sql import console
from bot.memory.sql.console import STATES, Filter, LogEntry, Person, Place, Provenance, Timeline
from bot.memory.storage import storage_of
from bot.settings import Settings

__all__ = ["OPERATOR", "STATES", "Console", "Filter", "LogEntry", "Person", "Place", "Provenance", "Stats",
           "Timeline"]

OPERATOR = 0  # the moderator id the moderators' log shows for the operator's approvals and rejections


class _Engine(Jobs, Protocol):
    """What `Console` needs of the engine: its jobs, settings, rooms and embeddings."""
    rooms: Rooms
    settings: Settings

    async def embed_or_none(self, texts: list[str]) -> list[list[float]] | None:
        """Embeddings, or None when the embedding server cannot give them."""

    async def get(self, memory_id: int) -> Memory:
        """A memory, archived or not."""


@dataclass(frozen=True)
class Stats:
    """What the stats page draws: memories by state and scope, archived by reason, and over time."""
    counts: dict[str, int]
    archived: dict[str, int]
    timeline: Timeline


class Console:
    """`engine.console`: the operator's view of all memories, and their actions on them."""

    def __init__(self, engine: _Engine) -> None:
        self._engine = engine

    async def places(self) -> list[Place]:
        """Every channel that holds memories, with counts by kind."""
        return await self._engine.read(console.places)

    async def people(self, *, limit: int = 50, offset: int = 0) -> tuple[list[Person], int]:
        """One page of the people memories belong to, the most memories first, and how many there are."""
        return await self._engine.read(console.people, limit=limit, offset=offset)

    async def person(self, user_id: int) -> Person:
        """One person's counts and last name."""
        return await self._engine.read(console.person, user_id)

    async def memories(self, selection: Filter, *, limit: int = 50, offset: int = 0) -> tuple[list[Memory], int]:
        """One page of the memories `selection` selects, newest first, and how many it selects."""
        return await self._engine.read(console.memory_page, selection, limit=limit, offset=offset)

    async def provenance(self, memory_id: int) -> Provenance:
        """A memory with where it came from and what it is linked to; MemoryNotFound when there is none."""
        return await self._engine.read(console.provenance, memory_id)

    async def stats(self, days: int = 60) -> Stats:
        """Counts by state and scope, archived by reason, and learned/archived per day over `days` days."""
        return await self._engine.read(_stats, days)

    async def overview(self, days: int = 14) -> Stats:
        """What the overview draws: counts by state and scope, and learned per day over `days` days
        (nothing archived: the stats page has that)."""
        return await self._engine.read(_overview, days)

    async def log(self, limit: int = 50) -> list[LogEntry]:
        """The console's latest actions, newest first."""
        return await self._engine.read(console.log_entries, limit)

    async def forget(self, memory_id: int) -> Memory | None:
        """Delete a memory (recorded); None when there is no such memory."""
        return await self._engine.write(console.forget, memory_id, what="forget a memory from the console")

    async def restore(self, memory_id: int) -> Memory | None:
        """Bring back an archived memory (recorded), re-embedded now if the server can; None when
        it was not archived (or waits for a moderator)."""
        memory = await self._engine.write(console.restore, memory_id, what="restore a memory from the console")
        if memory is not None:
            vecs = await self._engine.embed_or_none([memory.text])
            if vecs is not None:
                await self._engine.write(_store_vector, self._engine.settings.embed_model, memory.id, vecs[0],
                                         what="store a restored memory's vector")
        return memory

    async def approve(self, memory_id: int) -> Memory | None:
        """Approve a room claim waiting for a moderator, as the operator (recorded in the channel's
        moderators' log and the console's); None when it does not wait."""
        return await self._decide(memory_id, "approve")

    async def reject(self, memory_id: int) -> Memory | None:
        """Delete a room claim waiting for a moderator, as the operator (recorded in both logs);
        None when it does not wait."""
        return await self._decide(memory_id, "reject")

    async def _decide(self, memory_id: int, action: str) -> Memory | None:
        try:
            memory = await self._engine.get(memory_id)
        except LookupError:
            return None
        if memory.channel_id is None:
            return None
        decide = self._engine.rooms.approve if action == "approve" else self._engine.rooms.reject
        done = await decide(memory_id, channel_id=memory.channel_id, guild_id=memory.guild_id, moderator_id=OPERATOR)
        if done is not None:
            await self.record(action, memory_id=memory_id)
        return done

    async def record(self, action: str, *, memory_id: int | None = None, user_id: int | None = None) -> None:
        """Record an action the console took through another door (a person's export or forget-all)."""
        await self._engine.write(console.record_alone, action, memory_id=memory_id, user_id=user_id,
                                 what="record a console action")


def _stats(conn: Connection, days: int) -> Stats:
    return Stats(console.counts(conn), console.archived_by_reason(conn), console.timeline(conn, days))


def _overview(conn: Connection, days: int) -> Stats:
    return Stats(console.counts(conn), {}, console.timeline(conn, days, archived=False))


def _store_vector(conn: Connection, model: str, memory_id: int, vector: list[float]) -> int:
    return storage_of(conn).store_vectors(conn, model, [memory_id], [list(vector)])
