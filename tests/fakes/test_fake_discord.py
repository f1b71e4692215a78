"""Self-test of the fake Discord (tests/fakes/discord_server.py).

Runs an *unmodified* discord.py ``commands.Bot`` against the fake REST API and
websocket gateway on 127.0.0.1; only ``Route.BASE`` and
``DiscordWebSocket.DEFAULT_GATEWAY`` are patched (via monkeypatch).
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import sys
import zlib
from pathlib import Path
from typing import Any, AsyncIterator, Dict, Tuple

import aiohttp
import discord
import pytest
import pytest_asyncio
from discord import app_commands
from discord.ext import commands

_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from tests.fakes.discord_server import (  # noqa: E402
    FakeDiscord,
    Intents,
    discord_urls_patched,
    patch_discord_urls,
)


def make_bot(**kwargs: Any) -> commands.Bot:
    intents = discord.Intents.default()
    intents.message_content = True
    bot = commands.Bot(command_prefix="!", intents=intents, guild_ready_timeout=0.1, **kwargs)
    bot.seen_messages = []  # type: ignore[attr-defined]

    @bot.event
    async def on_message(message: discord.Message) -> None:
        bot.seen_messages.append(message)  # type: ignore[attr-defined]
        if message.author.bot:
            return
        if message.content == "ping":
            await message.reply("pong", allowed_mentions=discord.AllowedMentions.none())
        elif message.content == "file":
            await message.channel.send("here", file=discord.File(io.BytesIO(b"hello"), filename="a.txt"))
        elif message.content == "long":
            try:
                await message.channel.send("x" * 2001)
            except discord.HTTPException as exc:
                await message.channel.send(f"error {exc.status} {exc.code}")

    @bot.tree.command(name="remember", description="Remember something")
    @app_commands.describe(text="what to remember")
    async def remember(interaction: discord.Interaction, text: str) -> None:
        perms_ok = interaction.guild is None or interaction.app_permissions.send_messages
        await interaction.response.send_message(f"noted: {text} ({perms_ok})", ephemeral=True)
        await interaction.followup.send("followup!", ephemeral=True)

    return bot


async def _start(fake: FakeDiscord, bot: commands.Bot, token: str = "fake-token") -> asyncio.Task:
    task = asyncio.create_task(bot.start(token))
    try:
        await fake.wait_until_ready(timeout=5)
    except TimeoutError:
        if task.done():
            task.result()  # surface the bot's own error
        raise
    return task


async def _shutdown(bot: commands.Bot, task: asyncio.Task) -> None:
    await bot.close()
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.wait_for(task, timeout=5)


@pytest_asyncio.fixture
async def world(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Tuple[FakeDiscord, commands.Bot, Dict[str, Any]]]:
    async with FakeDiscord(heartbeat_interval=200) as fake:
        patch_discord_urls(fake, monkeypatch)
        alice = fake.add_user("alice")
        guild = fake.add_guild("Test Guild", members=[alice])
        general = guild["channels"][0]
        bot = make_bot()
        task = await _start(fake, bot)
        try:
            yield fake, bot, {"alice": alice, "guild": guild, "general": general}
        finally:
            await _shutdown(bot, task)
            assert fake.unhandled_requests == [], fake.unhandled_requests


@pytest.mark.asyncio
async def test_identify_ready_and_heartbeats(world) -> None:
    fake, bot, w = world
    ident = fake.identify_payload
    assert ident is not None and ident["token"] == "fake-token"
    assert ident["intents"] == bot.intents.value
    assert ident["intents"] & Intents.MESSAGE_CONTENT
    conn = fake.gateway_connections[0]
    # discord.py asks for transport compression; the fake honours it.
    assert conn.query["v"] == "10" and conn.query["encoding"] == "json"
    assert conn.compress in ("zlib-stream", "zstd-stream")
    # GET /users/@me (login) and application_info happened over REST.
    paths = [(r["method"], r["path"]) for r in fake.requests]
    assert ("GET", "/users/@me") in paths
    assert ("GET", "/oauth2/applications/@me") in paths
    await asyncio.wait_for(bot.wait_until_ready(), 5)
    assert bot.user is not None and bot.user.id == int(fake.bot_user["id"]) and bot.user.bot
    assert bot.application_id == int(fake.application_id)
    guild = bot.get_guild(int(w["guild"]["id"]))
    assert guild is not None and guild.me is not None
    channel = guild.get_channel(int(w["general"]["id"]))
    assert isinstance(channel, discord.TextChannel)
    assert channel.permissions_for(guild.me).send_messages
    # 200 ms heartbeats: at least 3 (one is sent right after HELLO) within ~1 s, all acked.
    await fake.wait_for(lambda: fake.heartbeat_acks >= 3, timeout=3)
    assert fake.heartbeat_acks == fake.heartbeats_received
    assert bot.latency < 1.0


@pytest.mark.asyncio
async def test_ping_pong_in_guild_and_dm(world) -> None:
    fake, bot, w = world
    alice, general = w["alice"], w["general"]

    ping = await fake.send_message(general["id"], alice, "ping")
    rec = await fake.wait_for_sent_message(general["id"])
    body = rec["json"]
    assert body["content"] == "pong"
    assert body["allowed_mentions"] == {"parse": []}
    assert body["message_reference"]["message_id"] == int(ping["id"])
    assert body["message_reference"]["channel_id"] == int(general["id"])
    # The bot saw alice's message as a Member in the right guild/channel.
    seen = next(m for m in bot.seen_messages if m.id == int(ping["id"]))
    assert isinstance(seen.author, discord.Member) and seen.guild and seen.guild.id == int(w["guild"]["id"])
    # ...and its own reply echoed back over the gateway, like real Discord.
    await fake.wait_for(lambda: any(m.author == bot.user for m in bot.seen_messages))

    dm = fake.dm_channel(alice)
    n = len(fake.sent_messages)
    dm_ping = await fake.send_message(dm["id"], alice, "ping")
    assert "guild_id" not in dm_ping and "member" not in dm_ping
    rec = await fake.wait_for_sent_message(dm["id"], since=n)
    assert rec["json"]["content"] == "pong"
    assert rec["json"]["allowed_mentions"] == {"parse": []}
    assert rec["json"]["message_reference"]["message_id"] == int(dm_ping["id"])
    seen = next(m for m in bot.seen_messages if m.id == int(dm_ping["id"]))
    assert isinstance(seen.channel, discord.DMChannel) and seen.guild is None

    # Opening a DM from the bot side goes through POST /users/@me/channels.
    user = await bot.fetch_user(int(alice["id"]))
    await user.send("hello alice")
    rec = await fake.wait_for_sent_message(dm["id"], predicate=lambda r: r["json"]["content"] == "hello alice")
    assert ("POST", "/users/@me/channels") in [(r["method"], r["path"]) for r in fake.requests]


@pytest.mark.asyncio
async def test_files_and_validation(world) -> None:
    fake, bot, w = world
    alice, general = w["alice"], w["general"]

    await fake.send_message(general["id"], alice, "file")
    rec = await fake.wait_for_sent_message(general["id"])
    assert rec["json"]["content"] == "here"
    assert rec["files"][0]["filename"] == "a.txt" and rec["files"][0]["data"] == b"hello"

    n = len(fake.sent_messages)
    await fake.send_message(general["id"], alice, "long")
    rec = await fake.wait_for_sent_message(general["id"], since=n)
    assert rec["json"]["content"] == "error 400 50035"

    await bot.get_channel(int(general["id"])).typing()
    assert fake.typing == [general["id"]]


@pytest.mark.asyncio
async def test_app_command_ephemeral_response(world) -> None:
    fake, bot, w = world
    alice, general = w["alice"], w["general"]

    synced = await bot.tree.sync()
    assert [c.name for c in synced] == ["remember"]
    assert fake.commands[None][0]["name"] == "remember"

    inter = await fake.send_interaction("remember", alice, general["id"], options={"text": "milk"},
                                        command_id=synced[0].id)
    resp = await fake.wait_for_interaction_response(inter)
    assert resp["interaction_id"] == inter["id"]
    assert resp["type"] == 4
    assert resp["data"]["content"] == "noted: milk (True)"
    assert resp["data"]["flags"] & 64 and resp["ephemeral"]
    assert resp["with_response"]
    await fake.wait_for(lambda: fake.followups)
    assert fake.followups[0]["kind"] == "followup"
    assert fake.followups[0]["json"]["content"] == "followup!"
    assert fake.followups[0]["ephemeral"]

    # DM interaction (user instead of member).
    dm = fake.dm_channel(alice)
    inter = await fake.send_interaction("remember", alice, dm["id"], options={"text": "eggs"})
    assert "user" in inter and "member" not in inter
    resp = await fake.wait_for_interaction_response(inter)
    assert resp["data"]["content"] == "noted: eggs (True)" and resp["ephemeral"]


class Ask(discord.ui.View):
    """A question with one button that edits the answer, as /memory forget-all does."""

    @discord.ui.button(label="Yes")
    async def yes(self, interaction: discord.Interaction, button: discord.ui.Button) -> None:
        await interaction.response.edit_message(content="working…", view=None)
        await interaction.edit_original_response(content=f"done by {interaction.user.id}")


@pytest.mark.asyncio
async def test_a_button_of_an_ephemeral_answer_is_pressed_and_edits_it(world) -> None:
    fake, bot, w = world
    alice, general = w["alice"], w["general"]

    @bot.tree.command(name="ask", description="Ask with a button")
    async def ask(interaction: discord.Interaction) -> None:
        await interaction.response.send_message("Sure?", view=Ask(), ephemeral=True)

    synced = await bot.tree.sync()
    inter = await fake.send_interaction("ask", alice, general["id"], command_id=next(c.id for c in synced
                                                                                    if c.name == "ask"))
    question = await fake.wait_for_interaction_response(inter)
    with pytest.raises(KeyError):
        await fake.press_button(alice, question["message"], "No")
    pressed = await fake.press_button(alice, question["message"], "Yes")
    edit = await fake.wait_for(lambda: next((f for f in fake.followups if f["token"] == pressed["token"]), None))
    assert edit["kind"] == "edit_original" and edit["json"]["content"] == f"done by {alice['id']}"
    update = next(r for r in fake.interaction_responses if r["token"] == pressed["token"])
    assert update["type"] == 7 and question["message"]["components"] == []


@pytest.mark.asyncio
async def test_rejected_token_raises_login_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    async with FakeDiscord(rejected_tokens={"bad-token"}) as fake:
        patch_discord_urls(fake, monkeypatch)
        bot = make_bot()
        try:
            with pytest.raises(discord.LoginFailure):
                await asyncio.wait_for(bot.start("bad-token"), timeout=5)
        finally:
            await bot.close()
        assert fake.requests[0]["path"] == "/users/@me" and fake.requests[0]["status"] == 401
        assert fake.identify_payload is None


@pytest.mark.asyncio
async def test_missing_message_content_intent_blanks_content() -> None:
    async with FakeDiscord(heartbeat_interval=200) as fake:
        with discord_urls_patched(fake):
            alice = fake.add_user("alice")
            general = fake.add_guild(members=[alice])["channels"][0]
            bot = commands.Bot(command_prefix="!", intents=discord.Intents.default(), guild_ready_timeout=0.1)
            got: list = []

            async def on_message(message: discord.Message) -> None:
                got.append(message)

            bot.add_listener(on_message)
            task = await _start(fake, bot)
            try:
                await fake.send_message(general["id"], alice, "secret")
                await fake.send_message(general["id"], alice, f"{fake.mention(fake.bot_user)} hi",
                                        mentions=[fake.bot_user])
                mine = await bot.get_channel(int(general["id"])).send("a message of the bot")  # type: ignore[union-attr]
                await fake.send_message(general["id"], alice, "a reply to the bot", reply_to=str(mine.id))
                await fake.send_message(general["id"], alice, "a reply to alice", reply_to=got[0].id)
                await fake.wait_for(lambda: len(got) == 5)
                assert got[0].content == ""
                assert got[1].content.endswith(" hi")
                assert [m.content for m in got[2:]] == ["a message of the bot", "a reply to the bot", ""]
            finally:
                await _shutdown(bot, task)


@pytest.mark.asyncio
async def test_unknown_route_and_raw_zlib_gateway() -> None:
    async with FakeDiscord(heartbeat_interval=1000) as fake:
        async with aiohttp.ClientSession() as s:
            async with s.get(fake.rest_url + "/no/such/thing") as r:
                assert r.status == 404
                assert await r.json() == {"message": "Unknown", "code": 0}
            assert fake.unhandled_requests[0]["path"] == "/no/such/thing"

            async with s.ws_connect(fake.gateway_url + "?v=10&encoding=json&compress=zlib-stream") as ws:
                inflate = zlib.decompressobj()
                frame = await ws.receive_bytes(timeout=2)
                assert frame.endswith(b"\x00\x00\xff\xff")
                hello = json.loads(inflate.decompress(frame))
                assert hello["op"] == 10 and hello["d"]["heartbeat_interval"] == 1000
                await ws.send_json({"op": 1, "d": None})
                ack = json.loads(inflate.decompress(await ws.receive_bytes(timeout=2)))
                assert ack["op"] == 11
                await ws.send_json({"op": 2, "d": {"token": "t", "intents": 513, "properties": {}}})
                ready = json.loads(inflate.decompress(await ws.receive_bytes(timeout=2)))
                assert ready["t"] == "READY" and ready["s"] == 1 and ready["d"]["user"]["bot"] is True
                assert ready["d"]["application"]["id"] == fake.application_id
        assert fake.heartbeat_acks == 1


@pytest.mark.asyncio
async def test_guild_removed_added_back_and_an_outage(world) -> None:
    fake, bot, w = world
    events: list = []
    for name in ("on_guild_remove", "on_guild_join", "on_guild_unavailable"):
        async def record(guild: discord.Guild, name: str = name) -> None:
            events.append((name, guild.id))
        bot.add_listener(record, name)
    await asyncio.wait_for(bot.wait_until_ready(), 5)  # before it, a GUILD_CREATE counts as part of the start
    gid = int(w["guild"]["id"])
    assert await fake.remove_guild(w["guild"], unavailable=True) == 1       # an outage: not a removal
    await fake.wait_for(lambda: events == [("on_guild_unavailable", gid)], timeout=3)
    assert bot.get_guild(gid) is not None and str(gid) in fake.guilds
    assert await fake.remove_guild(w["guild"]) == 1
    await fake.wait_for(lambda: events[-1:] == [("on_guild_remove", gid)], timeout=3)
    assert bot.get_guild(gid) is None and str(gid) not in fake.guilds
    assert await fake.join_guild(w["guild"]) == 1
    await fake.wait_for(lambda: events[-1:] == [("on_guild_join", gid)], timeout=3)
    guild = bot.get_guild(gid)
    assert guild is not None and guild.get_channel(int(w["general"]["id"])) is not None


@pytest.mark.asyncio
async def test_threads_are_in_the_guild_and_a_message_opens_one(world) -> None:
    fake, bot, ids = world
    thread = await fake.open_thread(ids["general"], "plans", owner=ids["alice"])
    await fake.wait_for(lambda: bot.get_channel(int(thread["id"])) is not None)
    cached = bot.get_channel(int(thread["id"]))
    assert isinstance(cached, discord.Thread) and cached.parent_id == int(ids["general"]["id"])
    message = await fake.send_message(thread["id"], ids["alice"], "ping")
    await fake.wait_for_sent_message(thread["id"])
    assert fake.channels[thread["id"]]["guild_id"] == ids["guild"]["id"] and message["guild_id"] == ids["guild"]["id"]

    started = await bot.get_channel(int(ids["general"]["id"])).fetch_message(  # type: ignore[union-attr]
        int((await fake.send_message(ids["general"]["id"], ids["alice"], "a topic"))["id"]))
    opened = await started.create_thread(name="a topic")
    assert opened.id == started.id and opened.parent_id == started.channel.id
    assert fake.created_threads[-1]["name"] == "a topic"
    with pytest.raises(discord.HTTPException):
        await started.create_thread(name="again")  # one thread per message
