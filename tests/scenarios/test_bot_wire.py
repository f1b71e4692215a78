"""The bot in real life over the wire (tests/fakes/discord_server.py): streamed replies as
message edits, the ⏳ sign past the queue limit, and a graceful stop on a real SIGTERM sent to
a `muninn run` subprocess. Every test runs against each setup of LLM servers (tests/fakes/servers.py):
Ollama, an OpenAI-compatible server, and chat on the OpenAI one with embeddings on Ollama.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import textwrap
import time
from pathlib import Path

import pytest

from bot.conversation.text import split_message
from bot.conversation.thinking import CANNOT_THINK
from bot.memory.engine import Engine
from bot.memory.sql import store
from cogs.client import MuninnBot
from tests.fakes.discord_server import FakeDiscord
from tests.helpers import schema_of

pytestmark = pytest.mark.usefixtures("backend")  # tests that open a database: on SQLite and PostgreSQL

ROOT = Path(__file__).resolve().parents[2]
FACT = "Alice's sister is called Ylva"


@pytest.fixture
def fake_ollama(llm):
    """The chat server of the setup under test, which the tests script (`llm.embed` embeds)."""
    return llm.chat


@pytest.fixture
def make_settings(make_settings, llm):
    """Settings pointing at the setup's servers when given the chat server's URL."""
    return llm.settings_maker(make_settings)


@contextlib.asynccontextmanager
async def running(bot: MuninnBot, fake: FakeDiscord):
    task = asyncio.create_task(bot.start("fake-token"))
    try:
        await fake.wait_until_ready()
        yield bot
    finally:
        await bot.close()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, 5)


def stored_content(fake: FakeDiscord, channel_id: str, message_id: str) -> str:
    return next(m["content"] for m in fake.messages[channel_id] if m["id"] == message_id)


async def test_a_reply_streams_as_edits_about_once_a_second_and_ends_as_the_whole_answer(
        discord_world, fake_ollama, make_settings):
    fake, alice, _ = discord_world
    answer = " ".join(f"word{n}" for n in range(30))
    fake_ollama.default_chat_reply = answer
    fake_ollama.stream_delay = 0.1                    # a model writing ten words a second
    bot = MuninnBot(make_settings(fake_ollama.url, MUNINN_EXTRACTION="false"), guild_ready_timeout=0.1)
    async with running(bot, fake):
        dm = fake.dm_channel(alice)
        asked = time.monotonic()
        await fake.send_message(dm["id"], alice, "count for me")
        first = await fake.wait_for_sent_message(dm["id"])
        first_seen = time.monotonic() - asked
        await fake.wait_for(lambda: stored_content(fake, dm["id"], first["message"]["id"]) == answer, timeout=10)
        edits = list(fake.edited_messages)  # their spacing is measured in the next test
    assert first_seen < 1.0, first_seen                 # the answer appears within about a second
    assert first["json"]["content"].startswith("word0") and len(first["json"]["content"]) < len(answer)
    assert len([m for m in fake.sent_messages if m["channel_id"] == dm["id"]]) == 1
    assert 2 <= len(edits) <= 4                          # ~3 s of writing: about one edit a second
    assert all(e["json"]["allowed_mentions"] == {"parse": []} for e in edits)
    assert first["json"]["message_reference"]["message_id"] == int(fake.messages[dm["id"]][0]["id"])


async def test_edits_keep_to_about_one_a_second_and_a_long_reply_splits_as_it_grows(
        discord_world, fake_ollama, make_settings, monkeypatch):
    fake, alice, _ = discord_world
    answer = "\n\n".join(f"Part {n}. " + "Ravens remember faces. " * 40 for n in range(4))  # ~3,700 chars
    fake_ollama.default_chat_reply = answer
    fake_ollama.stream_pieces, fake_ollama.stream_delay = 60, 0.05
    edit_times: list[float] = []
    original = FakeDiscord._edit_message

    async def timed_edit(self, *args):
        edit_times.append(time.monotonic())
        return await original(self, *args)
    monkeypatch.setattr(FakeDiscord, "_edit_message", timed_edit)
    fake._routes = fake._build_routes()
    bot = MuninnBot(make_settings(fake_ollama.url, MUNINN_EXTRACTION="false"), guild_ready_timeout=0.1)
    async with running(bot, fake):
        dm = fake.dm_channel(alice)
        await fake.send_message(dm["id"], alice, "tell me everything")
        parts = split_message(answer)
        await fake.wait_for(lambda: [m["content"] for m in fake.messages[dm["id"]][1:]] == parts, timeout=15)
    assert len(parts) >= 2
    gaps = [b - a for a, b in zip(edit_times, edit_times[1:], strict=False)]
    # Each update edits at most the part that grew and posts the next: at most ~2 requests a second.
    print("GAPS", [round(g, 2) for g in gaps])
    assert len(edit_times) <= 2 * (edit_times[-1] - edit_times[0] + 1) + 2, gaps


async def test_a_stream_that_breaks_off_after_two_messages_ends_as_one_fallback(
        discord_world, fake_ollama, make_settings):
    fake, alice, _ = discord_world
    fake_ollama.default_chat_reply = "Ravens remember faces. " * 150     # ~3,400 characters
    fake_ollama.stream_pieces, fake_ollama.stream_delay, fake_ollama.stream_fail_after = 5, 0.4, 4
    bot = MuninnBot(make_settings(fake_ollama.url, MUNINN_EXTRACTION="false"), guild_ready_timeout=0.1)
    async with running(bot, fake):
        dm = fake.dm_channel(alice)
        await fake.send_message(dm["id"], alice, "tell me about ravens")
        await fake.wait_for(lambda: fake.deleted_messages, timeout=10)
        await fake.wait_for(lambda: [m["content"] for m in fake.messages[dm["id"]][1:]] == [CANNOT_THINK], timeout=5)
    posted = [m for m in fake.sent_messages if m["channel_id"] == dm["id"]]
    assert len(posted) == 2 and fake.deleted_messages[0]["message_id"] == posted[1]["message"]["id"]


async def test_past_the_queue_limit_a_message_gets_an_hourglass_not_silence(discord_world, fake_ollama, make_settings):
    fake, alice, _ = discord_world
    fake_ollama.default_chat_reply = "Done."
    fake_ollama.mode, fake_ollama.delay = "slow", 0.6
    bot = MuninnBot(make_settings(fake_ollama.url, MUNINN_EXTRACTION="false", MUNINN_REPLY_QUEUE_LIMIT="1",
                                  MUNINN_STREAM_REPLIES="false"), guild_ready_timeout=0.1)
    async with running(bot, fake):
        dm = fake.dm_channel(alice)
        first = await fake.send_message(dm["id"], alice, "one")
        await fake.wait_for(lambda: fake_ollama.chat_requests(), timeout=5)
        second = await fake.send_message(dm["id"], alice, "two")
        await fake.wait_for(lambda: fake.reactions, timeout=5)
        await fake.wait_for_sent_message(dm["id"])
    assert [(r["message_id"], r["emoji"]) for r in fake.reactions] == [(second["id"], "⏳")]
    [reply] = [m for m in fake.sent_messages if m["channel_id"] == dm["id"]]
    assert reply["json"]["message_reference"]["message_id"] == int(first["id"])


LAUNCHER = textwrap.dedent("""
    import sys
    import discord.gateway, discord.http, yarl
    discord.http.Route.BASE = sys.argv[1]
    discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY = yarl.URL(sys.argv[2])
    from cogs.launch import main
    sys.exit(main(["run"]))
""")


def extraction_or(reply: str):
    def answer(request: dict) -> str:
        if schema_of(request):
            said = request["messages"][-1]["content"]
            facts = [{"text": FACT, "about": "Alice", "scope": "personal", "importance": 0.8}] if "Ylva" in said else []
            return json.dumps({"facts": facts})
        return reply
    return answer


async def test_sigterm_finishes_the_reply_in_flight_saves_waiting_facts_and_exits_cleanly(
        discord_world, fake_ollama, make_settings, tmp_path, llm):
    fake, alice, _ = discord_world
    fake_ollama.default_chat_reply = extraction_or("Noted.")
    launcher = tmp_path / "launch.py"
    launcher.write_text(LAUNCHER)
    db = tmp_path / "bot.db"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DISCORD_TOKEN": "fake-token", "OLLAMA_URL": fake_ollama.url,
           "MUNINN_DB_PATH": str(db), "MUNINN_SHUTDOWN_SECONDS": "5", "MUNINN_MAINTENANCE_HOURS": "0",
           "MUNINN_STREAM_REPLIES": "false", "MUNINN_LOG_LEVEL": "INFO",
           "MUNINN_DATABASE_URL": make_settings().database_url, **llm.env}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(launcher), fake.rest_url, fake.gateway_url, cwd=tmp_path, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        await fake.wait_until_ready(timeout=30)
        dm = fake.dm_channel(alice)
        await fake.send_message(dm["id"], alice, "My sister is called Ylva.")
        await fake.wait_for_sent_message(dm["id"], timeout=15)     # answered; its facts wait ~1.5 s to batch

        # The next answer takes a while; SIGTERM arrives while it is being written.
        fake_ollama.chat_replies.append(fake_ollama.TIMEOUT)
        fake_ollama.delay = 1.0
        asked = len(fake_ollama.chat_requests())
        sent = len(fake.sent_messages)
        await fake.send_message(dm["id"], alice, "And what do you think of that?")
        await fake.wait_for(lambda: len(fake_ollama.chat_requests()) > asked, timeout=10)
        stopped_at = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        await asyncio.sleep(0.3)  # the signal is handled on the bot's loop; the reply is still being written
        await fake.send_message(dm["id"], alice, "too late: Muninn is stopping")
        _, stderr = await asyncio.wait_for(proc.communicate(), 30)
        took = time.monotonic() - stopped_at
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    log = stderr.decode()
    assert proc.returncode == 0, log
    assert "Traceback" not in log and "ERROR" not in log and "stopped cleanly" in log
    assert "SIGTERM: stopping; 1 replies in flight" in log
    assert took < 10, took                                          # within the bounds, not hanging
    replies = [m["json"]["content"] for m in fake.sent_messages[sent:] if m["channel_id"] == dm["id"]]
    assert replies == ["Noted."]                                    # the reply in flight was finished...
    async with Engine(make_settings(fake_ollama.url, MUNINN_DB_PATH=str(db))) as engine:
        [memory] = await engine.write(store.memories_of, int(alice["id"]), ("personal",))
        assert memory.text == FACT                                  # ...and the waiting fact was saved
        stored = await engine.write(lambda conn: [r[0] for r in conn.execute("SELECT content FROM messages")])
    assert [FACT] in [body["input"] for body in llm.embed.embed_requests()]  # embedded by the embedding server
    assert "too late: Muninn is stopping" not in stored             # nothing new was taken
    assert "voice will NOT be supported" not in log


async def test_ctrl_c_stops_an_idle_bot_cleanly(discord_world, fake_ollama, tmp_path, database_env, llm):
    fake, _, _ = discord_world
    launcher = tmp_path / "launch.py"
    launcher.write_text(LAUNCHER)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DISCORD_TOKEN": "fake-token", "OLLAMA_URL": fake_ollama.url,
           "MUNINN_DB_PATH": str(tmp_path / "bot.db"), "MUNINN_MAINTENANCE_HOURS": "0", "MUNINN_LOG_LEVEL": "INFO",
           **llm.env}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, str(launcher), fake.rest_url, fake.gateway_url, cwd=tmp_path, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        await fake.wait_until_ready(timeout=30)
        await fake.wait_for(lambda: llm.model_list_requests() >= 2, timeout=15)
        await asyncio.sleep(0.2)  # the start-up check of both models has been logged
        proc.send_signal(signal.SIGINT)
        _, stderr = await asyncio.wait_for(proc.communicate(), 20)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    log = stderr.decode()
    assert proc.returncode == 0 and "SIGINT: stopping; 0 replies in flight" in log and "stopped cleanly" in log, log
    assert "Traceback" not in log and "KeyboardInterrupt" not in log
    steps = [line.split(": ", 1)[1] for line in log.splitlines() if " INFO " in line]
    assert any(step.startswith("database ") for step in steps) and "voice" not in log  # one line per step
    assert any(step.startswith(llm.started_line) for step in steps), steps
