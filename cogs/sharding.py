"""Several bot processes serving one bot (MUNINN_SHARD_COUNT, MUNINN_SHARD_IDS).

Discord splits a bot's servers into shards (a guild's events go to shard
`(guild_id >> 22) % shard_count`, DMs to shard 0) and requires them from 2,500 servers on.
With the two settings each process runs discord.py's `AutoShardedBot` for its own shards
only, so N processes (one per core, all on one machine) serve one bot and share one SQLite
file: every message, and so every extraction, is seen by exactly one process; the
maintenance lease (bot.memory.sql.leases) lets exactly one of them run maintenance. Without the
settings Muninn is the plain one-process `MuninnBot`.
"""
from __future__ import annotations

from typing import Any

from discord.ext import commands

from bot.settings import Settings
from cogs.client import MuninnBot


class ShardedMuninnBot(MuninnBot, commands.AutoShardedBot):
    """`MuninnBot` on discord.py's sharded client (the MRO puts AutoShardedClient's gateway
    handling under MuninnBot's set-up, shutdown and error handling)."""


def shards_of(settings: Settings) -> list[int]:
    """The shard ids this process serves: MUNINN_SHARD_IDS, or all of MUNINN_SHARD_COUNT."""
    return list(settings.shard_ids) or list(range(settings.shard_count))


def make_bot(settings: Settings, **options: Any) -> MuninnBot:
    """The bot this process runs: sharded when MUNINN_SHARD_COUNT is set, else the plain one."""
    if not settings.shard_count:
        return MuninnBot(settings, **options)
    return ShardedMuninnBot(settings, shard_ids=shards_of(settings), shard_count=settings.shard_count, **options)
