"""Several bot processes serving one bot (MUNINN_SHARD_COUNT / MUNINN_SHARD_IDS) on one database,
over the wire against the fake Discord gateway, which routes each guild to its shard."""
from __future__ import annotations

import asyncio
import contextlib

import pytest
from discord.ext import commands

from bot.memory.engine import Engine
from bot.settings import SettingsError
from cogs.client import MuninnBot
from cogs.sharding import ShardedMuninnBot, make_bot
from tests.fakes.discord_server import FakeDiscord, patch_discord_urls
from tests.helpers import ALICE

pytestmark = pytest.mark.usefixtures("backend")  # shard processes on one SQLite file or PostgreSQL database

# Guild ids on shard 0 and shard 1 of two: Discord routes by (guild_id >> 22) % shard_count.
GUILD_ON_0, GUILD_ON_1 = 1000 << 22, 1001 << 22


def test_shard_settings_choose_the_sharded_bot(make_settings):
    plain = make_bot(make_settings())
    assert type(plain) is MuninnBot and not isinstance(plain, commands.AutoShardedBot)
    sharded = make_bot(make_settings(MUNINN_SHARD_COUNT=4, MUNINN_SHARD_IDS="2,3"))
    assert isinstance(sharded, ShardedMuninnBot) and isinstance(sharded, commands.AutoShardedBot)
    assert (sharded.shard_ids, sharded.shard_count) == ([2, 3], 4)
    every = make_bot(make_settings(MUNINN_SHARD_COUNT=2))
    assert (every.shard_ids, every.shard_count) == ([0, 1], 2)
    with pytest.raises(SettingsError, match="MUNINN_SHARD_IDS"):
        make_settings(MUNINN_SHARD_COUNT=2, MUNINN_SHARD_IDS="2")


@contextlib.asynccontextmanager
async def running(bots, fake: FakeDiscord):
    tasks = [asyncio.create_task(bot.start("fake-token")) for bot in bots]
    try:
        await fake.wait_for(lambda: len(fake.live_connections) == len(bots) and all(b.is_ready() for b in bots),
                            timeout=15)
        yield bots
    finally:
        for bot in bots:
            await bot.close()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(task, 5)


async def test_two_shard_processes_serve_one_bot_each_seeing_only_its_guilds(monkeypatch, fake_ollama,
                                                                             make_settings):
    fake_ollama.default_chat_reply = "Got it."
    async with FakeDiscord(heartbeat_interval=200) as fake:
        patch_discord_urls(fake, monkeypatch)
        alice = fake.add_user("alice", global_name="Alice")
        guilds = [fake.add_guild(name, id=gid, members=[alice])
                  for name, gid in (("Asgard", GUILD_ON_0), ("Midgard", GUILD_ON_1))]
        bots = [make_bot(make_settings(fake_ollama.url, MUNINN_EXTRACTION="false", MUNINN_STREAM_REPLIES="false",
                                       MUNINN_SHARD_COUNT=2, MUNINN_SHARD_IDS=str(shard)), guild_ready_timeout=0.1)
                for shard in (0, 1)]
        async with running(bots, fake):
            assert sorted(tuple(i["shard"]) for i in fake.identifies) == [(0, 2), (1, 2)]
            assert [[g.id for g in bot.guilds] for bot in bots] == [[GUILD_ON_0], [GUILD_ON_1]]
            for guild in guilds:
                channel = guild["channels"][0]
                sent = len(fake.sent_messages)
                await fake.send_message(channel["id"], alice, f"{fake.mention(fake.bot_user)} hello",
                                        mentions=[fake.bot_user])
                await fake.wait_for_sent_message(channel["id"], since=sent)
            dm = fake.dm_channel(alice)
            await fake.send_message(dm["id"], alice, "hello in private")   # DMs go to shard 0
            await fake.wait_for_sent_message(dm["id"])
            await asyncio.sleep(0.3)                                       # time for a second answer, if any
            replies = [m["channel_id"] for m in fake.sent_messages]
            assert sorted(replies) == sorted([g["channels"][0]["id"] for g in guilds] + [dm["id"]])
            assert len(fake_ollama.chat_requests()) == 3                  # each message answered by one process
        assert fake.unhandled_requests == []


async def test_a_pause_made_in_one_shard_process_holds_in_the_others(make_settings):
    settings = make_settings(MUNINN_SHARD_COUNT=2)
    async with Engine(settings) as first, Engine(settings) as second:
        assert not await second.memory_paused(ALICE)        # read (and cached) before the pause
        assert await first.pause_memory(ALICE)
        assert await second.memory_paused(ALICE)
        assert await second.resume_memory(ALICE)
        assert not await first.memory_paused(ALICE)
