"""Shared memory under moderation, as the lifecycle, the conversation and the cogs use it
(`engine.rooms`): a server's room memory mode, a channel's room memories and the claims waiting
for its moderators, approving, rejecting and forgetting them (each logged, never with a text),
and what the prompt needs to attribute a recalled memory.

Named methods over the SQL of `sql/rooms.py`, run on the engine's threads.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

from bot.memory.connection import Connection
from bot.memory.jobs import Jobs
from bot.memory.records import Memory, NewMemory
from bot.memory.sql import rooms, store
from bot.memory.sql.rooms import APPROVED, DEFAULT_MODE, MODES, Approval, LogEntry, RoomMemory
from bot.memory.sql.transactions import write_transaction
from bot.memory.storage import storage_of
from bot.settings import Settings

__all__ = ["APPROVED", "DEFAULT_MODE", "MODES", "Approval", "Attribution", "LogEntry", "RoomMemory", "Rooms"]


class _Engine(Jobs, Protocol):
    """What `Rooms` needs of the engine: its jobs, its settings and embeddings."""
    settings: Settings

    async def embed_or_none(self, texts: list[str]) -> list[list[float]] | None:
        """Embeddings, or None when Ollama cannot give them."""


@dataclass(frozen=True)
class Attribution:
    """Who stands behind recalled memories: the approvals of the room memories among them, and
    the display name each teacher or moderator last used in the channel (absent: unknown)."""
    approvals: dict[int, Approval] = field(default_factory=dict)
    names: dict[int, str] = field(default_factory=dict)


class Rooms:
    """`engine.rooms`: the room memory mode, moderation of a channel's room memories, attribution."""

    def __init__(self, engine: _Engine) -> None:
        self._engine = engine

    async def mode(self, guild_id: int | None) -> str:
        """The server's room memory mode: moderated (the default), open or off."""
        return await self._engine.read(rooms.room_mode, guild_id)

    async def set_mode(self, guild_id: int, mode: str, *, moderator_id: int, channel_id: int) -> None:
        """Set the server's room memory mode (logged as the moderator's action); ValueError for an unknown mode."""
        if mode not in MODES:
            raise ValueError(f"unknown room memory mode {mode!r}; use one of {', '.join(MODES)}")
        await self._engine.write(rooms.set_room_mode, guild_id, mode, moderator_id=moderator_id, channel_id=channel_id,
                                 what="set the room memory mode")

    async def reset_mode(self, guild_id: int, *, moderator_id: int, channel_id: int) -> None:
        """Unset the server's room memory mode: the default (moderated) applies again (logged)."""
        await self._engine.write(rooms.set_room_mode, guild_id, None, moderator_id=moderator_id,
                                 channel_id=channel_id, what="reset the room memory mode")

    async def memories(self, channel_id: int, *, limit: int = 20, offset: int = 0) -> tuple[list[RoomMemory], int]:
        """One page of the channel's active room memories, newest first, and how many there are."""
        return await self._engine.read(rooms.room_page, channel_id, limit=limit, offset=offset)

    async def pending(self, channel_id: int, *, limit: int = 20, offset: int = 0) -> tuple[list[RoomMemory], int]:
        """One page of the claims waiting for a moderator in the channel, newest first, and how many."""
        return await self._engine.read(rooms.room_page, channel_id, pending=True, limit=limit, offset=offset)

    async def search(self, channel_id: int, text: str, *, limit: int = 20) -> list[RoomMemory]:
        """The channel's active room memories holding any word of `text`, most relevant first."""
        return await self._engine.read(rooms.room_search, channel_id, text, limit)

    async def approve(self, memory_id: int, *, channel_id: int, guild_id: int | None,
                      moderator_id: int) -> Memory | None:
        """Approve a claim waiting in the channel (logged); it is recalled from now on, embedded
        now if Ollama can (else by the backfill). None when no such claim waits there."""
        memory = await self._engine.write(rooms.approve, memory_id, channel_id=channel_id, guild_id=guild_id,
                                          moderator_id=moderator_id, what="approve a room memory")
        if memory is not None:
            vecs = await self._engine.embed_or_none([memory.text])
            if vecs is not None:
                await self._engine.write(_store_vector, self._engine.settings.embed_model, memory.id, vecs[0],
                                         what="store an approved memory's vector")
        return memory

    async def keep_approved(self, memory: NewMemory, *, moderator_id: int) -> int:
        """A member's words a moderator keeps for the room (the "Remember this" menu): stored as that
        member's room memory (`memory.owner_id`), approved by the moderator and logged, in one
        transaction; returns its id."""
        if memory.scope != "room" or memory.standing is not None or memory.channel_id is None:
            raise ValueError("only a member's room memory can be kept approved by a moderator")
        vecs = await self._engine.embed_or_none([memory.text])
        return await self._engine.write(_keep_approved, memory, vecs, moderator_id, self._engine.settings,
                                        what="keep a room memory approved by a moderator")

    async def reject(self, memory_id: int, *, channel_id: int, guild_id: int | None,
                     moderator_id: int) -> Memory | None:
        """Delete a claim waiting in the channel (logged); None when no such claim waits there."""
        return await self._engine.write(rooms.reject, memory_id, channel_id=channel_id, guild_id=guild_id,
                                        moderator_id=moderator_id, what="reject a room memory")

    async def forget(self, memory_id: int, *, channel_id: int, guild_id: int | None,
                     moderator_id: int) -> Memory | None:
        """Delete an active room memory of the channel (logged); None when it has no such memory."""
        return await self._engine.write(rooms.forget, memory_id, channel_id=channel_id, guild_id=guild_id,
                                        moderator_id=moderator_id, what="forget a room memory")

    async def log(self, channel_id: int, *, limit: int = 20) -> list[LogEntry]:
        """The channel's latest moderator actions, newest first."""
        return await self._engine.read(rooms.log_entries, channel_id, limit)

    async def attribution(self, channel_id: int | None, memories: Sequence[Memory]) -> Attribution:
        """The approvals of the room memories among `memories`, and the names their teachers and
        moderators last used in the channel (none outside one)."""
        room_ids = [m.id for m in memories if m.scope == "room"]
        people = [m.owner_id for m in memories if m.scope == "room" and m.owner_id is not None]
        if not room_ids:
            return Attribution()
        return await self._engine.read(_attribution, channel_id, room_ids, people)


def _attribution(conn: Connection, channel_id: int | None, room_ids: list[int], people: list[int]) -> Attribution:
    approvals = rooms.approvals(conn, room_ids)
    people += [a.moderator_id for a in approvals.values() if a.moderator_id is not None]
    names = rooms.last_names(conn, channel_id, people) if channel_id is not None else {}
    return Attribution(approvals, names)


def _keep_approved(conn: Connection, memory: NewMemory, vecs: list[list[float]] | None, moderator_id: int,
                   settings: Settings) -> int:
    now = time.time()
    assert memory.channel_id is not None
    with write_transaction(conn):  # the memory, whom it names, its approval and the log land together
        memory_id = storage_of(conn).insert(conn, [memory], base_stability_days=settings.base_stability_days,
                                            model=settings.embed_model, vecs=vecs, now=now)[0]
        store.add_mentions(conn, memory_id, memory.mentions)
        rooms.vouch(conn, memory_id, APPROVED, moderator_id, now)
        rooms.log_action(conn, "approve", channel_id=memory.channel_id, guild_id=memory.guild_id,
                         moderator_id=moderator_id, memory_id=memory_id, now=now)
    return memory_id


def _store_vector(conn: Connection, model: str, memory_id: int, vector: Any) -> int:
    return storage_of(conn).store_vectors(conn, model, [memory_id], [list(vector)])
