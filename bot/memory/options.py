"""Settings of servers, channels and threads that people change from Discord (`engine.options`).

Named methods over the SQL of `sql/options.py`, run on the engine's threads. What a key means,
which values it takes and how a place inherits it are the conversation layer's business
(bot/conversation/overrides.py); this layer stores and reads text.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from bot.memory.connection import Connection
from bot.memory.jobs import Jobs
from bot.memory.sql import options
from bot.memory.sql.rooms import set_guild_setting


@dataclass(frozen=True)
class Stored:
    """What is stored for one place: its server's settings, and each asked channel's (or thread's)."""
    guild: dict[str, str] = field(default_factory=dict)
    channels: dict[int, dict[str, str]] = field(default_factory=dict)

    def channel(self, channel_id: int | None) -> dict[str, str]:
        """The settings stored for one of the asked channels ({} when none, or not asked)."""
        return self.channels.get(channel_id, {}) if channel_id is not None else {}


class Options:
    """`engine.options`: read a place's stored settings, set and reset them."""

    def __init__(self, jobs: Jobs) -> None:
        self._jobs = jobs

    async def stored(self, guild_id: int | None, channel_ids: Sequence[int]) -> Stored:
        """The server's settings and those of the channels (a thread and its parent), in one read."""
        return await self._jobs.read(_stored, guild_id, list(channel_ids))

    async def set_guild(self, guild_id: int, key: str, value: str) -> None:
        """Set one setting of a server."""
        await self._jobs.write(set_guild_setting, guild_id, key, value, what="set a server's setting")

    async def reset_guild(self, guild_id: int, key: str) -> bool:
        """Unset one setting of a server (the .env's applies again); False when it was not set."""
        return await self._jobs.write(options.clear_guild_option, guild_id, key, what="reset a server's setting")

    async def set_channel(self, channel_id: int, guild_id: int | None, key: str, value: str) -> None:
        """Set one setting of a channel or thread."""
        await self._jobs.write(options.set_channel_option, channel_id, guild_id, key, value,
                               what="set a channel's setting")

    async def reset_channel(self, channel_id: int, key: str) -> bool:
        """Unset one setting of a channel or thread (it inherits again); False when it was not set."""
        return await self._jobs.write(options.clear_channel_option, channel_id, key, what="reset a channel's setting")


def _stored(conn: Connection, guild_id: int | None, channel_ids: list[int]) -> Stored:
    guild = options.guild_options(conn, guild_id) if guild_id is not None else {}
    return Stored(guild, options.channel_options(conn, channel_ids))
