"""The unmodified bot against a fake Discord on 127.0.0.1: REST + websocket gateway.

Only discord.py's base URLs are patched, here in the test (tests/fakes/discord_server.py
`patch_discord_urls`); the product code has no test hooks. The bot wires its own real
fact extractor, so this also checks the whole path from a DM to a stored memory.
"""
from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging

import pytest

from bot.memory.sql import store
from cogs.client import MuninnBot
from cogs.launch import main
from tests.fakes.discord_server import Intents

pytestmark = pytest.mark.usefixtures("backend")  # the DM-to-memory path on SQLite and PostgreSQL

FACT = "Alice's sister is called Ylva"


def ollama_answers(request: dict) -> str:
    if request.get("format"):
        said = request["messages"][-1]["content"]
        facts = [{"text": FACT, "about": "Alice", "scope": "personal", "importance": 0.8}] if "Ylva" in said else []
        return json.dumps({"facts": facts})
    return "Got it."



async def stop(bot: MuninnBot, task: asyncio.Task) -> None:
    """Close the bot, then let the events discord.py dispatched while closing run: left pending,
    the test's loop closed under them ("coroutine 'Client._run_event' was never awaited")."""
    await bot.close()
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)
    for _ in range(10):
        events = [t for t in asyncio.all_tasks() if t.get_name().startswith("discord.py: ") and not t.done()]
        if not events:
            return
        await asyncio.wait(events, timeout=1)


async def test_a_bot_stopped_before_its_servers_are_ready_leaves_no_task_behind(
        discord_world, fake_ollama, make_settings, caplog):
    """discord.py announces `ready` guild_ready_timeout after the last server arrives; a stop in
    that time left the announcing task to wake on the closed client and fail (logged as a task
    exception nobody retrieved). The bot cancels it when it closes."""
    fake, alice, guild = discord_world
    caplog.set_level(logging.ERROR, logger="asyncio")
    bot = MuninnBot(make_settings(fake_ollama.url), guild_ready_timeout=0.5)
    task = asyncio.create_task(bot.start("fake-token"))
    await fake.wait_for(lambda: getattr(bot._connection, "_ready_task", None) is not None)
    ready = bot._connection._ready_task
    assert ready is not None and not ready.done()  # the servers are in: `ready` is still to come
    await stop(bot, task)
    await asyncio.sleep(0.7)  # past guild_ready_timeout
    assert ready.done() and ready.exception() is None  # cancelled (discord.py's task returns quietly then)
    gc.collect()
    assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == []


async def test_the_bot_talks_over_the_wire_and_learns_from_a_dm(discord_world, fake_ollama, make_settings):
    fake, alice, guild = discord_world
    general = guild["channels"][0]
    fake_ollama.default_chat_reply = ollama_answers
    settings = make_settings(fake_ollama.url, MUNINN_MAINTENANCE_HOURS="6", MUNINN_STREAM_REPLIES="false")
    bot = MuninnBot(settings, guild_ready_timeout=0.1)
    task = asyncio.create_task(bot.start("fake-token"))
    try:
        await fake.wait_until_ready()
        assert bot.maintenance is not None and not bot.maintenance.done()  # periodic maintenance runs
        intents = fake.identify_payload["intents"]
        assert intents & Intents.MESSAGE_CONTENT and intents & Intents.GUILD_MESSAGES
        assert intents & Intents.DIRECT_MESSAGES
        assert fake.commands[None] == []  # nothing synced on start-up

        # A DM is answered, as a reply, with typing first and no mentions allowed.
        dm = fake.dm_channel(alice)
        told = await fake.send_message(dm["id"], alice, "My sister is called Ylva.")
        answer = await fake.wait_for_sent_message(dm["id"])
        assert answer["json"]["content"] == "Got it."
        assert answer["json"]["allowed_mentions"] == {"parse": []}
        assert answer["json"]["message_reference"]["message_id"] == int(told["id"])
        assert dm["id"] in fake.typing

        # The bot's own extractor stored the fact, as Alice's personal memory from a DM.
        # (the reply reaches the fake before the bot hands the exchange over: wait for the hand-over)
        await fake.wait_for(lambda: bot.extractor.processed >= 1 or bot.extractor._pending or bot.extractor._queue)
        await bot.extractor.drain()
        [memory] = await bot.engine.write(store.memories_of, int(alice["id"]), ("personal",))
        assert (memory.text, memory.guild_id) == (FACT, None)

        # Asked in a DM, the fact is in the prompt...
        sent = len(fake.sent_messages)
        await fake.send_message(dm["id"], alice, "What is my sister called?")
        await fake.wait_for_sent_message(dm["id"], since=sent)
        assert FACT in fake_ollama.chat_requests()[-1]["messages"][0]["content"]

        # ...in the server it is not, and Muninn only speaks when mentioned.
        await fake.send_message(general["id"], alice, "nobody asked Muninn this")
        sent = len(fake.sent_messages)
        await fake.send_message(general["id"], alice, f"{fake.mention(fake.bot_user)} what is my sister called?",
                                mentions=[fake.bot_user])
        await fake.wait_for_sent_message(general["id"], since=sent)
        assert [m["channel_id"] for m in fake.sent_messages[sent:]] == [general["id"]]
        messages = fake_ollama.chat_requests()[-1]["messages"]
        assert "Ylva" not in json.dumps(messages)
        assert messages[-2]["content"].endswith("Alice: nobody asked Muninn this")

        # Slash commands, once synced explicitly, answer privately.
        synced = await bot.tree.sync()
        assert sorted(c.name for c in synced) == ["Forget what this taught you", "Remember this", "memory", "settings"]
        memory_id = next(c.id for c in synced if c.name == "memory")
        listing = await fake.send_interaction("memory", alice, dm["id"], command_id=memory_id,
                                              options=[{"name": "list", "type": 1, "options": []}])
        response = await fake.wait_for_interaction_response(listing)
        assert response["ephemeral"] and FACT in response["data"]["content"]
        listing = await fake.send_interaction("memory", alice, general["id"], command_id=memory_id,
                                              options=[{"name": "list", "type": 1, "options": []}])
        response = await fake.wait_for_interaction_response(listing)
        assert response["ephemeral"] and "Ylva" not in response["data"]["content"]
    finally:
        await stop(bot, task)


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)  # the race is in the adapter, not the database
async def test_a_message_just_before_a_mention_is_in_its_context_however_long_it_took_to_look_at(
        discord_world, fake_ollama, make_settings, monkeypatch):
    """Deciding whether to answer the first message takes longer (a database read across the
    network, here made slow on purpose): the mention sent right after it must still have it in
    its context (bot/conversation/arrivals.py). Without that, it was missing on PostgreSQL."""
    from bot.memory.options import Options
    fake, alice, guild = discord_world
    general = guild["channels"][0]
    quick = Options.stored

    async def slow_stored(self, guild_id, channel_ids):
        await asyncio.sleep(0.4)
        return await quick(self, guild_id, channel_ids)
    monkeypatch.setattr(Options, "stored", slow_stored)
    bot = MuninnBot(make_settings(fake_ollama.url, MUNINN_EXTRACTION="false", MUNINN_STREAM_REPLIES="false"),
                    guild_ready_timeout=0.1)
    task = asyncio.create_task(bot.start("fake-token"))
    try:
        await fake.wait_until_ready()
        await fake.send_message(general["id"], alice, "the boat is called Freya")
        await fake.send_message(general["id"], alice, f"{fake.mention(fake.bot_user)} what is the boat called?",
                                mentions=[fake.bot_user])
        await fake.wait_for_sent_message(general["id"])
        said = [m["content"] for m in fake_ollama.chat_requests()[-1]["messages"][1:]]
        assert len(said) == 2 and said[0].endswith("Alice: the boat is called Freya"), said
    finally:
        await stop(bot, task)


def facts_for(labels: dict):
    """The fake Ollama's answers: a short reply, and for an extraction of Bob's messages the
    facts `labels["about Dave"]` says, about Dave as the model got them (room facts, or
    personal facts about Dave), beside a harmless claim of Bob's and a fact about Bob."""
    def answer(request: dict) -> str:
        if not request.get("format"):
            return "Noted."
        said = request["messages"][-1]["content"]
        facts = []
        if "Quokka" in said:
            facts.append({"text": "Dave lives at 12 Quokka Street.", "importance": 0.9, **labels["about Dave"]})
        if "diabetes" in said:
            facts.append({"text": "@Dave has diabetes.", "importance": 0.9, **labels["about Dave"]})
        if "50 euros" in said:
            facts.append({"text": "Bob lent Dave 50 euros.", "about": "Bob", "scope": "personal", "importance": 0.6})
        if "cats" in said:
            facts.append({"text": "Bob has two cats.", "about": "Bob", "scope": "personal", "importance": 0.6})
        return json.dumps({"facts": facts})
    return answer


async def test_bob_cannot_publish_daves_health_or_home_and_dave_can_erase_what_names_him(
        discord_world, fake_ollama, make_settings):
    """Bob tells Muninn where @Dave lives and that he has diabetes: whether the model calls them
    room facts or Dave's, nothing of it is stored, least of all as a room memory. Bob's own claim
    that names Dave is kept as Bob's, which Dave never sees in recall but finds in his /memory
    export and erases with his /memory forget-all, leaving Bob's other memories."""
    fake, alice, guild = discord_world
    general = guild["channels"][0]
    bob = fake.add_user("bob", global_name="Bob")
    dave = fake.add_user("dave", global_name="Dave")
    fake.add_member(guild, bob)
    fake.add_member(guild, dave)
    labels = {"about Dave": {"about": "room", "scope": "room"}}
    fake_ollama.default_chat_reply = facts_for(labels)
    bot = MuninnBot(make_settings(fake_ollama.url, MUNINN_STREAM_REPLIES="false"), guild_ready_timeout=0.1)
    task = asyncio.create_task(bot.start("fake-token"))
    muninn = fake.mention(fake.bot_user)

    async def bob_says(text: str) -> None:
        sent = len(fake.sent_messages)
        await fake.send_message(general["id"], bob, text, mentions=[fake.bot_user, dave])
        await fake.wait_for_sent_message(general["id"], since=sent)

    async def extracted(words: str) -> None:
        """Wait until Muninn asked the model for the facts of the message with these words, and stored them."""
        await fake.wait_for(lambda: any(words in r["messages"][-1]["content"] for r in fake_ollama.chat_requests()
                                        if r.get("format")))
        await bot.extractor.drain()

    def stored(conn) -> list[tuple[str, str, int]]:
        return [(row[0], row[1], int(row[2])) for row in conn.execute("SELECT text, scope, owner_id FROM memories")]

    try:
        await fake.wait_until_ready()
        await bob_says(f"{muninn} {fake.mention(dave)} lives at 12 Quokka Street")
        # the model reads the mention as a name, never as <@id>
        assert fake_ollama.chat_requests()[-1]["messages"][-1]["content"].endswith(
            "Bob: @Muninn @Dave lives at 12 Quokka Street")
        await bob_says(f"{muninn} {fake.mention(dave)} has diabetes")
        await extracted("has diabetes")
        labels["about Dave"] = {"about": "Dave", "scope": "personal"}   # another run: labelled Dave's
        await bob_says(f"{muninn} by the way, {fake.mention(dave)} lives at 12 Quokka Street and has diabetes")
        await bob_says(f"{muninn} I lent {fake.mention(dave)} 50 euros, and I have two cats")
        await extracted("two cats")

        memories = await bot.engine.write(stored)
        assert [m for m in memories if m[1] == "room"] == []                         # 0 room memories
        assert not [m for m in memories if "Quokka" in m[0] or "diabetes" in m[0]]   # 0 sensitive facts
        assert sorted(memories) == [("Bob has two cats.", "personal", int(bob["id"])),
                                    ("Bob lent Dave 50 euros.", "personal", int(bob["id"]))]

        # Dave: the claim that names him is in his export...
        synced = await bot.tree.sync()
        memory_command = next(c.id for c in synced if c.name == "memory")
        export = await fake.send_interaction("memory", dave, general["id"], command_id=memory_command,
                                             options=[{"name": "export", "type": 1, "options": []}])
        response = await fake.wait_for_interaction_response(export)
        assert response["ephemeral"] and "1 memories of other people that mention you" in response["data"]["content"]
        exported = json.loads(response["files"][0]["data"])
        assert [(m["text"], m["owner_id"], m["mentions_you"]) for m in exported["memories"]] == [
            ("Bob lent Dave 50 euros.", int(bob["id"]), True)]

        # ...and his forget-all removes it, and nothing else of Bob's
        asked = await fake.send_interaction("memory", dave, general["id"], command_id=memory_command,
                                            options=[{"name": "forget-all", "type": 1, "options": []}])
        question = await fake.wait_for_interaction_response(asked)
        assert "1 memories of other people that mention you" in question["data"]["content"]
        pressed = await fake.press_button(dave, question["message"], "Forget everything")
        done = await fake.wait_for(lambda: next((f for f in fake.followups if f["token"] == pressed["token"]
                                                 and f["json"].get("content", "").startswith("Done")), None))
        assert "1 memories of others that mentioned you" in done["json"]["content"]
        assert await bot.engine.write(stored) == [("Bob has two cats.", "personal", int(bob["id"]))]
    finally:
        await stop(bot, task)


@pytest.fixture
def cli_env(tmp_path, monkeypatch, fake_ollama):
    monkeypatch.chdir(tmp_path)  # no .env from the repository
    monkeypatch.setenv("MUNINN_DB_PATH", str(tmp_path / "cli.db"))
    monkeypatch.setenv("OLLAMA_URL", fake_ollama.url)
    return monkeypatch


async def test_without_a_token_muninn_says_in_one_line_what_to_do(cli_env, capsys):
    cli_env.setenv("DISCORD_TOKEN", "")
    assert await asyncio.to_thread(main, []) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "https://discord.com/developers/applications" in err and "Message Content" in err and ".env" in err


async def test_a_rejected_token_is_one_line_too(discord_world, cli_env, capsys):
    fake, _, _ = discord_world
    fake.rejected_tokens.add("bad-token")
    cli_env.setenv("DISCORD_TOKEN", "bad-token")
    assert await asyncio.to_thread(main, ["run"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "rejected DISCORD_TOKEN" in err[0] and ".env" in err[0]
    assert fake.identify_payload is None


async def test_muninn_sync_registers_the_commands_in_one_guild(discord_world, cli_env, capsys):
    fake, _, guild = discord_world
    cli_env.setenv("DISCORD_TOKEN", "fake-token")
    assert await asyncio.to_thread(main, ["sync", "--guild", guild["id"]]) == 0
    out = capsys.readouterr().out
    assert "synced 4 commands to guild" in out and "/memory, /settings, Remember this (message menu)" in out
    assert sorted((c["name"], c["type"]) for c in fake.commands[guild["id"]]) == [
        ("Forget what this taught you", 3), ("Remember this", 3), ("memory", 1), ("settings", 1)]
    memory = next(c for c in fake.commands[guild["id"]] if c["name"] == "memory")
    room = next(o for o in memory["options"] if o["name"] == "room")  # the moderators' subgroup (type 2)
    assert room["type"] == 2 and sorted(o["name"] for o in room["options"]) == [
        "approve", "forget", "list", "log", "mode", "pending", "reject", "search"]
    assert fake.commands[None] == [] and fake.identify_payload is None  # REST only, no gateway
