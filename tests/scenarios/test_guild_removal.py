"""Removed from a server, Muninn records it, and being added back clears it; a server left while
Muninn was offline is found at the next start, by the process whose shard it is. The real bot over
the fake Discord gateway (GUILD_DELETE / GUILD_CREATE), on SQLite and PostgreSQL."""
from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

from bot.memory.engine import Engine
from bot.memory.sql import history
from cogs.client import MuninnBot
from cogs.sharding import make_bot
from tests.fakes.discord_server import FakeDiscord, patch_discord_urls
from tests.scenarios.test_discord_e2e import stop

pytestmark = pytest.mark.usefixtures("backend")

# Discord routes a guild to shard (guild_id >> 22) % shard_count: these are on shard 0 and 1 of two.
GUILD_ON_0, GUILD_ON_1 = 1000 << 22, 1001 << 22
GONE_ON_0, GONE_ON_1 = 1002 << 22, 1003 << 22


async def seed(settings, *guilds: int) -> None:
    """The database knows these servers: a message of each in its history."""
    async with Engine(settings, warm=False) as engine:
        for guild in guilds:
            await engine.write(history.record, channel_id=guild + 7, guild_id=guild, author_id=11, author_name="Alice",
                               role="user", content="hello from the old days", created_at=time.time() - 3600,
                               message_id=guild + 1)


async def test_removal_is_recorded_a_join_clears_it_and_the_purge_takes_the_server(discord_world, fake_ollama,
                                                                                  make_settings):
    fake, alice, guild = discord_world
    general, gid = guild["channels"][0], int(guild["id"])
    fake_ollama.default_chat_reply = "Got it."
    settings = make_settings(fake_ollama.url, MUNINN_EXTRACTION="false", MUNINN_STREAM_REPLIES="false")
    await seed(settings, GONE_ON_0)                          # a server Muninn was removed from while offline
    bot = MuninnBot(settings, guild_ready_timeout=0.1)
    task = asyncio.create_task(bot.start("fake-token"))
    try:
        await fake.wait_for(bot.is_ready, timeout=15)
        engine = bot.engine
        assert engine is not None
        found = await fake.wait_for(engine.guilds.departures, timeout=5)
        assert list(found) == [GONE_ON_0]                    # the server it is in is not judged gone
        await fake.send_message(general["id"], alice, f"{fake.mention(fake.bot_user)} hello", mentions=[fake.bot_user])
        await fake.wait_for_sent_message(general["id"])

        async def both_kept() -> bool:  # the reply's row is written after it is posted
            return len(await engine.messages.recent(int(general["id"]), 10)) == 2
        assert await fake.wait_for(both_kept, timeout=5)

        await fake.remove_guild(guild, unavailable=True)     # an outage is no removal
        await asyncio.sleep(0.3)
        assert list(await engine.guilds.departures()) == [GONE_ON_0]

        await fake.remove_guild(guild)
        async def recorded() -> bool:
            return gid in await engine.guilds.departures()
        await fake.wait_for(recorded, timeout=5)
        departed_at = (await engine.guilds.departures())[gid]
        assert time.time() - 60 < departed_at <= time.time()

        await fake.join_guild(guild)
        async def cleared() -> bool:
            return gid not in await engine.guilds.departures()
        await fake.wait_for(cleared, timeout=5)
        assert len(await engine.messages.recent(int(general["id"]), 10)) == 2

        await fake.remove_guild(guild)
        await fake.wait_for(recorded, timeout=5)
        purged = await engine.guilds.purge_departed(0)       # MUNINN_GUILD_RETENTION_DAYS=0's next maintenance
        assert sorted(p.guild_id for p in purged) == sorted([gid, GONE_ON_0])
        assert await engine.messages.recent(int(general["id"]), 10) == []
        assert await engine.guilds.departures() == {}
    finally:
        await stop(bot, task)


@contextlib.asynccontextmanager
async def running(bot: MuninnBot):
    task = asyncio.create_task(bot.start("fake-token"))
    try:
        await asyncio.wait_for(bot.wait_until_ready(), 15)
        yield bot
    finally:
        await stop(bot, task)


async def test_each_shard_process_judges_only_its_own_servers(monkeypatch, fake_ollama, make_settings):
    async with FakeDiscord(heartbeat_interval=200) as fake:
        patch_discord_urls(fake, monkeypatch)
        alice = fake.add_user("alice", global_name="Alice")
        for name, gid in (("Asgard", GUILD_ON_0), ("Midgard", GUILD_ON_1)):
            fake.add_guild(name, id=gid, members=[alice])

        def shard(number: int) -> MuninnBot:
            return make_bot(make_settings(fake_ollama.url, MUNINN_EXTRACTION="false", MUNINN_SHARD_COUNT=2,
                                          MUNINN_SHARD_IDS=str(number)), guild_ready_timeout=0.1)
        await seed(make_settings(fake_ollama.url), GUILD_ON_0, GUILD_ON_1, GONE_ON_0, GONE_ON_1)
        async with running(shard(0)) as first:
            assert [g.id for g in first.guilds] == [GUILD_ON_0]
            engine = first.engine
            assert engine is not None
            # Midgard is not in shard 0's list, and the server gone from shard 1 is not shard 0's to judge
            assert list(await fake.wait_for(engine.guilds.departures, timeout=5)) == [GONE_ON_0]
            async with running(shard(1)):
                async def both() -> bool:
                    return set(await engine.guilds.departures()) == {GONE_ON_0, GONE_ON_1}
                await fake.wait_for(both, timeout=5)
        assert fake.unhandled_requests == []
