"""/healthz and /metrics of the real bot on the fake Discord gateway, scraped over HTTP (cogs/health.py)."""
from __future__ import annotations

import asyncio
import json
import socket

import aiohttp
import discord
import pytest
from prometheus_client.parser import text_string_to_metric_families

from bot.memory.sql import store
from cogs.adapter import sync_commands
from cogs.client import MuninnBot
from cogs.sharding import make_bot
from tests.helpers import until
from tests.scenarios.test_discord_e2e import stop

FACT = "Alice keeps bees on the roof"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def answers(request: dict) -> str:
    if request.get("format"):
        said = request["messages"][-1]["content"]
        facts = [{"text": FACT, "about": "Alice", "scope": "personal", "importance": 0.8}] if "bees" in said else []
        return json.dumps({"facts": facts})
    return "Noted."


async def get(port: int, path: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session:
        async with session.get(f"http://127.0.0.1:{port}{path}") as response:
            return response.status, await response.text()


async def scrape(port: int) -> dict[tuple[str, tuple], float]:
    status, text = await get(port, "/metrics")
    assert status == 200
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def value(samples: dict, name: str, **labels) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


@pytest.mark.usefixtures("backend")  # the probe and the count on SQLite and PostgreSQL
async def test_health_and_metrics_of_the_running_bot(discord_world, fake_ollama, make_settings, monkeypatch):
    fake, alice, guild = discord_world
    fake_ollama.default_chat_reply = answers
    port = free_port()
    bot = MuninnBot(make_settings(fake_ollama.url, MUNINN_METRICS_PORT=port, MUNINN_STREAM_REPLIES="false"),
                    guild_ready_timeout=0.1)
    task = asyncio.create_task(bot.start("fake-token"))
    try:
        await fake.wait_until_ready()
        await until(lambda: bot.is_ready(), "ready")

        async def healthy() -> bool:
            return await get(port, "/healthz") == (200, "ok\n")
        await until(healthy, "healthy")

        dm = fake.dm_channel(alice)
        await fake.send_message(dm["id"], alice, "I keep bees on the roof.")
        await fake.wait_for_sent_message(dm["id"])
        await until(lambda: bot.extractor.processed >= 1 or bot.extractor.waiting > 0, "handed to the extractor")
        await bot.extractor.drain()
        assert await bot.engine.write(store.memories_of, int(alice["id"]), ("personal",))

        async def counted() -> bool:
            bot.get_cog("Health").recount()
            return value(await scrape(port), "muninn_memories", scope="personal") == 1
        await until(counted, "the memories counted by scope")
        samples = await scrape(port)
        assert value(samples, "discord_connected", shard="None") == 1
        assert value(samples, "discord_latency", shard="None") is not None
        assert value(samples, "discord_stat_total_guilds") == 1
        assert value(samples, "discord_event_on_message_total", shard="None") >= 1
        assert value(samples, "muninn_messages_answered_total", outcome="ok") == 1
        assert value(samples, "muninn_messages_answered_total", outcome="fallback") == 0
        assert value(samples, "muninn_messages_skipped_total", reason="rate") == 0
        assert value(samples, "muninn_reply_seconds_count") == 1
        assert value(samples, "muninn_recall_seconds_count") == 1
        [(mode, status)] = [(dict(labels)["mode"], dict(labels)["vector_status"])
                            for (name, labels), v in samples.items() if name == "muninn_recalls_total" and v == 1]
        assert mode in ("fts-only", "hybrid", "vector-only") and status
        assert value(samples, "muninn_facts_stored_total") == 1
        assert value(samples, "muninn_extraction_waiting") == 0
        assert value(samples, "muninn_extraction_batches_total", outcome="done") == 1
        assert value(samples, "muninn_llm_host_up", host=fake_ollama.url) == 1
        assert value(samples, "muninn_llm_host_cooling_down", host=fake_ollama.url, purpose="reply") == 0
        assert value(samples, "muninn_database_up") == 1
        assert FACT not in json.dumps([list(k) for k in samples])  # counts only, never a memory

        # The gateway drops and the reconnection hangs: 503 naming the shard, then 200 once it is back.
        back = asyncio.Event()
        connect = discord.gateway.DiscordWebSocket.from_client

        async def slow_reconnect(*args, **kwargs):
            await back.wait()
            return await connect(*args, **kwargs)
        monkeypatch.setattr(discord.gateway.DiscordWebSocket, "from_client", slow_reconnect)
        await fake.close_gateway(4000)

        async def disconnected() -> bool:
            status, text = await get(port, "/healthz")
            return status == 503 and "shard None is disconnected from the Discord gateway" in text
        await until(disconnected, "503 while disconnected")
        assert value(await scrape(port), "discord_connected", shard="None") == 0
        back.set()
        await until(healthy, "healthy again after the reconnection")

        # The database stops answering: 503 saying so.
        await bot.engine.close()

        async def database_down() -> bool:
            status, text = await get(port, "/healthz")
            return status == 503 and text.startswith("database: ")
        await until(database_down, "503 while the database does not answer")
        assert value(await scrape(port), "muninn_database_up") == 0
    finally:
        await stop(bot, task)
    with pytest.raises(aiohttp.ClientConnectionError):  # closed with the bot
        await get(port, "/healthz")


async def test_off_by_default(discord_world, fake_ollama, make_settings):
    fake, _, _ = discord_world
    bot = MuninnBot(make_settings(fake_ollama.url), guild_ready_timeout=0.1)
    task = asyncio.create_task(bot.start("fake-token"))
    try:
        await fake.wait_until_ready()
        assert bot.get_cog("Health") is None
        assert type(bot.pipeline.watch).__name__ == "Watch"
    finally:
        await stop(bot, task)


async def test_a_taken_port_is_one_log_line_and_the_bot_runs_on(discord_world, fake_ollama, make_settings, caplog):
    fake, alice, _ = discord_world
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        settings = make_settings(fake_ollama.url, MUNINN_METRICS_PORT=port, MUNINN_STREAM_REPLIES="false")
        assert await sync_commands(settings)  # logs in, never connects: serves nothing, says nothing of it
        assert not [r for r in caplog.records if "/healthz" in r.getMessage()]
        bot = MuninnBot(settings, guild_ready_timeout=0.1)
        task = asyncio.create_task(bot.start("fake-token"))
        try:
            await fake.wait_until_ready()
            dm = fake.dm_channel(alice)
            await fake.send_message(dm["id"], alice, "hello")
            await fake.wait_for_sent_message(dm["id"])
        finally:
            await stop(bot, task)
    [line] = [r.getMessage() for r in caplog.records if "cannot serve /healthz" in r.getMessage()]
    assert f":{port}" in line and "MUNINN_METRICS_PORT" in line


async def test_a_sharded_process_reports_each_of_its_shards(discord_world, fake_ollama, make_settings):
    fake, _, _ = discord_world
    port = free_port()
    bot = make_bot(make_settings(fake_ollama.url, MUNINN_METRICS_PORT=port, MUNINN_SHARD_COUNT=3,
                                 MUNINN_SHARD_IDS="0,2"), guild_ready_timeout=0.1)
    task = asyncio.create_task(bot.start("fake-token"))
    try:
        await until(lambda: bot.is_ready() and len(fake.live_connections) == 2, "both shards connected")

        async def healthy() -> bool:
            return await get(port, "/healthz") == (200, "ok\n")
        await until(healthy, "healthy")
        samples = await scrape(port)
        assert value(samples, "discord_connected", shard="0") == value(samples, "discord_connected", shard="2") == 1
        assert value(samples, "discord_connected", shard="1") is None  # another process's shard
    finally:
        await stop(bot, task)
