"""The engine's named methods for reading memories, for people's privacy controls and for the
leases of several processes: thin, each one job on the engine's threads (a part of Engine)."""
from __future__ import annotations

from typing import Any, Callable, Sequence, TypeVar

from bot.memory import records
from bot.memory.scope import Viewer
from bot.memory.sql import choices, forgetting, health, store
from bot.memory.storage import Storage
from bot.settings import Settings

T = TypeVar("T")


class NamedAccess:
    """Engine's reads, privacy controls and leases (mixed into bot/memory/engine.py's Engine)."""

    storage: Storage[Any]
    settings: Settings
    _paused: set[int] | None

    async def _run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        raise NotImplementedError

    async def _read(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        raise NotImplementedError

    async def write(self, job: Callable[..., T], *args: Any, what: str = "write to the database", **kwargs: Any) -> T:
        """Run `job(conn, ...)` as one write transaction on the writer (Engine.write)."""
        raise NotImplementedError

    # -- inspection (never touches) -----------------------------------------

    async def list_visible(self, viewer: Viewer, *, scope: str | None = None, limit: int = 50, offset: int = 0):
        """One page of the memories `viewer` may see, newest first, and how many there are."""
        return await self._run(self.storage.list_visible, viewer, scope=scope, limit=limit, offset=offset)

    async def get_visible(self, viewer: Viewer, memory_id: int) -> records.Memory:
        """The memory if `viewer` may see it; MemoryNotFound otherwise."""
        return await self._run(self.storage.get_visible, viewer, memory_id)

    async def get(self, memory_id: int) -> records.Memory:
        """Any memory, whoever's it is: for operators (the command line), never for a viewer."""
        return await self._run(self.storage.get, memory_id)

    async def get_many(self, memory_ids: Sequence[int]) -> dict[int, records.Memory]:
        """Those of the ids that exist, by id, whoever's they are (operators, maintenance)."""
        return await self._run(self.storage.get_many, list(memory_ids))

    async def memories_of(self, user_id: int, scopes: Sequence[str] = ("personal", "room")) -> list[records.Memory]:
        """A person's personal memories, the room memories they taught and others' memories that
        mention them (their data, for export and forget-all), archived ones included."""
        return await self._run(self.storage.memories_of, user_id, tuple(scopes))

    async def own_choices(self, viewer: Viewer, typed: str, *, limit: int = 25) -> list[records.Memory]:
        """For the autocomplete of a memory id: up to `limit` of the viewer's own memories (personal,
        or room memories they taught) that they may see here, matching `typed`, newest first."""
        return await self._read(choices.own_matching, viewer, typed, limit)

    async def from_message(self, message_id: int) -> list[records.Memory]:
        """Every memory learned from a message (archived ones included), whoever's: for "Forget what
        this taught you", which keeps only those the person may change."""
        return await self._read(choices.from_message, message_id)

    async def mentioned(self, memory_id: int) -> set[int]:
        """The ids of the people a memory mentions besides its owner (they may export and erase it)."""
        return await self._read(store.mentioned, memory_id)

    async def existing_external_ids(self, ids: Sequence[str]) -> set[str]:
        """Which of these imported external ids are stored already."""
        return await self._run(self.storage.existing_external_ids, list(ids))

    async def refresh_statistics(self) -> None:
        """After an import: the database's statistics of the memories read afresh (storage.refresh_statistics)."""
        await self._run(self.storage.refresh_statistics)

    async def stats(self) -> dict:
        """The counts `muninn stats` shows."""
        return await self._run(self.storage.stats)

    async def ping(self) -> None:
        """One trivial read on a read connection: raises when the database does not answer (/healthz)."""
        await self._read(health.ping)

    # -- privacy controls ------------------------------------------------------

    async def pause_memory(self, user_id: int) -> bool:
        """Stop storing anything of this person until `resume_memory`; False if already paused."""
        changed = await self.write(self.storage.pause, user_id, what=f"pause the memory of user {user_id}")
        (await self._paused_users()).add(user_id)
        return changed

    async def resume_memory(self, user_id: int) -> bool:
        """Keep what this person says again; False if their memory was not paused."""
        changed = await self.write(self.storage.resume, user_id, what=f"resume the memory of user {user_id}")
        (await self._paused_users()).discard(user_id)
        return changed

    async def memory_paused(self, user_id: int) -> bool:
        """Whether this person has paused Muninn's memory of them."""
        return user_id in await self._paused_users()

    async def take_pause_notice(self, user_id: int) -> bool:
        """True the first time this is asked during a pause (Muninn then says so, once)."""
        return await self.write(self.storage.take_pause_notice, user_id, what="note the pause notice")

    async def _paused_users(self) -> set[int]:
        if self._paused is None or self.settings.shard_count:  # other shards' processes pause people too
            self._paused = await self._read(self.storage.paused_users)
        return self._paused

    async def personal_from_messages(self, owner_id: int, message_ids: Sequence[int]) -> list[records.Memory]:
        """The owner's active personal memories learned from any of these messages."""
        return await self._read(self.storage.personal_from_messages, owner_id, list(message_ids))

    async def own_memory(self, owner_id: int, memory_id: int) -> records.Memory:
        """The caller's own memory (personal, a room memory they taught, or another's that
        mentions them); MemoryNotFound otherwise."""
        return await self._read(self.storage.own_memory, owner_id, memory_id)

    async def forget_taught(self, user_id: int, memory_id: int) -> bool:
        """A room memory its teacher forgets: deleted when nobody else taught it (True), else left to
        the others without this person (False)."""
        return await self.write(forgetting.forget_taught, user_id, memory_id,
                                what=f"forget memory {memory_id} of user {user_id}")

    async def forget_personal(self, owner_id: int, memory_ids: Sequence[int]) -> int:
        """Delete those of the ids that are the owner's personal memories, leaving no trace."""
        return await self.write(self.storage.forget_personal, owner_id, list(memory_ids),
                                what=f"forget {len(memory_ids)} memories of user {owner_id}")

    async def last_message_of(self, channel_id: int, author_id: int, before: int | None = None) -> int | None:
        """The author's latest message in the channel's history, other than `before`."""
        return await self._read(self.storage.last_message_of, channel_id, author_id, before)

    async def drop_own_message(self, author_id: int, message_id: int) -> bool:
        """"Don't remember this": the author's message leaves the conversation history."""
        return await self.write(self.storage.drop_own_message, author_id, message_id, what="drop a message from the history")

    # -- several processes on one database (shards) ------------------------------

    async def take_lease(self, name: str, holder: str, seconds: float) -> bool:
        """Take or renew the lease `name` for `seconds`; False while another process holds it."""
        return await self.write(self.storage.take_lease, name, holder, seconds, what=f"take the {name} lease")

    async def release_lease(self, name: str, holder: str) -> bool:
        """Give the lease up if `holder` has it; False otherwise."""
        return await self.write(self.storage.release_lease, name, holder, what=f"release the {name} lease")

    async def lease_holder(self, name: str) -> str | None:
        """Who holds the lease now, or None."""
        return await self._read(self.storage.lease_holder, name)

    async def last_run(self, job: str) -> float | None:
        """When a periodic job last finished (unix seconds), in whichever process ran it."""
        return await self._read(self.storage.last_run, job)

    async def record_run(self, job: str, at: float) -> None:
        """Record that a periodic job finished at `at` (unix seconds)."""
        await self.write(self.storage.record_run, job, at, what=f"record the {job} run")
