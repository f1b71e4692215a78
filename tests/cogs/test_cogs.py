"""The cogs through discord.py's real parsers and command tree, in simcord's in-memory Discord.

Muninn runs unmodified (MuninnBot, its setup_hook and extensions) on each storage backend
(a real SQLite file, and PostgreSQL: conftest's `backend`), talking to the fake Ollama on
127.0.0.1. Extraction is off here (tests/scenarios/test_story.py and
tests/scenarios/test_discord_e2e.py cover it); memories are stored through the engine directly.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

import discord
import pytest
import simcord
from discord import app_commands

from bot.conversation.thinking import CANNOT_THINK
from bot.memory.records import NewMemory
from bot.memory.sql import history, store
from bot.memory.storage import storage_of
from cogs.client import SOMETHING_WENT_WRONG, MuninnBot, Refusal
from tests.fakes.ollama import FakeOllama

pytestmark = pytest.mark.usefixtures("backend")


@dataclass
class World:
    env: simcord.Env
    bot: MuninnBot
    ollama: FakeOllama
    guild: simcord.GuildHandle
    general: simcord.ChannelHandle
    random: simcord.ChannelHandle
    alice: simcord.MemberActor
    bob: simcord.MemberActor
    mod: simcord.MemberActor
    owner: simcord.MemberActor
    commands: dict
    failures_expected: bool = False

    @property
    def engine(self):
        return self.bot.engine

    def bot_messages(self, channel: simcord.ChannelHandle) -> list[discord.Message]:
        return [m for m in channel.history() if m.author.id == self.bot.user.id]

    def posts(self, channel_id: int) -> list:
        return [r for r in self.env.http_requests
                if r.method == "POST" and r.path == f"/channels/{channel_id}/messages"]


@pytest.fixture
async def simcord_bot(fake_ollama, make_settings):
    # simcord reports no application flags: the Message Content intent is granted by setting
    bot = MuninnBot(make_settings(fake_ollama.url, MUNINN_EXTRACTION="false", MUNINN_TIMEZONE="Europe/Oslo",
                                  MUNINN_MESSAGE_CONTENT="on"))
    yield bot
    await bot.close()  # after simcord_env's teardown: closes the engine


@pytest.fixture
async def world(simcord_env, simcord_bot, fake_ollama):
    env = simcord_env
    guild = env.create_guild("Asgard")
    general = guild.create_text_channel("general")
    random = guild.create_text_channel("random")
    mods = guild.create_role("Mods", permissions=discord.Permissions(manage_messages=True, manage_channels=True))
    alice = guild.add_member(env.create_user("alice", global_name="Alice"))
    bob = guild.add_member(env.create_user("bob", global_name="Bob"))
    mod = guild.add_member(env.create_user("mod", global_name="Mod"), roles=[mods])
    owner = guild.add_member(env.create_user("owner", global_name="Owner"))
    simcord_bot.owner_ids = {owner.id}  # what MUNINN_OWNER_IDS would say
    synced = await simcord_bot.tree.sync()
    fake_ollama.default_chat_reply = "Hello from Muninn."
    world = World(env, simcord_bot, fake_ollama, guild, general, random, alice, bob, mod, owner,
                  {command.name: command for command in synced})
    yield world
    # simcord hands back every error the tree saw, answered or not: refusals are answers, anything
    # else is a bug (unless the test provoked it on purpose).
    unexpected = [e for e in env.errors if not isinstance(e, (Refusal, app_commands.CheckFailure))]
    assert world.failures_expected or not unexpected, unexpected


def last_prompt(world: World) -> list[dict]:
    return world.ollama.chat_requests()[-1]["messages"]


# -- conversation ------------------------------------------------------------------

async def test_every_dm_is_answered_as_a_reply_with_the_message_in_the_prompt(world):
    sent = await world.alice.user.send_dm("hello raven")
    [answer] = world.bot_messages(world.alice.user.dm_channel)
    assert answer.content == "Hello from Muninn."
    assert answer.reference is not None and answer.reference.message_id == sent.id
    prompt = last_prompt(world)
    assert "private direct message with Alice" in prompt[0]["content"]
    assert prompt[-1]["content"].endswith(") Alice: hello raven") and prompt[-1]["content"].startswith("(")
    assert re.match(r"\(\w+, \w+ \d+, \d{4} at ", prompt[-1]["content"])  # today's date, with its year
    typing = [r for r in world.env.http_requests if r.path.endswith("/typing")]
    assert typing, "Muninn shows typing while it thinks"


async def test_in_a_server_muninn_stays_quiet_unless_mentioned_or_replied_to(world):
    await world.alice.send(world.general, "just chatting about boats")
    assert world.bot_messages(world.general) == [] and world.ollama.chat_requests() == []
    rows = await world.engine.write(history.recent, world.general.id, 10)
    assert [r.content for r in rows] == ["just chatting about boats"]  # recorded all the same

    await world.alice.send(world.general, f"{world.bot.user.mention} what were we talking about?")
    [answer] = world.bot_messages(world.general)
    prompt = last_prompt(world)
    assert "#general of the Discord server Asgard" in prompt[0]["content"]
    assert [m["content"].split(") ", 1)[1] for m in prompt[1:]] == [
        "Alice: just chatting about boats", f"Alice: @{world.bot.user.display_name} what were we talking about?"]

    await world.bob.send(world.general, "boats are great", reply_to=answer)  # a reply to Muninn, no mention
    assert len(world.bot_messages(world.general)) == 2
    assert last_prompt(world)[-1]["content"].endswith("Bob: boats are great")

    alices = [m for m in world.general.history() if m.author.id == world.alice.id]
    await world.bob.send(world.general, "I agree", reply_to=alices[0])  # a reply to someone else
    assert len(world.bot_messages(world.general)) == 2


async def test_muninn_never_answers_bots(world):
    other = world.guild.add_member(world.env.create_user("otherbot", bot=True))
    await other.send(world.general, f"{world.bot.user.mention} hello fellow bot")
    await other.send_dm("psst")
    assert world.bot_messages(world.general) == [] and world.ollama.chat_requests() == []


async def test_channel_managers_set_a_channel_to_answer_every_message(world):
    assert "settings set" not in world.alice.available_commands(world.general)  # hidden from non-managers
    world.guild.set_command_permissions(world.commands["settings"], {world.alice: True})
    refused = await world.alice.slash(world.general, "settings set", setting="answer", value="every")
    assert refused.ephemeral and "Manage Channels" in refused.response.content  # shown, still refused

    result = await world.mod.slash(world.general, "settings set", setting="answer", value="every")
    assert result.ephemeral and "`answer` is now **every** for this channel" in result.response.content
    await world.alice.send(world.general, "no mention needed now")
    assert len(world.bot_messages(world.general)) == 1
    await world.alice.send(world.random, "but not here")
    assert world.bot_messages(world.random) == []

    await world.mod.slash(world.general, "settings reset", setting="answer")
    await world.alice.send(world.general, "quiet again")
    assert len(world.bot_messages(world.general)) == 1


async def test_long_answers_are_split_and_nothing_the_llm_wrote_can_ping(world):
    paragraph = "Ravens are clever. " * 60  # ~1,140 characters
    world.ollama.chat_replies.append(f"@everyone <@{world.bob.id}> listen.\n\n" + "\n\n".join([paragraph] * 4))
    await world.alice.send(world.general, f"{world.bot.user.mention} tell me everything")
    answers = world.bot_messages(world.general)
    assert len(answers) == 4 and all(len(m.content) <= 2000 for m in answers)  # no two paragraphs fit in one
    assert answers[0].content.startswith("@everyone") and all(m.content.endswith("clever.") for m in answers)
    posts = world.posts(world.general.id)
    assert len(posts) == 4
    for post in posts:
        assert post.json["allowed_mentions"] == {"parse": []}  # no @everyone, users, roles, or reply ping
    assert "message_reference" in posts[0].json and "message_reference" not in posts[1].json
    assert world.alice.id not in [user.id for user in answers[0].mentions]  # the reply does not ping her


async def test_edits_and_deletions_reach_the_history(world):
    kept = await world.alice.send(world.general, "I live in Bergen")
    gone = await world.alice.send(world.general, "my password is hunter2")
    await world.alice.edit(kept, "I live in Oslo")
    await world.alice.delete(gone)
    rows = await world.engine.write(history.recent, world.general.id, 10)
    assert [r.content for r in rows] == ["I live in Oslo"]
    assert (await world.engine.write(history.get, gone.id)).content == ""


async def test_ollama_down_gets_a_friendly_answer_and_nothing_breaks(world):
    await world.ollama.go_down()
    await world.alice.user.send_dm("are you awake?")
    [answer] = world.bot_messages(world.alice.user.dm_channel)
    assert answer.content == CANNOT_THINK
    rows = await world.engine.write(history.recent, world.alice.user.dm_channel.id, 10)
    assert [r.content for r in rows] == ["are you awake?"]
    assert world.env.errors == []


async def test_without_permission_to_post_muninn_logs_and_carries_on(world, caplog):
    world.env.inject_error("POST", f"/channels/{world.general.id}/messages", status=403, code=50013,
                           message="Missing Permissions")
    await world.alice.send(world.general, f"{world.bot.user.mention} can you hear me?")
    assert world.bot_messages(world.general) == []
    assert "lacks the Send Messages permission" in caplog.text
    rows = await world.engine.write(history.recent, world.general.id, 10)
    assert [r.role for r in rows] == ["user"]
    await world.alice.send(world.general, f"{world.bot.user.mention} and now?")  # the fault was one-off
    assert len(world.bot_messages(world.general)) == 1


# -- /memory ---------------------------------------------------------------------------

async def seed(world: World) -> dict[str, int]:
    g, general, random = world.guild.id, world.general.id, world.random.id
    items = {
        "alice_here": NewMemory("Alice keeps bees", "personal", owner_id=world.alice.id, guild_id=g, channel_id=general),
        "alice_dm": NewMemory("Alice is afraid of heights", "personal", owner_id=world.alice.id, guild_id=None,
                              channel_id=world.alice.user.dm_channel.id),
        "bob_here": NewMemory("Bob collects stamps", "personal", owner_id=world.bob.id, guild_id=g, channel_id=general),
        "room_general": NewMemory("the general channel plans a trip to Bergen", "room", owner_id=world.bob.id,
                                  guild_id=g, channel_id=general),
        "room_random": NewMemory("the random channel hates Mondays", "room", owner_id=world.bob.id, guild_id=g,
                                 channel_id=random),
        "global": NewMemory("Muninn is a raven of Odin", "global", owner_id=world.owner.id),
    }
    return {key: await world.engine.remember(memory) for key, memory in items.items()}


def text_of(result) -> str:
    return result.response.content


async def test_list_shows_only_what_the_caller_may_see_here_and_privately(world):
    ids = await seed(world)
    result = await world.alice.slash(world.general, "memory list")
    assert result.ephemeral
    text = text_of(result)
    for key in ("alice_here", "room_general", "global"):
        assert f"`#{ids[key]}`" in text
    for key in ("alice_dm", "bob_here", "room_random"):  # DM-learned, someone else's, another room
        assert f"`#{ids[key]}`" not in text

    result = await world.alice.user.slash("memory list")  # in a DM: all of her own, no rooms
    text = text_of(result)
    assert result.ephemeral
    assert all(f"`#{ids[k]}`" in text for k in ("alice_here", "alice_dm", "global"))
    assert all(f"`#{ids[k]}`" not in text for k in ("bob_here", "room_general", "room_random"))

    result = await world.alice.slash(world.general, "memory list", scope="room")
    assert f"`#{ids['room_general']}`" in text_of(result) and f"`#{ids['global']}`" not in text_of(result)


async def test_list_is_paginated_with_buttons(world):
    for n in range(20):
        await world.engine.remember(NewMemory(f"Alice fact number {n:02}", "personal", owner_id=world.alice.id,
                                              guild_id=world.guild.id, channel_id=world.general.id))
    result = await world.alice.slash(world.general, "memory list")
    assert "page 1 of 3" in text_of(result) and "fact number 19" in text_of(result)
    clicked = await world.alice.click(result.response, label="Next ▶")
    page = world.env.backend.get_message(result.response.channel_id, result.response.id).content
    assert "page 2 of 3" in page and "fact number 11" in page and "fact number 19" not in page
    assert clicked.acknowledged


async def test_search_explains_without_touching(world):
    ids = await seed(world)
    before = await world.engine.write(store.get, ids["alice_here"])
    result = await world.alice.slash(world.general, "memory search", query="who keeps bees?")
    assert result.ephemeral
    text = text_of(result)
    assert f"`#{ids['alice_here']}`" in text and "keyword rank 1" in text and "Nothing was touched" in text
    assert f"`#{ids['bob_here']}`" not in text
    after = await world.engine.write(store.get, ids["alice_here"])
    assert (after.access_count, after.last_accessed) == (before.access_count, before.last_accessed)


async def test_forget_follows_the_permission_rules_and_reveals_nothing_about_other_ids(world):
    ids = await seed(world)
    other_guild = world.env.create_guild("Midgard")
    elsewhere = other_guild.create_text_channel("elsewhere")
    ids["room_elsewhere"] = await world.engine.remember(NewMemory(
        "Midgard's channel is secret", "room", owner_id=world.bob.id, guild_id=other_guild.id, channel_id=elsewhere.id))

    async def forget(actor, key_or_id, channel=None):
        memory_id = ids[key_or_id] if isinstance(key_or_id, str) else key_or_id
        result = await (actor.slash(channel, "memory forget", id=memory_id) if channel is not False
                        else actor.user.slash("memory forget", id=memory_id))  # False: in a DM
        assert result.ephemeral
        return text_of(result)

    def generic(memory_id):
        return f"No memory #{memory_id} that you can change here."

    # Unknown, invisible or not hers: one answer, whether or not the id exists.
    assert await forget(world.alice, 999999, world.general) == generic(999999)
    assert await forget(world.alice, "bob_here", world.general) == generic(ids["bob_here"])
    assert await forget(world.alice, "room_random", world.general) == generic(ids["room_random"])
    assert await forget(world.alice, "room_general", False) == generic(ids["room_general"])
    assert await forget(world.mod, "room_elsewhere", world.general) == generic(ids["room_elsewhere"])
    assert await forget(world.mod, "alice_dm", world.general) == generic(ids["alice_dm"])
    # Visible here but not hers to change: the answer names the permission.
    assert "Manage Messages" in await forget(world.alice, "room_general", world.general)
    assert "Only the bot's owner" in await forget(world.mod, "global", world.general)
    assert "Only the bot's owner" in await forget(world.alice, "global", False)
    remaining = {m.id for m in (await world.engine.write(store.get_many, list(ids.values()))).values()}
    assert remaining == set(ids.values())

    assert "Forgot memory" in await forget(world.alice, "alice_here", world.general)
    assert "Forgot memory" in await forget(world.alice, "alice_dm", world.general)  # her own, learned elsewhere
    assert "Forgot memory" in await forget(world.mod, "room_random", world.general)  # mod in that channel
    assert "Forgot memory" in await forget(world.owner, "global", world.general)
    assert "Forgot memory" in await forget(world.bob, "room_elsewhere", False)  # he taught it: his to forget
    remaining = set((await world.engine.write(store.get_many, list(ids.values()))).keys())
    assert remaining == {ids["bob_here"], ids["room_general"]}
    assert "Forgot memory" in await forget(world.bob, "room_general", world.random)  # taught, from anywhere


async def test_remember_stores_by_hand_with_the_same_rules(world):
    result = await world.alice.slash(world.general, "memory remember", text="Alice's birthday is in May")
    assert result.ephemeral and "Remembered as memory #" in text_of(result)
    [memory] = await world.engine.write(store.memories_of, world.alice.id, ("personal",))
    assert (memory.scope, memory.guild_id, memory.text) == ("personal", world.guild.id, "Alice's birthday is in May")

    assert "Manage Messages" in text_of(await world.alice.slash(world.general, "memory remember",
                                                                text="the room is noisy", scope="room"))
    assert "Only the bot's owner" in text_of(await world.mod.slash(world.general, "memory remember",
                                                                   text="everyone is welcome", scope="global"))
    assert "room memory belongs to a server channel" in text_of(
        await world.alice.user.slash("memory remember", text="my DM room", scope="room"))
    ok = await world.mod.slash(world.general, "memory remember", text="the room is noisy", scope="room")
    assert "everyone in this channel" in text_of(ok)
    ok = await world.owner.slash(world.general, "memory remember", text="everyone is welcome", scope="global")
    assert "everywhere" in text_of(ok)
    dm = await world.alice.user.slash("memory remember", text="Alice prefers tea")
    assert dm.ephemeral
    stats = await world.engine.stats()
    assert stats["by_scope"] == {"personal": 2, "room": 1, "global": 1}


async def test_export_sends_the_callers_personal_and_taught_memories_as_a_private_file(world):
    ids = await seed(world)
    result = await world.alice.slash(world.general, "memory export")
    assert result.ephemeral
    [attachment] = result.response.attachments
    assert attachment.filename == f"muninn-memories-{world.alice.id}.json"
    data = json.loads(await attachment.read())
    assert data["user_id"] == str(world.alice.id)
    assert sorted(m["id"] for m in data["memories"]) == sorted([ids["alice_here"], ids["alice_dm"]])

    result = await world.bob.slash(world.general, "memory export")  # Bob taught both room memories
    assert "1 personal memories, the 2 room memories you taught and 0 memories of other" in text_of(result)
    data = json.loads(await result.response.attachments[0].read())
    assert {(m["id"], m["scope"]) for m in data["memories"]} == {
        (ids["bob_here"], "personal"), (ids["room_general"], "room"), (ids["room_random"], "room")}


async def test_a_memory_naming_someone_is_theirs_to_export_and_erase_never_to_recall(world):
    """Bob's own fact that names Alice stays Bob's (Alice never sees it here), but Alice finds it
    in her export and /memory why, and may forget it; nobody else may."""
    g, general = world.guild.id, world.general.id
    lent = await world.engine.remember(NewMemory("Bob lent Alice 50 euros", "personal", owner_id=world.bob.id,
                                                 guild_id=g, channel_id=general, mentions=[world.alice.id],
                                                 happens_on="2026-03-05"))
    other = await world.engine.remember(NewMemory("Bob lent Alice his bike", "personal", owner_id=world.bob.id,
                                                  guild_id=g, channel_id=general, mentions=[world.alice.id]))
    assert "50 euros" not in text_of(await world.alice.slash(world.general, "memory list"))
    assert "50 euros" not in text_of(await world.alice.slash(world.general, "memory search", query="Bob lent"))

    result = await world.alice.slash(world.general, "memory export")
    assert "0 personal memories, the 0 room memories you taught and 2 memories of other people" in text_of(result)
    data = json.loads(await result.response.attachments[0].read())
    assert {(m["id"], m["owner_id"], m.get("mentions_you")) for m in data["memories"]} == {
        (lent, world.bob.id, True), (other, world.bob.id, True)}
    why = text_of(await world.alice.slash(world.general, "memory why", id=lent))
    assert "another member's memory that mentions you" in why and "50 euros" in why
    assert "What it tells happens on 5 Mar 2026." in why

    assert "No memory" in text_of(await world.mod.slash(world.random, "memory forget", id=lent))  # not named
    assert "Forgot memory" in text_of(await world.alice.slash(world.general, "memory forget", id=lent))
    assert [m.id for m in await world.engine.write(store.memories_of, world.bob.id, ("personal",))] == [other]

    asked = await world.alice.slash(world.general, "memory forget-all")
    assert "1 memories of other people that mention you" in text_of(asked)
    await world.alice.click(asked.response, label="Forget everything")
    done = world.env.backend.get_message(asked.response.channel_id, asked.response.id).content
    assert "1 memories of others that mentioned you" in done
    assert await world.engine.write(store.memories_of, world.bob.id, ("personal",)) == []
    assert await world.engine.write(lambda conn: conn.execute("SELECT count(*) FROM memory_mentions").fetchall()) \
        == [(0,)]


async def test_remember_keeps_no_secret(world):
    result = await world.alice.slash(world.general, "memory remember", text="my bank PIN is 4821")
    assert "keeps no passwords" in text_of(result)
    assert await world.engine.write(store.memories_of, world.alice.id, ("personal",)) == []


async def test_forget_all_asks_first_then_erases_every_trace(world):
    ids = await seed(world)
    ids["alice_taught"] = await world.engine.remember(NewMemory(
        "the general channel knows Alice's address", "room", owner_id=world.alice.id, guild_id=world.guild.id,
        channel_id=world.general.id))
    link = lambda conn, a, b, kind: storage_of(conn).add_link(conn, a, b, kind)  # noqa: E731
    await world.engine.write(link, ids["alice_here"], ids["alice_dm"], "co_extracted")
    await world.engine.write(link, ids["alice_here"], ids["room_general"], "semantic")
    await world.alice.user.send_dm("I keep bees")  # history of hers, and Muninn's reply in her DM

    asked = await world.alice.slash(world.general, "memory forget-all")
    assert asked.ephemeral and "all 2 of your personal memories" in text_of(asked)
    assert "the 1 room memories you taught" in text_of(asked)
    await world.alice.click(asked.response, label="Cancel")
    assert len(await world.engine.write(store.memories_of, world.alice.id, ("personal",))) == 2

    asked = await world.alice.slash(world.general, "memory forget-all")
    await world.alice.click(asked.response, label="Forget everything")
    done = world.env.backend.get_message(asked.response.channel_id, asked.response.id).content
    assert done.startswith("Done: Muninn forgot 2 personal memories, 1 room memories you taught")

    postgres = world.engine.storage.name == "postgresql"
    keyword_sql = ("SELECT count(*) FROM memories WHERE text_search @@ to_tsquery('muninn', 'bees | heights | address')"
                   if postgres else "SELECT count(*) FROM memories_fts WHERE memories_fts MATCH 'bees OR heights OR address'")
    vectors = "memory_vectors" if postgres else "vec_memories"

    def traces(conn):
        alice_ids = (ids["alice_here"], ids["alice_dm"], ids["alice_taught"])
        marks = ",".join("?" * len(alice_ids))
        return [conn.execute(sql, alice_ids * times).fetchall()[0][0] for sql, times in (
            (f"SELECT count(*) FROM memories WHERE id IN ({marks})", 1),
            (keyword_sql, 0),
            (f"SELECT count(*) FROM {vectors} WHERE memory_id IN ({marks})", 1),
            (f"SELECT count(*) FROM memory_links WHERE source_id IN ({marks}) OR target_id IN ({marks})", 2),
        )] + [conn.execute("SELECT count(*) FROM messages WHERE author_id = ? OR channel_id = ?",
                           (world.alice.id, world.alice.user.dm_channel.id)).fetchall()[0][0]]
    assert await world.engine.write(traces) == [0, 0, 0, 0, 0]
    left = set((await world.engine.write(store.get_many, list(ids.values()))).keys())
    assert left == {ids["bob_here"], ids["room_general"], ids["room_random"], ids["global"]}


async def test_an_unexpected_failure_is_logged_and_answered_politely(world, caplog):
    ids = await seed(world)
    # A broken database: a table the forget needs. On PostgreSQL a forget reaches the vectors
    # only through ON DELETE CASCADE and triggers, so the memories table itself goes.
    drop = "DROP TABLE memories CASCADE" if world.engine.storage.name == "postgresql" else "DROP TABLE memories_fts"
    broken = drop.split()[2]
    await world.engine.write(lambda conn: conn.execute(drop))
    result = await world.alice.slash(world.general, "memory forget", id=ids["alice_here"])
    assert result.ephemeral and text_of(result) == SOMETHING_WENT_WRONG
    assert "/memory forget failed" in caplog.text and broken in caplog.text
    world.failures_expected = True


async def test_slash_command_answers_never_ping_even_when_they_quote_mentions(world):
    crew = world.guild.create_role("Crew")
    pings = f"@everyone <@&{crew.id}> <@{world.bob.id}>"
    memory_id = await world.engine.remember(NewMemory(f"{pings} meet at noon", "personal", owner_id=world.alice.id,
                                                      guild_id=world.guild.id, channel_id=world.general.id))
    await world.alice.slash(world.general, "memory list")                      # an interaction response
    await world.alice.slash(world.general, "memory search", query=f"{pings} meet")  # a followup
    await world.alice.slash(world.general, "memory forget", id=memory_id)      # echoes the memory's text
    await world.alice.slash(world.general, "memory forget", id=memory_id)      # a refusal
    asked = await world.alice.slash(world.general, "memory forget-all")
    await world.alice.click(asked.response, label="Forget everything")         # edits of the response
    answers = [r for r in world.env.http_requests if r.path.startswith(("/interactions/", "/webhooks/"))]
    bodies = [r.json.get("data", r.json) for r in answers if r.json]
    with_text = [b for b in bodies if b.get("content")]
    assert sum(pings in b["content"] for b in with_text) == 3, with_text
    assert len(with_text) >= 6 and all(b["allowed_mentions"] == {"parse": []} for b in with_text), with_text


async def test_personal_facts_from_a_private_channel_stay_in_that_channel(world):
    staff = world.guild.create_text_channel("staff", overwrites={
        world.guild.default_role: discord.PermissionOverwrite(read_messages=False),
        world.alice: discord.PermissionOverwrite(read_messages=True)})
    result = await world.alice.slash(staff, "memory remember", text="Alice is job hunting quietly")
    assert "in this channel" in text_of(result)
    [memory] = await world.engine.write(store.memories_of, world.alice.id, ("personal",))
    assert memory.private and memory.vis_key.endswith(f":c{staff.id}")
    from bot.memory.scope import Viewer
    found = lambda channel: world.engine.recall("job hunting", Viewer(world.alice.id, channel, world.guild.id))  # noqa: E731
    assert (await found(staff.id)).ids == [memory.id]
    assert (await found(world.general.id)).ids == []  # the public channel's replies never see it
    assert (await world.engine.recall("job hunting", Viewer(world.alice.id, dm=True))).ids == [memory.id]
    public = await world.alice.slash(world.general, "memory remember", text="Alice likes jazz")
    assert "in this server" in text_of(public)


def test_a_channel_whose_privacy_cannot_be_told_counts_as_private():
    from cogs.chat import is_private_channel

    class Unreadable:
        type = discord.ChannelType.text

        def permissions_for(self, role):
            raise discord.ClientException("parent channel not cached")

    class Public(Unreadable):
        def permissions_for(self, role):
            return discord.Permissions(read_messages=True)

    class Guild:
        default_role = object()

    assert is_private_channel(Unreadable(), 5, Guild()) is True
    assert is_private_channel(Public(), 5, None) is True        # guild not cached
    assert is_private_channel(Public(), 5, Guild()) is False
    assert is_private_channel(Public(), None, None) is False    # a DM


@pytest.mark.sqlite_only("SQLite's whole-file write lock (BEGIN IMMEDIATE); PostgreSQL locks rows, not the database")
async def test_a_forget_while_another_process_holds_the_database_says_so_and_changes_nothing(world, monkeypatch):
    from bot.memory import engine as engine_module
    from bot.memory.sql import transactions
    from bot.memory.sqlite import db
    from cogs.client import DATABASE_UNAVAILABLE
    ids = await seed(world)
    world.failures_expected = True   # the failed forget reaches the tree's error handler, on purpose
    monkeypatch.setattr(transactions, "LOCK_RETRIES", 0)
    monkeypatch.setattr(engine_module, "WRITE_RETRY_DELAYS_S", (0.05,))
    await world.engine.write(lambda conn: conn.set_busy_timeout(50))
    other = db.connect(world.engine.settings.db_path)   # e.g. `muninn import` in another process
    other.execute("BEGIN IMMEDIATE")
    try:
        result = await world.alice.slash(world.general, "memory forget", id=ids["alice_here"])
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert result.ephemeral and text_of(result) == DATABASE_UNAVAILABLE
    assert ids["alice_here"] in await world.engine.write(store.get_many, [ids["alice_here"]])
    result = await world.alice.slash(world.general, "memory forget", id=ids["alice_here"])
    assert "Forgot memory" in text_of(result)
