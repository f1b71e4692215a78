"""Discord's own controls, used as members would: the unmodified bot (its command tree, its
extractor) against the fake Discord gateway and REST API and the fake Ollama, on SQLite and
PostgreSQL.

- "Remember this" on a message: the scope buttons each member gets, attribution to the message's
  author, the room memory mode, no secrets; "Forget what this taught you": only what the caller
  may change (their own, a moderator's room memories), nothing else and nothing named.
- The autocomplete of `/memory forget` and `/memory why` ids: the caller's own memories only.
- A reply to an older message brings it (and its chain) into the prompt, never another channel's.
"""
from __future__ import annotations

import asyncio
import json

import pytest

from bot.memory.records import PENDING_REASON, NewMemory
from cogs.client import MuninnBot
from cogs.context_menus import FORGET_THIS, REMEMBER_THIS
from tests.fakes.discord_server import FakeDiscord, Perm
from tests.helpers import kind_of, until
from tests.scenarios.test_discord_e2e import stop

pytestmark = pytest.mark.usefixtures("backend")


def ollama_answers(request: dict) -> str:
    kind = kind_of(request)
    if kind == "extract":
        return json.dumps({"facts": []})
    if kind == "update":
        return json.dumps({"same": [], "replaces": []})
    return "Noted."


class Server:
    """The fake Discord with Alice (the server's owner), Bob and Dave (members), Carol (a
    moderator: Manage Messages) and Olive (the bot's owner), and the bot running against it."""

    def __init__(self, fake: FakeDiscord, alice: dict, guild: dict):
        self.fake, self.alice, self.guild = fake, alice, guild
        self.general = guild["channels"][0]
        self.staff = fake.add_channel(guild, "staff")
        self.bob = fake.add_user("bob", global_name="Bob")
        self.carol = fake.add_user("carol", global_name="Carol")
        self.dave = fake.add_user("dave", global_name="Dave")
        self.olive = fake.add_user("olive", global_name="Olive")
        mods = fake.add_role(guild, "Mods", Perm.EVERYONE_DEFAULT | Perm.MANAGE_MESSAGES)
        for member in (self.bob, self.dave, self.olive):
            fake.add_member(guild, member)
        fake.add_member(guild, self.carol, roles=[mods["id"]])
        self.bot: MuninnBot | None = None
        self.commands: dict[str, str] = {}

    @property
    def engine(self):
        assert self.bot is not None and self.bot.engine is not None
        return self.bot.engine

    async def said(self, user: dict, text: str, channel: dict | None = None, **options) -> dict:
        """`user` writes `text` without mentioning Muninn; waits until the history holds it."""
        channel = channel or self.general
        message = await self.fake.send_message(channel["id"], user, text, **options)

        async def recorded() -> bool:
            rows = await self.engine.messages.recent(int(channel["id"]), 50)
            return any(row.id == int(message["id"]) for row in rows)
        await until(recorded, "recorded")
        return message

    async def menu(self, name: str, user: dict, message: dict) -> dict:
        """`user` picks the message menu `name` on `message`: the interaction's first answer."""
        interaction = await self.fake.use_message_menu(name, user, message, command_id=self.commands[name])
        return await self.fake.wait_for_interaction_response(interaction)

    async def final_answer(self, interaction_response: dict) -> str:
        """The text an interaction ends with: its message, or the followup of a deferred one."""
        if interaction_response["type"] == 4:
            return interaction_response["data"]["content"]
        token = interaction_response["token"]
        await self.fake.wait_for(lambda: any(f["token"] == token for f in self.fake.followups))
        return next(f for f in self.fake.followups if f["token"] == token)["json"]["content"]

    async def remember(self, user: dict, message: dict, button: str | None) -> tuple[list[str], str]:
        """"Remember this" on `message` by `user`, pressing `button`: (the buttons offered, the outcome)."""
        first = await self.menu(REMEMBER_THIS, user, message)
        assert first["ephemeral"]
        offered = [c["label"] for row in first["data"].get("components") or [] for c in row["components"]]
        if button is None or not offered:
            return offered, await self.final_answer(first)
        question = first["message"]["content"]
        await self.fake.press_button(user, first["message"], button)
        # The buttons' message is edited in place: "Remembering…", then the outcome.
        await self.fake.wait_for(lambda: first["message"]["content"] not in (question, "Remembering…"))
        assert first["message"]["components"] == []
        return offered, first["message"]["content"]

    async def choices(self, user: dict, command: str, typed: str, channel: dict | None = None) -> list[dict]:
        """What `/memory <command>` offers `user` for its id after typing `typed`."""
        channel = channel or self.general
        interaction = await self.fake.autocomplete(
            "memory", user, channel["id"], command_id=self.commands["memory"],
            options=[{"name": command, "type": 1, "options": [{"name": "id", "type": 4, "value": typed,
                                                              "focused": True}]}])
        response = await self.fake.wait_for_interaction_response(interaction)
        assert response["type"] == 8
        return response["data"]["choices"]

    def last_reply_prompt(self) -> list[dict]:
        return [r for r in self.fake_ollama.chat_requests() if not r.get("format")][-1]["messages"]


@pytest.fixture
async def server(discord_world, fake_ollama, make_settings):
    fake, alice, guild = discord_world
    world = Server(fake, alice, guild)
    world.fake_ollama = fake_ollama  # type: ignore[attr-defined]
    fake_ollama.default_chat_reply = ollama_answers
    settings = make_settings(fake_ollama.url, MUNINN_STREAM_REPLIES="false", MUNINN_HISTORY_LIMIT="2",
                             MUNINN_OWNER_IDS=world.olive["id"])
    world.bot = MuninnBot(settings, guild_ready_timeout=0.1)
    task = asyncio.create_task(world.bot.start("fake-token"))
    try:
        await fake.wait_until_ready()
        world.commands = {c.name: str(c.id) for c in await world.bot.tree.sync()}
        yield world
    finally:
        await stop(world.bot, task)


def memory_id_in(text: str) -> int:
    return int(text.split("memory #", 1)[1].split(" ", 1)[0])


async def test_remember_this_offers_each_member_the_scopes_they_may_use_and_attributes_the_author(server):
    message = await server.said(server.bob, "game night is on Thursdays now")
    offered, answer = await server.remember(server.alice, message, "Only me")
    assert offered == ["Only me", "This channel"]  # no "Everyone": Alice is not the bot's owner
    memory = await server.engine.get(memory_id_in(answer))
    assert answer.startswith("Remembered as memory #") and "only you will see it" in answer
    assert (memory.scope, memory.owner_id, memory.text) == ("personal", int(server.alice["id"]),
                                                           "Bob said: game night is on Thursdays now")
    assert memory.source_message_ids == [message["id"]]
    assert await server.engine.mentioned(memory.id) == {int(server.bob["id"])}

    # Dave (no Manage Messages, moderated server): Bob's claim waits for a moderator.
    offered, answer = await server.remember(server.dave, message, "This channel")
    waiting = await server.engine.get(memory_id_in(answer))
    assert "waits for a moderator" in answer
    assert (waiting.scope, waiting.owner_id, waiting.archive_reason) == ("room", int(server.bob["id"]),
                                                                         PENDING_REASON)
    # Carol, a moderator: Bob's waiting claim, approved by her, logged.
    _, answer = await server.remember(server.carol, message, "This channel")
    approved = await server.engine.get(memory_id_in(answer))
    assert "as what Bob said, approved by you" in answer and approved.archived_at is None
    assert approved.id == waiting.id
    assert approved.owner_id == int(server.bob["id"])
    log = await server.engine.rooms.log(int(server.general["id"]))
    assert (log[0].action, log[0].moderator_id, log[0].memory_id) == ("approve", int(server.carol["id"]), approved.id)
    # Olive, the bot's owner, may also make it global.
    offered, answer = await server.remember(server.olive, message, "Everyone")
    assert offered == ["Only me", "This channel", "Everyone"]
    assert (await server.engine.get(memory_id_in(answer))).scope == "global"


async def test_remember_this_keeps_no_secret_and_no_bot_message(server):
    message = await server.said(server.bob, "the wifi password is hunter2-Quokka")
    _, answer = await server.remember(server.bob, message, "Only me")
    assert "no passwords, tokens or keys" in answer
    reply_to = await server.fake.send_message(server.general["id"], server.bob,
                                              f"{server.fake.mention(server.fake.bot_user)} hi",
                                              mentions=[server.fake.bot_user])
    posted = (await server.fake.wait_for_sent_message(server.general["id"]))["message"]
    assert posted["message_reference"]["message_id"] == reply_to["id"]
    _, answer = await server.remember(server.alice, posted, None)
    assert answer == "Muninn remembers what people write, not the messages of bots."
    assert (await server.engine.stats())["active"] == 0


async def test_forget_what_this_taught_you_forgets_only_what_the_caller_may_change(server):
    message = await server.said(server.bob, "quiz night starts at nine")
    _, kept = await server.remember(server.alice, message, "Only me")
    _, room = await server.remember(server.carol, message, "This channel")
    alices, rooms = memory_id_in(kept), memory_id_in(room)

    answer = await server.final_answer(await server.menu(FORGET_THIS, server.dave, message))
    assert answer == "Muninn learned nothing from that message that is yours to forget."
    answer = await server.final_answer(await server.menu(FORGET_THIS, server.carol, message))
    assert answer.startswith("Forgot 1 memory") and f"#{rooms}" in answer and f"#{alices}" not in answer
    assert [m.id for m in await server.engine.from_message(int(message["id"]))] == [alices]
    log = await server.engine.rooms.log(int(server.general["id"]))
    assert (log[0].action, log[0].memory_id) == ("forget", rooms)
    answer = await server.final_answer(await server.menu(FORGET_THIS, server.alice, message))
    assert f"#{alices}" in answer and await server.engine.from_message(int(message["id"])) == []


async def test_autocomplete_offers_only_the_callers_own_memories(server):
    alice, bob = int(server.alice["id"]), int(server.bob["id"])
    guild, general = int(server.guild["id"]), int(server.general["id"])
    ids = await server.engine.remember_many([
        NewMemory("Alice plays the cello on Sundays", "personal", alice, general, guild),
        NewMemory("Bob plays the cello badly", "personal", bob, general, guild),
        NewMemory("Bob's cello is in the staff room", "room", bob, general, guild),
        NewMemory("the cello club meets on Fridays", "room", alice, general, guild),
    ])
    for command in ("forget", "why"):
        offered = await server.choices(server.alice, command, "CELLO")
        assert offered == [{"name": f"{ids[3]}: the cello club meets on Fridays", "value": ids[3]},
                           {"name": f"{ids[0]}: Alice plays the cello on Sundays", "value": ids[0]}]
    offered = await server.choices(server.bob, "forget", "cello")
    assert {choice["value"] for choice in offered} == {ids[1], ids[2]}
    for user in (server.dave, server.carol, server.olive):  # nobody else's, whatever their rights
        assert await server.choices(user, "forget", "") == []
    assert await server.choices(server.alice, "forget", "violin") == []


async def test_a_reply_to_an_older_message_brings_it_and_its_chain_into_the_prompt(server):
    channel = server.general["id"]
    before_bot = await server.fake.send_message(channel, server.dave, "are we still doing the quiz?", dispatch=False)
    first = await server.said(server.bob, "yes, and the secret word is pelican", reply_to=before_bot)
    for n in range(4):  # pushes Bob's message out of the last two messages of the history
        await server.said(server.carol, f"chatter {n}")
    staff = await server.said(server.carol, "staff only: the prize is a raven plush", channel=server.staff)
    sent = len(server.fake.sent_messages)
    await server.fake.send_message(channel, server.alice, f"{server.fake.mention(server.fake.bot_user)} what word?",
                                   mentions=[server.fake.bot_user], reply_to=first)
    await server.fake.wait_for_sent_message(channel, since=sent)
    prompt = "\n".join(m["content"] for m in server.last_reply_prompt())
    assert "Bob: yes, and the secret word is pelican" in prompt      # from the stored history
    assert "Dave: are we still doing the quiz?" in prompt             # from Discord (REST)
    assert "chatter 3" in prompt and "chatter 1" not in prompt        # the last two as before

    # A reference to another channel's message is never followed.
    sent = len(server.fake.sent_messages)
    elsewhere = {"type": 0, "message_id": staff["id"], "channel_id": server.staff["id"],
                 "guild_id": server.guild["id"]}
    await server.fake.send_message(channel, server.alice, f"{server.fake.mention(server.fake.bot_user)} the prize?",
                                   mentions=[server.fake.bot_user], type=19, message_reference=elsewhere,
                                   referenced_message=staff)
    await server.fake.wait_for_sent_message(channel, since=sent)
    assert "raven plush" not in "\n".join(m["content"] for m in server.last_reply_prompt())


async def test_in_a_dm_remember_this_keeps_it_for_the_caller_at_once(server):
    dm = server.fake.dm_channel(server.bob)
    sent = len(server.fake.sent_messages)
    message = await server.fake.send_message(dm["id"], server.bob, "I prefer tea over coffee")
    await server.fake.wait_for_sent_message(dm["id"], since=sent)  # a DM is answered
    assert server.bot is not None and server.bot.pipeline is not None and await server.bot.pipeline.wait_idle(15)
    offered, answer = await server.remember(server.bob, message, None)
    assert offered == [] and answer.endswith("(personal): only you will see it, in DMs with Muninn.")
    memory = await server.engine.get(memory_id_in(answer))
    assert (memory.owner_id, memory.guild_id, memory.text) == (int(server.bob["id"]), None, "I prefer tea over coffee")
