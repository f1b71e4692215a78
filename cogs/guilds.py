"""Servers Muninn joins and leaves: what it kept of a server it was removed from is purged by
maintenance after MUNINN_GUILD_RETENTION_DAYS (bot/memory/guilds.py), unless it is added back first.

A removal (Discord's GUILD_DELETE, not an outage: discord.py reports those as unavailable
instead) records the departure; a join clears it. At each start the servers the database knows
and Muninn is no longer in count as removed while it was offline, and those it is in again as
added back. With several shard processes each judges only its own shards' servers: the others'
are not in its list because another process serves them.
"""
from __future__ import annotations

import logging
from typing import Callable

import discord
from discord.ext import commands

from bot.memory.engine import Engine
from bot.memory.errors import explain

log = logging.getLogger(__name__)


def judge_of(shard_ids: list[int] | None, shard_count: int | None) -> Callable[[int], bool]:
    """Which servers a process may judge: all of them without sharding, else those of its shards
    (Discord sends a server's events to shard (guild_id >> 22) % shard_count)."""
    if not shard_count:
        return lambda guild_id: True
    mine = frozenset(shard_ids if shard_ids is not None else range(shard_count))
    return lambda guild_id: (guild_id >> 22) % shard_count in mine


class GuildPresence(commands.Cog):
    """Records the servers Muninn leaves and rejoins, for the purge of the ones it left."""

    def __init__(self, bot: commands.Bot):
        self.bot = bot

    @property
    def engine(self) -> Engine | None:
        """The bot's engine (None while it closes)."""
        return self.bot.engine  # type: ignore[attr-defined]

    @property
    def retention_days(self) -> float:
        """MUNINN_GUILD_RETENTION_DAYS."""
        return self.bot.settings.guild_retention_days  # type: ignore[attr-defined]

    @commands.Cog.listener()
    async def on_guild_remove(self, guild: discord.Guild) -> None:
        """Muninn left or was removed from a server: record when, for the purge."""
        if await self._note(guild, "departed"):
            log.info("removed from server %s: what Muninn kept of it is purged %g days from now unless it is "
                     "added back (MUNINN_GUILD_RETENTION_DAYS)", guild.id, self.retention_days)

    @commands.Cog.listener()
    async def on_guild_join(self, guild: discord.Guild) -> None:
        """Muninn was added to a server: if it had left it, nothing of it is purged now."""
        if await self._note(guild, "returned"):
            log.info("added back to server %s: what Muninn kept of it stays", guild.id)

    async def _note(self, guild: discord.Guild, what: str) -> bool:
        """engine.guilds.departed / returned for this server; False when nothing changed or the
        database failed (the engine logged it in one line; the next start judges the server again)."""
        engine = self.engine
        if engine is None:
            return False
        try:
            return bool(await getattr(engine.guilds, what)(guild.id))
        except Exception as exc:
            if explain(exc) is None:
                raise
            return False

    @commands.Cog.listener()
    async def on_ready(self) -> None:
        """The servers the database knows that this process serves and Muninn is no longer in
        count as removed while offline; those it is in again, as added back."""
        engine = self.engine
        if engine is None:
            return
        shard_ids = getattr(self.bot, "shard_ids", None)
        # the snapshot and the queued write together, no await between: a join handled after it is written after it
        present = [guild.id for guild in self.bot.guilds]
        try:
            result = await engine.guilds.reconcile(present, judge_of(shard_ids, self.bot.shard_count))
        except Exception as exc:
            if explain(exc) is None:
                raise
            return
        if result.departed:
            log.info("Muninn is no longer in %d servers it has memories of (removed while offline?): what it kept "
                     "of them is purged after MUNINN_GUILD_RETENTION_DAYS=%g unless it is added back",
                     len(result.departed), self.retention_days)
        if result.returned:
            log.info("added back to %d servers while offline: what Muninn kept of them stays", len(result.returned))


async def setup(bot: commands.Bot) -> None:
    """Load the cog (discord.py's extension entry point)."""
    await bot.add_cog(GuildPresence(bot))
