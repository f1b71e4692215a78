"""The bot in real life, through the real cogs in simcord's Discord: reasoning never posted,
streamed replies that end as the plain ones, failed background calls that never block a reply,
and the privacy controls (/memory pause, resume and why; forgetting in plain words).

Extraction hands exchanges to `Handoff` (see tests/scenarios/test_story.py for why), which also records
what the pipeline asked it to drop.
"""
from __future__ import annotations

import pytest
from discord import app_commands

from bot.conversation.pipeline import PAUSED_NOTE
from bot.conversation.text import split_message
from bot.conversation.thinking import CANNOT_THINK
from bot.llm.errors import OllamaUnavailable
from bot.memory.records import NewMemory
from bot.memory.sql import history, store
from cogs.client import MuninnBot, Refusal

pytestmark = pytest.mark.usefixtures("backend")  # each test on SQLite and on PostgreSQL


class Handoff:
    """The bot's extractor: keeps exchanges, and what it was told to forget."""

    def __init__(self) -> None:
        self.exchanges: list = []
        self.forgotten_users: list[int] = []
        self.forgotten_messages: list[int] = []

    def submit(self, exchange) -> None:
        self.exchanges.append(exchange)

    def forget(self, user_id: int) -> None:
        self.forgotten_users.append(user_id)

    def forget_messages(self, message_ids) -> None:
        self.forgotten_messages += list(message_ids)

    def mark_gone(self, message_ids) -> None:
        pass  # forget_messages, called after, records the ids

    async def close(self) -> None:
        pass


@pytest.fixture
def bot_settings():
    return {}


@pytest.fixture
async def simcord_bot(fake_ollama, make_settings, bot_settings):
    handoff = Handoff()
    # simcord reports no application flags: the Message Content intent is granted by setting
    bot = MuninnBot(make_settings(fake_ollama.url, **{"MUNINN_MESSAGE_CONTENT": "on", **bot_settings}),
                    extractor_factory=lambda engine: handoff)
    bot.handoff = handoff
    yield bot
    await bot.close()


@pytest.fixture
async def place(simcord_env, simcord_bot, fake_ollama):
    env = simcord_env
    guild = env.create_guild("Asgard")
    general = guild.create_text_channel("general")
    alice = guild.add_member(env.create_user("alice", global_name="Alice"))
    bob = guild.add_member(env.create_user("bob", global_name="Bob"))
    await simcord_bot.tree.sync()
    fake_ollama.default_chat_reply = "Hello from Muninn."
    yield env, simcord_bot, guild, general, alice, bob
    unexpected = [e for e in env.errors if not isinstance(e, (Refusal, app_commands.CheckFailure))]
    assert not unexpected, unexpected  # refusals are answers; anything else is a bug


def bot_texts(bot, channel) -> list[str]:
    return [m.content for m in channel.history() if m.author.id == bot.user.id]


# -- reasoning models --------------------------------------------------------------------

REASONING_SHAPES = [
    # DeepSeek-R1 (and distills) on an Ollama that leaves the reasoning in the content
    ("<think>\nThe user greets me. I should greet back.\n</think>\n\nHi Alice!", "Hi Alice!"),
    # Qwen3 with thinking switched off still sends an empty block
    ("<think>\n\n</think>\n\nHi Alice!", "Hi Alice!"),
    # QwQ / templates that open <think> in the prompt: only the closing tag arrives
    ("Okay, a greeting. Keep it short.\n</think>\n\nHi Alice!", "Hi Alice!"),
    # any case, other tag names
    ("<THINK>hmm</THINK>Hi Alice!", "Hi Alice!"),
    ("<thinking>greet</thinking>\nHi Alice!", "Hi Alice!"),
    # gpt-oss's harmony format left raw by an old template
    ("<|channel|>analysis<|message|>Greet her.<|end|><|start|>assistant<|channel|>final<|message|>Hi Alice!",
     "Hi Alice!"),
    # code fences are part of an answer, not reasoning
    ("<think>code</think>```py\nprint('hi')\n```", "```py\nprint('hi')\n```"),
]


@pytest.mark.parametrize("stream", ["true", "false"])
@pytest.mark.parametrize("raw, shown", REASONING_SHAPES)
async def test_reasoning_is_never_posted(place, fake_ollama, raw, shown, stream):
    env, bot, *_ , alice, _ = place
    bot.settings = bot.pipeline.settings = bot.settings.replace(stream_replies=stream == "true")
    fake_ollama.chat_replies.append(raw)
    await alice.user.send_dm("hello")
    assert bot_texts(bot, alice.user.dm_channel) == [shown]
    [row] = [r for r in await bot.engine.write(history.recent, alice.user.dm_channel.id, 10) if r.role == "assistant"]
    assert row.content == shown  # the history keeps the answer, not the reasoning


async def test_an_answer_that_is_only_reasoning_gets_the_fallback(place, fake_ollama):
    env, bot, *_, alice, _ = place
    fake_ollama.chat_replies.append("<think>I will never finish this thought")
    await alice.user.send_dm("hello")
    assert bot_texts(bot, alice.user.dm_channel) == [CANNOT_THINK]


# -- streaming -------------------------------------------------------------------------------

async def test_a_streamed_reply_ends_exactly_as_the_plain_one_even_past_2000_characters(place, fake_ollama):
    env, bot, _, general, alice, _ = place
    long = "\n\n".join(f"Paragraph {n}: " + "ravens remember faces. " * 30 for n in range(5))  # ~3,500 chars
    fake_ollama.stream_pieces = 40
    fake_ollama.chat_replies.append(long)
    await alice.send(general, f"{bot.user.mention} tell me about ravens")
    streamed = bot_texts(bot, general)
    assert streamed == split_message(long) and len(streamed) > 1

    bot.settings = bot.pipeline.settings = bot.settings.replace(stream_replies=False)
    fake_ollama.chat_replies.append(long)
    await alice.send(general, f"{bot.user.mention} again, please")
    assert bot_texts(bot, general)[len(streamed):] == streamed
    assert fake_ollama.chat_requests()[-1]["stream"] is False
    assert fake_ollama.chat_requests()[-2]["stream"] is True


async def test_a_stream_that_breaks_off_ends_as_the_fallback_and_nothing_is_kept(place, fake_ollama):
    env, bot, _, general, alice, _ = place
    fake_ollama.stream_pieces, fake_ollama.stream_fail_after = 10, 6
    fake_ollama.chat_replies.append("Ravens remember faces. " * 150)
    await alice.send(general, f"{bot.user.mention} tell me about ravens")
    assert bot_texts(bot, general) == [CANNOT_THINK]                   # the partial answer is replaced
    assert [r.role for r in await bot.engine.write(history.recent, general.id, 10)] == ["user"]
    assert bot.handoff.exchanges == []


# -- cooldowns per purpose ----------------------------------------------------------------

@pytest.mark.parametrize("bot_settings", [{"OLLAMA_COOLDOWN": "15"}])
async def test_a_failed_background_call_never_blocks_the_next_reply(place, fake_ollama):
    env, bot, *_, alice, _ = place
    fake_ollama.chat_replies.append(fake_ollama.HTTP_500)
    with pytest.raises(OllamaUnavailable):  # fact extraction's call fails...
        await bot.engine.ollama.chat([{"role": "user", "content": "extract"}], background=True)
    await alice.user.send_dm("hello")        # ...and the next person's answer goes through
    assert bot_texts(bot, alice.user.dm_channel) == ["Hello from Muninn."]


@pytest.mark.parametrize("bot_settings", [{"OLLAMA_COOLDOWN": "15"}])
async def test_a_reply_goes_through_as_soon_as_ollama_is_back(place, fake_ollama):
    env, bot, *_, alice, _ = place
    await fake_ollama.go_down()
    await alice.user.send_dm("are you there?")
    await fake_ollama.come_up()
    await alice.user.send_dm("and now?")      # within a second of the failure: still the fallback
    await env.advance_time(1.05)              # then the next reply probes /api/version and goes through
    await alice.user.send_dm("and now?")
    assert bot_texts(bot, alice.user.dm_channel) == [CANNOT_THINK, CANNOT_THINK, "Hello from Muninn."]
    assert [path for path, _ in fake_ollama.requests if path == "/api/version"] == ["/api/version"]


# -- /memory pause and resume ---------------------------------------------------------------

async def test_while_paused_nothing_of_a_person_is_kept_and_muninn_says_so_once(place, fake_ollama):
    env, bot, _, general, alice, bob = place
    dm = alice.user.dm_channel if alice.user.dm_channel else None
    bees = await bot.engine.remember(NewMemory("Alice keeps bees", "personal", owner_id=alice.id, guild_id=None))
    result = await alice.slash(general, "memory pause")
    assert result.ephemeral and "Paused" in result.response.content
    assert bot.handoff.forgotten_users == [alice.id]  # what was waiting for extraction is dropped
    assert "already paused" in (await alice.slash(general, "memory pause")).response.content

    await alice.user.send_dm("my sister is called Ylva")
    await alice.user.send_dm("and I live in Oslo, with my bees")
    assert "Alice keeps bees" in fake_ollama.chat_requests()[-1]["messages"][0]["content"]  # still recalled...
    assert (await bot.engine.write(store.get, bees)).access_count == 0                         # ...but not counted
    dm = alice.user.dm_channel
    assert bot_texts(bot, dm) == ["Hello from Muninn.", PAUSED_NOTE, "Hello from Muninn."]  # said once
    await alice.send(general, "I keep bees")  # not addressed to Muninn: not even recorded
    await bob.send(general, "bob talks")
    assert await bot.engine.write(history.recent, dm.id, 10) == []
    assert [r.content for r in await bot.engine.write(history.recent, general.id, 10)] == ["bob talks"]
    assert bot.handoff.exchanges == []

    result = await alice.user.slash("memory resume")
    assert "Resumed" in result.response.content
    await alice.user.send_dm("I have a cat")
    assert [e.user_message for e in bot.handoff.exchanges] == ["I have a cat"]
    assert bot_texts(bot, dm)[-1] == "Hello from Muninn."
    assert not await bot.engine.memory_paused(alice.id)


# -- /memory why --------------------------------------------------------------------------------

async def test_why_shows_the_origin_of_a_memory_to_its_owner_only(place, fake_ollama):
    env, bot, guild, general, alice, bob = place
    memory_id = await bot.engine.remember(NewMemory(
        "Alice keeps bees", "personal", owner_id=alice.id, guild_id=guild.id, channel_id=general.id,
        source_message_ids=[111, 222], created_at=1_700_000_000))
    told = await bot.engine.remember(NewMemory("Alice likes tea", "personal", owner_id=alice.id, guild_id=None))

    result = await alice.slash(general, "memory why", id=memory_id)
    text = result.response.content
    assert result.ephemeral and f"`#{memory_id}`" in text and "<t:1700000000:f>" in text
    assert f"<#{general.id}>" in text
    assert f"https://discord.com/channels/{guild.id}/{general.id}/111" in text and "/222" in text
    assert "/memory remember" in (await alice.user.slash("memory why", id=told)).response.content

    for actor, memory in ((bob, memory_id), (alice, 999999)):  # someone else's, or none: one answer
        refused = await actor.slash(general, "memory why", id=memory)
        assert refused.ephemeral and refused.response.content == f"No memory #{memory} of yours."


# -- forgetting in plain words ------------------------------------------------------------------

async def seed_oslo(bot, guild, general, alice, bob) -> dict[str, int]:
    items = {
        "oslo": NewMemory("Alice lives in Oslo", "personal", owner_id=alice.id, guild_id=guild.id,
                          channel_id=general.id),
        "bees": NewMemory("Alice keeps bees", "personal", owner_id=alice.id, guild_id=guild.id,
                          channel_id=general.id),
        "oslo_dm": NewMemory("Alice moved to Oslo for work", "personal", owner_id=alice.id, guild_id=None),
        "bob": NewMemory("Bob lives in Oslo", "personal", owner_id=bob.id, guild_id=guild.id,
                         channel_id=general.id),
        "room": NewMemory("the channel meets in Oslo", "room", owner_id=alice.id, guild_id=guild.id,
                          channel_id=general.id),
    }
    return {key: await bot.engine.remember(memory) for key, memory in items.items()}


async def test_forget_in_plain_words_shows_the_matches_and_forgets_on_confirmation(place, fake_ollama):
    env, bot, guild, general, alice, bob = place
    ids = await seed_oslo(bot, guild, general, alice, bob)
    before = await bot.engine.write(store.get, ids["oslo"])
    asked = await alice.send(general, f"{bot.user.mention} forget that I live in Oslo")
    [offer] = [m for m in general.history() if m.author.id == bot.user.id]
    assert offer.content.startswith("I found 1 memory of yours that match")   # a public channel: no texts
    assert "Oslo" not in offer.content and offer.reference.message_id == asked.id
    shown = await alice.click(offer, label="Show")                            # for her eyes only
    assert shown.ephemeral
    # only her own personal memory that could surface here: not Bob's, not the room's, not her DM's
    assert f"`#{ids['oslo']}`" in shown.response.content and "Alice lives in Oslo" in shown.response.content
    for key in ("bees", "oslo_dm", "bob", "room"):
        assert f"`#{ids[key]}`" not in shown.response.content
    assert "someone else" in (await bob.click(offer, label="Show")).response.content
    assert fake_ollama.chat_requests() == []            # the model never saw the request...
    assert await bot.engine.write(history.recent, general.id, 10) == []  # ...and it is not kept
    assert bot.handoff.exchanges == []
    after = await bot.engine.write(store.get, ids["oslo"])
    assert after.access_count == before.access_count    # looking did not count as a recall

    refused = await bob.click(offer, label="Forget")     # only the asker may confirm
    assert refused.ephemeral and "someone else" in refused.response.content
    await alice.click(offer, label="Forget")
    done = env.backend.get_message(offer.channel.id, offer.id)
    assert done.content == "Forgotten: 1 memory." and not done.components
    left = set((await bot.engine.write(store.get_many, list(ids.values()))).keys())
    assert left == set(ids.values()) - {ids["oslo"]}

    await alice.send(general, f"{bot.user.mention} please forget about my pet dragon")
    assert "nothing of yours here" in bot_texts(bot, general)[-1]
    await alice.send(general, f"{bot.user.mention} forget everything about me")
    assert "/memory forget-all" in bot_texts(bot, general)[-1]



async def test_forget_buttons_still_answer_after_a_restart(place, fake_ollama):
    from cogs import confirm
    env, bot, guild, general, alice, bob = place
    ids = await seed_oslo(bot, guild, general, alice, bob)
    await alice.send(general, f"{bot.user.mention} forget that I live in Oslo")
    [offer] = [m for m in general.history() if m.author.id == bot.user.id]
    restarted = MuninnBot(bot.settings, extractor_factory=lambda engine: Handoff())
    await env.restart_bot(restarted)                    # a new bot process: the old one's views are gone
    confirm._waiting.clear()                             # (module state of the old process)
    try:
        assert "someone else" in (await bob.click(offer, label="Forget")).response.content
        shown = await alice.click(offer, label="Show")
        assert shown.ephemeral and f"`#{ids['oslo']}`" in shown.response.content
        await alice.click(offer, label="Forget")
        assert env.backend.get_message(offer.channel.id, offer.id).content == "Forgotten: 1 memory."
        left = set((await restarted.engine.get_many(list(ids.values()))).keys())
        assert left == set(ids.values()) - {ids["oslo"]}   # exactly what was offered, nothing of Bob's
    finally:
        await restarted.close()


async def test_a_forget_question_from_long_before_a_restart_has_expired(place, fake_ollama, monkeypatch):
    from cogs import confirm
    env, bot, guild, general, alice, bob = place
    ids = await seed_oslo(bot, guild, general, alice, bob)
    await alice.send(general, f"{bot.user.mention} forget that I live in Oslo")
    [offer] = [m for m in general.history() if m.author.id == bot.user.id]
    confirm._waiting.clear()                             # nobody in this process waits on it any more
    monkeypatch.setattr(confirm, "CONFIRM_TIMEOUT", -1)  # ...and it was asked longer ago than the timeout
    await alice.click(offer, label="Forget")
    done = env.backend.get_message(offer.channel.id, offer.id)
    assert done.content == confirm.EXPIRED and not done.components
    assert len(await bot.engine.get_many(list(ids.values()))) == len(ids)


async def test_an_offer_too_large_for_custom_ids_still_asks_and_forgets(place, fake_ollama, monkeypatch):
    from cogs import confirm
    env, bot, guild, general, alice, bob = place
    ids = await seed_oslo(bot, guild, general, alice, bob)
    monkeypatch.setattr(confirm, "CUSTOM_ID_LIMIT", 20)  # as if the offer held many long ids
    await alice.send(general, f"{bot.user.mention} forget that I live in Oslo")
    [offer] = [m for m in general.history() if m.author.id == bot.user.id]
    assert not any(b.custom_id.startswith("muninn:forget:") for row in offer.components for b in row.children)
    assert "someone else" in (await bob.click(offer, label="Forget")).response.content
    assert f"`#{ids['oslo']}`" in (await alice.click(offer, label="Show")).response.content
    await alice.click(offer, label="Forget")
    assert env.backend.get_message(offer.channel.id, offer.id).content == "Forgotten: 1 memory."
    assert ids["oslo"] not in await bot.engine.get_many(list(ids.values()))

async def test_keep_leaves_everything_as_it_was(place, fake_ollama):
    env, bot, guild, general, alice, bob = place
    ids = await seed_oslo(bot, guild, general, alice, bob)
    await alice.send(general, f"{bot.user.mention} forget that I live in Oslo")
    [offer] = [m for m in general.history() if m.author.id == bot.user.id]
    await alice.click(offer, label="Keep")
    assert env.backend.get_message(offer.channel.id, offer.id).content == "Kept: nothing was forgotten."
    assert len(await bot.engine.write(store.get_many, list(ids.values()))) == len(ids)


async def test_dont_remember_this_takes_back_the_previous_message(place, fake_ollama):
    env, bot, guild, general, alice, bob = place
    told = await alice.user.send_dm("my PIN is 4711")
    memory_id = await bot.engine.remember(NewMemory(
        "Alice's PIN is 4711", "personal", owner_id=alice.id, guild_id=None, source_message_ids=[told.id]))
    await alice.user.send_dm("don't remember this")
    dm = alice.user.dm_channel
    assert bot.handoff.forgotten_messages == [told.id]   # not extracted, if it was still waiting
    [offer] = [m for m in dm.history() if m.author.id == bot.user.id and m.components]
    assert "previous message" in offer.content and f"`#{memory_id}`" in offer.content
    await alice.user.click(offer, label="Forget")
    assert await bot.engine.write(store.get_many, [memory_id]) == {}
    kept = [r.content for r in await bot.engine.write(history.recent, dm.id, 10)]
    assert "my PIN is 4711" not in kept and "don't remember this" not in kept   # out of the history too

    await alice.user.send_dm("I am thinking of quitting my job")
    await alice.user.send_dm("forget what I just said")                        # nothing learned yet
    assert "dropped your previous message" in bot_texts(bot, dm)[-1]
    assert "I am thinking of quitting my job" not in [r.content for r in await bot.engine.write(
        history.recent, dm.id, 10)]

    await bob.user.send_dm("forget that")                # nothing said before: nothing to forget
    assert "no earlier message" in bot_texts(bot, bob.user.dm_channel)[-1]
