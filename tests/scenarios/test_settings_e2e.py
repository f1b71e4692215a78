"""A server shapes Muninn from Discord: `/settings` per server, channel and thread, the access
lists, auto-thread on mention, and running without the Message Content intent. The unmodified
bot (its own command tree, its own extractor) against the fake Discord gateway and REST API
(tests/fakes/discord_server.py) and the fake Ollama, on SQLite and PostgreSQL.

The server: Alice owns it; Carol has Manage Channels; Bob and Dave are members (Dave has the
Muted role); Eve is on the operator's block list. #general has the thread "plans"; #random is
another channel. Every member's exchange teaches "<name> likes tea" (the scripted extraction),
so a message that is kept shows as a history row and a memory.
"""
from __future__ import annotations

import asyncio
import json
import logging
import re

import discord
import pytest

from cogs.client import MuninnBot
from tests.fakes.discord_server import FakeDiscord, Perm
from tests.helpers import kind_of, until
from tests.scenarios.test_discord_e2e import stop

pytestmark = pytest.mark.usefixtures("backend")

EVE_ID = 990000000000000001  # on MUNINN_BLOCKED_USERS


def ollama_answers(request: dict) -> str:
    kind = kind_of(request)
    if kind == "extract":
        author = re.search(r"Author: (\w+)\.", request["messages"][-1]["content"])
        name = author.group(1) if author else "Someone"
        return json.dumps({"facts": [{"text": f"{name} likes tea", "about": name, "scope": "personal",
                                      "importance": 0.8}]})
    if kind == "update":
        return json.dumps({"same": [], "replaces": []})
    return "Noted."


class Server:
    """The fake Discord, its people and places, and the bot running against it."""

    def __init__(self, fake: FakeDiscord, alice: dict, guild: dict):
        self.fake, self.alice, self.guild = fake, alice, guild
        self.general = guild["channels"][0]
        self.random = fake.add_channel(guild, "random")
        self.plans = fake.add_thread(self.general, "plans", owner=alice)
        self.bob = fake.add_user("bob", global_name="Bob")
        self.carol = fake.add_user("carol", global_name="Carol")
        self.dave = fake.add_user("dave", global_name="Dave")
        self.eve = fake.add_user("eve", global_name="Eve", id=EVE_ID)
        self.channel_mods = fake.add_role(guild, "Channel mods", Perm.EVERYONE_DEFAULT | (1 << 4))  # Manage Channels
        self.muted = fake.add_role(guild, "Muted", Perm.EVERYONE_DEFAULT)
        fake.add_member(guild, self.bob)
        fake.add_member(guild, self.carol, roles=[self.channel_mods["id"]])
        fake.add_member(guild, self.dave, roles=[self.muted["id"]])
        fake.add_member(guild, self.eve)
        self.bot: MuninnBot | None = None
        self.command: str | None = None
        self.memory_command: str | None = None

    @property
    def engine(self):
        assert self.bot is not None and self.bot.engine is not None
        return self.bot.engine

    async def mention(self, user: dict, channel: dict, text: str, **extra) -> dict:
        """`user` mentions Muninn in `channel`; returns the message."""
        return await self.fake.send_message(channel["id"], user, f"{self.fake.mention(self.fake.bot_user)} {text}",
                                            mentions=[self.fake.bot_user], **extra)

    async def answered(self, user: dict, channel: dict, text: str, *, mention: bool = True, **extra) -> dict:
        """`user` writes in `channel` and Muninn answers there; waits for what extraction makes of it."""
        sent = len(self.fake.sent_messages)
        if mention:
            await self.mention(user, channel, text, **extra)
        else:
            await self.fake.send_message(channel["id"], user, text, **extra)
        reply = await self.fake.wait_for_sent_message(channel["id"], since=sent)
        assert self.bot is not None and self.bot.pipeline is not None and await self.bot.pipeline.wait_idle(15)
        await self.bot.extractor.drain()  # type: ignore[union-attr]
        return reply

    async def unanswered(self, user: dict, channel: dict, text: str, *, mention: bool = True, **extra) -> None:
        """`user` writes in `channel` and Muninn does not answer: a mention of Alice's that follows in
        the same channel is answered, and it waits for the earlier message to be settled first
        (bot/conversation/arrivals.py), so whatever happened to this one has happened."""
        sent = len(self.fake.sent_messages)
        if mention:
            await self.mention(user, channel, text, **extra)
        else:
            await self.fake.send_message(channel["id"], user, text, **extra)
        await self.answered(self.alice, channel, "are you there?")
        replies = [r for r in self.fake.sent_messages[sent:] if r["channel_id"] == channel["id"]]
        assert len(replies) == 1, replies  # Alice's answer alone

    async def settings(self, user: dict, channel: dict, sub: str, /, *, group: str | None = None,
                       resolved: dict | None = None, **options) -> str:
        """`/settings [group] sub` by `user` in `channel`: the text of its ephemeral answer."""
        leaf = [option if isinstance(option, dict) else self.fake._option(name, option)
                for name, option in options.items()]
        tree = [{"name": sub, "type": 1, "options": leaf}]
        if group is not None:
            tree = [{"name": group, "type": 2, "options": tree}]
        interaction = await self.fake.send_interaction("settings", user, channel["id"], command_id=self.command,
                                                       options=tree, resolved=resolved)
        response = await self.fake.wait_for_interaction_response(interaction)
        assert response["type"] == 4 and response["ephemeral"], response
        return response["data"]["content"]

    async def access(self, user: dict, change: str, kind: str, target: dict, what: str) -> str:
        """`/settings access add|remove list:kind user|role|channel:target` by `user` in #general."""
        option_type = {"user": 6, "role": 8, "channel": 7}[what]
        if what == "user":
            resolved = {"users": {target["id"]: target}}
        elif what == "role":
            resolved = {"roles": {target["id"]: target}}
        else:
            resolved = {"channels": {target["id"]: dict(target, permissions=str(Perm.ALL))}}
        return await self.settings(user, self.general, change, group="access", resolved=resolved,
                                   list=kind, **{what: {"name": what, "type": option_type, "value": target["id"]}})

    async def stored(self) -> tuple[dict, dict]:
        """The server's stored settings, and those of #general, #random and the thread."""
        ids = [int(c["id"]) for c in (self.general, self.random, self.plans)]
        found = await self.engine.options.stored(int(self.guild["id"]), ids)
        return found.guild, found.channels

    async def kept_of(self, user: dict) -> tuple[list, list]:
        """What Muninn kept of a person: their history rows, their memories."""
        uid = int(user["id"])
        return await self.engine.messages.of_person(uid), await self.engine.memories_of(uid)

    def prompt(self) -> list[dict]:
        """The messages of the last request for a reply (not extraction's)."""
        return [r for r in self.fake_ollama.chat_requests() if kind_of(r) == "other"][-1]["messages"]


async def start(world: Server, settings) -> asyncio.Task:
    world.bot = MuninnBot(settings, guild_ready_timeout=0.1)
    task = asyncio.create_task(world.bot.start("fake-token"))
    await world.fake.wait_until_ready()
    synced = await world.bot.tree.sync()
    world.command = next(c.id for c in synced if c.name == "settings")
    world.memory_command = next(c.id for c in synced if c.name == "memory")
    return task


@pytest.fixture
def bot_env() -> dict:
    """Extra .env settings of the bot under test."""
    return {}


@pytest.fixture
async def server(discord_world, fake_ollama, make_settings, bot_env):
    fake, alice, guild = discord_world
    world = Server(fake, alice, guild)
    world.fake_ollama = fake_ollama  # type: ignore[attr-defined]
    fake_ollama.default_chat_reply = ollama_answers
    settings = make_settings(fake_ollama.url, MUNINN_STREAM_REPLIES="false", MUNINN_BLOCKED_USERS=str(EVE_ID),
                             MUNINN_RATE_PER_MINUTE="0",  # Alice answers to check every refusal: no fair share
                             **bot_env)
    task = await start(world, settings)
    try:
        yield world
    finally:
        await stop(world.bot, task)  # type: ignore[arg-type]


# -- settings: each one's inheritance, each permission gate -----------------------------------

SERVER_CHANNEL_THREAD = {
    "persona": ("Speak like a pirate.", "Be brief in this channel.", "Plan carefully."),
    "answer": ("never", "every", "mentions"),
    "history": ("3", "4", "5"),
    "learning": ("off", "on", "off"),
    "language": ("German", "French", "Norwegian"),
    "auto_thread": ("on", "off", None),   # no thread setting
    "room_memory": ("open", None, None),  # the server's alone
}
DEFAULTS = {"persona": "(none)", "answer": "**mentions**", "history": "**10**", "learning": "**on**",
            "language": "(none)", "auto_thread": "**off**", "room_memory": "**moderated**"}


def shown(key: str, value: str) -> str:
    return f"“{value}”" if key in ("persona", "language") else f"**{value}**"


async def test_each_setting_set_from_discord_is_inherited_thread_channel_server_env(server):
    def line(text: str, key: str) -> str:
        return next(row for row in text.splitlines() if row.startswith(f"- `{key}`:"))

    async def in_thread(key: str) -> str:
        return line(await server.settings(server.carol, server.plans, "show"), key)

    for key, (on_server, on_channel, on_thread) in SERVER_CHANNEL_THREAD.items():
        assert await in_thread(key) == f"- `{key}`: {DEFAULTS[key]}, the operator's default"
        said = await server.settings(server.alice, server.general, "set", setting=key, value=on_server, where="server")
        assert said.startswith(f"`{key}` is now {shown(key, on_server)} for the server"), said
        assert await in_thread(key) == f"- `{key}`: {shown(key, on_server)}, set for the server"
        if on_channel is None:
            said = await server.settings(server.alice, server.general, "set", setting=key, value=on_server)
            assert said == f"`{key}` is set for server, not for a channel."
        else:
            await server.settings(server.carol, server.general, "set", setting=key, value=on_channel)
            assert await in_thread(key) == f"- `{key}`: {shown(key, on_channel)}, set for this channel"
            if on_thread is None:
                said = await server.settings(server.carol, server.plans, "set", setting=key, value=on_channel)
                assert said == f"`{key}` is set for server or channel, not for a thread."
            else:
                await server.settings(server.carol, server.plans, "set", setting=key, value=on_thread)
                assert await in_thread(key) == f"- `{key}`: {shown(key, on_thread)}, set for this thread"
                said = await server.settings(server.carol, server.plans, "reset", setting=key)
                assert said == f"`{key}` was reset; here it is {shown(key, on_channel)}, set for this channel."
            # #random inherits the server, never #general
            assert line(await server.settings(server.carol, server.random, "show"), key) == (
                f"- `{key}`: {shown(key, on_server)}, set for the server")
            await server.settings(server.carol, server.general, "reset", setting=key)
        assert await in_thread(key) == f"- `{key}`: {shown(key, on_server)}, set for the server"
        await server.settings(server.alice, server.general, "reset", setting=key, where="server")
        assert await in_thread(key) == f"- `{key}`: {DEFAULTS[key]}, the operator's default"
    assert await server.engine.rooms.mode(int(server.guild["id"])) == "moderated"  # reset: back to the default
    guild, channels = await server.stored()
    assert guild == {} and all(not found for found in channels.values())


async def test_a_member_without_the_permission_changes_nothing(server):
    await server.settings(server.carol, server.general, "set", setting="history", value="2")
    before = await server.stored()
    for user in (server.bob, server.dave):
        for sub, options in (("set", dict(setting="persona", value="Obey Bob.")), ("reset", dict(setting="history"))):
            said = await server.settings(user, server.general, sub, **options)
            assert said == "Changing this channel's settings needs the Manage Channels permission here."
            said = await server.settings(user, server.plans, sub, **options)
            assert said == "Changing this channel's settings needs the Manage Channels permission here."
    for user in (server.bob, server.carol):  # a channel manager does not change the server
        said = await server.settings(user, server.general, "set", setting="answer", value="every", where="server")
        assert said == "Changing this server's settings needs the Manage Server permission."
        said = await server.access(user, "add", "block", server.dave, "user")
        assert said == "Changing this server's settings needs the Manage Server permission."
    said = await server.settings(server.carol, server.general, "set", setting="history", value="ten")
    assert said == ("`history` (recent messages of the channel put into the prompt): 'ten' is not a whole number "
                    "of messages from 0 to 100.")
    assert await server.stored() == before
    # the access lists are shown to those who may change them only
    assert "Access lists" not in await server.settings(server.carol, server.general, "show")
    assert "Access lists" in await server.settings(server.alice, server.general, "show")
    dm = server.fake.dm_channel(server.alice)
    assert await server.settings(server.alice, dm, "show") == (
        "Settings belong to a server: in DMs the operator's .env applies.")


async def test_the_settings_shape_the_answer_and_what_is_learned(server):
    await server.settings(server.alice, server.general, "set", setting="persona", value="Speak like a pirate.",
                          where="server")
    await server.settings(server.carol, server.general, "set", setting="language", value="Norwegian")
    await server.settings(server.carol, server.general, "set", setting="history", value="1")
    for n in range(3):
        await server.fake.send_message(server.general["id"], server.bob, f"plain message {n}")
    await server.answered(server.bob, server.general, "what did I say?")
    system, *said = server.prompt()
    assert "Speak like a pirate.\nUnless a message plainly asks for another language, answer in Norwegian." \
        in system["content"]
    assert len(said) == 2 and said[0]["content"].endswith("Bob: plain message 2")  # history 1, then the message
    assert [m.text for m in (await server.kept_of(server.bob))[1]] == ["Bob likes tea"]

    # #random: its own history length, the server's persona, no language; learning off there
    await server.settings(server.carol, server.random, "set", setting="learning", value="off")
    await server.answered(server.dave, server.random, "hello")  # Dave is not blocked here (no lists yet)
    assert "Speak like a pirate." in server.prompt()[0]["content"] and "Norwegian" not in server.prompt()[0]["content"]
    rows, memories = await server.kept_of(server.dave)
    assert [row.role for row in rows] == ["user", "assistant"] and memories == []  # history kept, nothing learned

    # answer modes: every message in #random, never in #general (not even a mention)
    await server.settings(server.carol, server.random, "set", setting="answer", value="every")
    await server.answered(server.bob, server.random, "no mention needed", mention=False)
    await server.settings(server.carol, server.general, "set", setting="answer", value="never")
    sent = len(server.fake.sent_messages)
    message = await server.mention(server.bob, server.general, "hello?")
    async def recorded() -> bool:
        return any(r.id == int(message["id"]) for r in await server.engine.messages.recent(
            int(server.general["id"]), 10))
    await until(recorded, "the unanswered mention kept as history")
    assert not [r for r in server.fake.sent_messages[sent:] if r["channel_id"] == server.general["id"]]


# -- access --------------------------------------------------------------------------------------

async def test_blocked_users_roles_and_channels_leave_no_row(server):
    assert await server.access(server.alice, "add", "block", server.bob, "user") == (
        f"<@{server.bob['id']}> added to this server's block list.")
    await server.access(server.alice, "add", "block", server.muted, "role")
    await server.access(server.alice, "add", "block", server.random, "channel")

    await server.unanswered(server.bob, server.general, "I live in Oslo")
    await server.unanswered(server.bob, server.general, "nobody asked", mention=False)
    await server.unanswered(server.dave, server.general, "I live in Bergen")       # the Muted role
    await server.unanswered(server.dave, server.plans, "in the thread")            # a thread of #general too
    await server.unanswered(server.eve, server.general, "I live in Tromsø")        # the operator's list
    await server.unanswered(server.bob, server.general, "a webhook says hi", webhook_id=server.fake.snowflake())
    sent = len(server.fake.sent_messages)
    await server.mention(server.alice, server.random, "the blocked channel")
    await server.fake.send_message(server.random["id"], server.alice, "nothing kept here")
    await server.answered(server.alice, server.general, "and here?")  # answered: the lists let her in
    # nor does /memory remember keep anything of theirs (forget and export stay theirs to use)
    interaction = await server.fake.send_interaction(
        "memory", server.bob, server.general["id"], command_id=server.memory_command,
        options=[{"name": "remember", "type": 1, "options": [{"name": "text", "type": 3, "value": "Bob has a cat"}]}])
    response = await server.fake.wait_for_interaction_response(interaction)
    assert response["ephemeral"] and response["data"]["content"] == (
        "Muninn keeps nothing you tell it here (this server's access lists or the operator's).")
    for person in (server.bob, server.dave, server.eve):
        assert await server.kept_of(person) == ([], [])
    assert await server.engine.messages.recent(int(server.random["id"]), 10) == []
    assert not [r for r in server.fake.sent_messages[sent:] if r["channel_id"] == server.random["id"]]
    assert [m.text for m in (await server.kept_of(server.alice))[1]] == ["Alice likes tea"]

    # Taken off the list, Bob is answered again; an allow list then keeps out everyone not on it.
    await server.access(server.alice, "remove", "block", server.bob, "user")
    await server.answered(server.bob, server.general, "back again")
    await server.access(server.alice, "add", "allow", server.channel_mods, "role")
    await server.answered(server.carol, server.general, "a channel mod")
    await server.access(server.alice, "add", "allow", server.alice, "user")
    sent = len(server.fake.sent_messages)
    await server.mention(server.bob, server.general, "am I allowed?")
    await server.answered(server.alice, server.general, "and me?")
    assert len([r for r in server.fake.sent_messages[sent:] if r["channel_id"] == server.general["id"]]) == 1
    show = await server.settings(server.alice, server.general, "show")
    assert (f"- allow: users <@{server.alice['id']}>; roles <@&{server.channel_mods['id']}>; channels (none)"
            in show.splitlines())
    assert (f"- block: users (none); roles <@&{server.muted['id']}>; channels <#{server.random['id']}>"
            in show.splitlines())


@pytest.mark.parametrize("bot_env", [{"MUNINN_ALLOW_DMS": "false"}])
async def test_dms_off_answers_and_keeps_no_dm(server):
    dm = server.fake.dm_channel(server.bob)
    await server.fake.send_message(dm["id"], server.bob, "hello in private")
    await server.answered(server.bob, server.general, "and in public?")
    assert not [r for r in server.fake.sent_messages if r["channel_id"] == dm["id"]]
    rows, _ = await server.kept_of(server.bob)
    assert [row.channel_id for row in rows] == [int(server.general["id"])] * 2  # his message and the reply


# -- auto-thread -------------------------------------------------------------------------------

async def test_auto_thread_opens_a_thread_where_muninn_answers_every_message(server):
    assert (await server.settings(server.carol, server.general, "set", setting="auto_thread", value="on")
            ).startswith("`auto_thread` is now **on** for this channel")
    sent = len(server.fake.sent_messages)
    message = await server.mention(server.alice, server.general, "plan the trip to Oslo")
    thread = await server.fake.wait_for(lambda: next(iter(server.fake.created_threads), None), 15)
    assert thread["id"] == message["id"] and thread["name"] == "plan the trip to Oslo"
    await server.fake.wait_for_sent_message(thread["id"], since=sent)
    assert not [r for r in server.fake.sent_messages[sent:] if r["channel_id"] == server.general["id"]]

    await server.answered(server.alice, thread, "and Bergen after?", mention=False)
    assert "plan the trip to Oslo" in json.dumps(server.prompt())  # the thread's history holds the start
    show = await server.settings(server.alice, thread, "show")
    assert "- `answer`: **every**, set for this thread" in show.splitlines()
    # the channel itself still answers mentions only
    await server.settings(server.carol, server.general, "set", setting="auto_thread", value="off")
    await server.unanswered(server.bob, server.general, "no thread for this", mention=False)


# -- without the Message Content intent ------------------------------------------------------

@pytest.mark.parametrize("how", ["not granted", "MUNINN_MESSAGE_CONTENT=off"])
async def test_without_the_message_content_intent_muninn_answers_dms_mentions_and_replies(
        discord_world, fake_ollama, make_settings, caplog, how):
    fake, alice, guild = discord_world
    world = Server(fake, alice, guild)
    world.fake_ollama = fake_ollama  # type: ignore[attr-defined]
    fake_ollama.default_chat_reply = ollama_answers
    if how == "not granted":
        fake.application_flags = 0  # the Developer Portal's switch is off
        fake.allowed_intents = discord.Intents.default().value  # asking for Message Content is refused
        env = {}
    else:
        env = {"MUNINN_MESSAGE_CONTENT": "off"}
    caplog.set_level(logging.INFO, logger="cogs.intents")
    task = await start(world, make_settings(fake_ollama.url, MUNINN_STREAM_REPLIES="false", **env))
    try:
        assert not fake.identify_payload["intents"] & discord.Intents(message_content=True).value
        [mode] = [r.getMessage() for r in caplog.records if r.name == "cogs.intents"]
        assert mode.startswith("Message Content intent: off (") and "answers DMs, mentions and replies" in mode
        assert ("not granted in the Developer Portal" if how == "not granted" else how) in mode

        await fake.send_message(world.general["id"], world.bob, "passing by")  # arrives without its words
        reply = await world.answered(world.alice, world.general, "what is new?")
        assert "passing by" not in json.dumps(world.prompt())
        rows, _ = await world.kept_of(world.bob)
        assert rows == []  # no passive history
        await world.answered(world.alice, world.general, "and a reply without a mention", mention=False,
                             reply_to=reply["message"])
        dm = fake.dm_channel(world.bob)
        await world.answered(world.bob, dm, "hello in private", mention=False)

        said = await world.settings(world.carol, world.general, "set", setting="answer", value="every")
        assert "without the Message Content intent" in said
        show = (await world.settings(world.carol, world.general, "show")).splitlines()
        assert "- `answer`: **every** (answers mentions only: no Message Content intent), set for this channel" in show
        assert any(row.startswith("- Message Content intent: off") and "no passive history" in row for row in show)
        await world.unanswered(world.bob, world.general, "every message?", mention=False)
    finally:
        await stop(world.bot, task)  # type: ignore[arg-type]


async def test_with_the_intent_granted_the_mode_is_logged_as_on(discord_world, fake_ollama, make_settings, caplog):
    fake, alice, guild = discord_world
    world = Server(fake, alice, guild)
    caplog.set_level(logging.INFO, logger="cogs.intents")
    task = await start(world, make_settings(fake_ollama.url, MUNINN_STREAM_REPLIES="false"))
    try:
        assert fake.identify_payload["intents"] & discord.Intents(message_content=True).value
        [mode] = [r.getMessage() for r in caplog.records if r.name == "cogs.intents"]
        assert mode.startswith("Message Content intent: on (granted in the Developer Portal)")
        assert world.bot is not None and world.bot.reads_everything
    finally:
        await stop(world.bot, task)  # type: ignore[arg-type]


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)  # the failure is made up; the adapter is under test
async def test_when_the_settings_cannot_be_read_nothing_is_answered_or_kept(server, monkeypatch, caplog):
    from bot.memory.options import Options
    working = Options.stored

    async def broken(self, guild_id, channel_ids):
        raise RuntimeError("database is locked")
    monkeypatch.setattr(Options, "stored", broken)
    for n in range(3):
        await server.mention(server.bob, server.general, f"hello {n}")
    await until(lambda: sum("could not read the settings" in r.getMessage() for r in caplog.records) == 1,
                "one log line")
    monkeypatch.setattr(Options, "stored", working)  # the database answers again
    await server.answered(server.alice, server.general, "and now?")
    rows, _ = await server.kept_of(server.bob)
    assert rows == [] and len([r for r in caplog.records if "could not read the settings" in r.getMessage()]) == 1


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)  # Discord's refusal comes before the database matters
async def test_on_requires_the_intent_and_a_refusal_says_how_to_run_without_it(discord_world, make_settings):
    from cogs.adapter import StartupError, run_bot
    fake, _, _ = discord_world
    fake.application_flags = 0
    fake.allowed_intents = discord.Intents.default().value
    with pytest.raises(StartupError) as refused:
        await run_bot(make_settings("", MUNINN_MESSAGE_CONTENT="on"))
    assert "Message Content Intent" in str(refused.value) and "MUNINN_MESSAGE_CONTENT=auto" in str(refused.value)
    assert fake.identify_payload["intents"] & discord.Intents(message_content=True).value
