"""Discord's MESSAGE_UPDATE through discord.py's real models (its own RawMessageUpdateEvent,
built as its gateway parser builds it) into the Chat cog: an edit in a guild Muninn has not
cached is a guild channel's edit (private, as an unknown channel counts), never a DM's; a DM
edit is a DM's; a bot's edit, and an update that is not an edit (a pin, a link preview, a new
thread: no edited_timestamp), change nothing. Pipeline level: such an update of a message the
history no longer holds keeps what it taught."""
from __future__ import annotations

import itertools
import time
from datetime import datetime, timedelta, timezone

import discord
import pytest

from bot.conversation.pipeline import Pipeline
from bot.memory.records import NewMemory
from cogs.chat import Chat
from tests.cogs import test_cogs
from tests.cogs.test_cogs import World

simcord_bot, world = test_cogs.simcord_bot, test_cogs.world  # the simcord world: MuninnBot unmodified

pytestmark = pytest.mark.usefixtures("backend")
_ids = itertools.count(5 * 10**17)
UNCACHED_GUILD = 777 * 10**15


def update(world: World, *, guild_id: int | None, channel_id: int, bot: bool = False, content: str = "new words",
           edited: bool = True, edited_at: str = "2026-01-01T10:05:00+00:00") -> discord.RawMessageUpdateEvent:
    """A MESSAGE_UPDATE as the gateway sends it, parsed as discord.py's ConnectionState does."""
    data: dict = {
        "id": str(next(_ids)), "channel_id": str(channel_id), "content": content, "type": 0, "tts": False,
        "author": {"id": str(world.alice.id), "username": "alice", "discriminator": "0", "avatar": None,
                   "global_name": "Alice", "bot": bot},
        "timestamp": "2026-01-01T10:00:00+00:00",
        "edited_timestamp": edited_at if edited else None,
        "mention_everyone": False, "mentions": [], "mention_roles": [], "attachments": [], "embeds": [],
        "pinned": not edited}
    if guild_id is not None:
        data["guild_id"] = str(guild_id)
    state = world.bot._connection
    channel, _ = state._get_guild_channel(data)  # type: ignore[arg-type]
    return discord.RawMessageUpdateEvent(data=data, message=discord.Message(state=state, channel=channel, data=data))  # type: ignore[arg-type]


@pytest.fixture
def edits(world: World, monkeypatch) -> list[dict]:
    """What the Chat cog asked the pipeline to record (the pipeline then runs as usual)."""
    seen: list[dict] = []
    real = world.bot.pipeline.edited

    async def edited(message_id: int, content: str, edited_at: float | None = None, *, private: bool = False,
                     mentions: tuple[tuple[str, int], ...] = (), moderator: bool = False, learning: bool = True) -> bool:
        seen.append(dict(message_id=message_id, content=content, edited_at=edited_at, private=private))
        return await real(message_id, content, edited_at, private=private, mentions=mentions, moderator=moderator,
                          learning=learning)
    monkeypatch.setattr(world.bot.pipeline, "edited", edited)
    return seen


def chat(world: World) -> Chat:
    cog = world.bot.get_cog("Chat")  # the extension's own module object (not isinstance of our import)
    assert cog is not None and type(cog).__name__ == "Chat"
    return cog  # type: ignore[return-value]


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_an_edit_in_an_uncached_guild_counts_as_a_private_guild_channel_not_a_dm(world, edits):
    payload = update(world, guild_id=UNCACHED_GUILD, channel_id=4242)
    assert payload.guild_id is None  # discord.py cannot tell it from a DM by itself
    await chat(world).on_raw_message_edit(payload)
    assert edits == [dict(message_id=payload.message_id, content="new words",
                          edited_at=payload.message.edited_at.timestamp(), private=True)]


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_a_dm_edit_is_a_dms_and_a_public_channels_is_public(world, edits):
    dm = update(world, guild_id=None, channel_id=4343)
    assert isinstance(dm.message.channel, discord.DMChannel)
    await chat(world).on_raw_message_edit(dm)
    public = update(world, guild_id=world.guild.id, channel_id=world.general.id)
    await chat(world).on_raw_message_edit(public)
    assert [(e["message_id"], e["private"]) for e in edits] == [(dm.message_id, False), (public.message_id, False)]


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_a_bots_edit_and_an_update_that_is_no_edit_are_ignored(world, edits):
    await chat(world).on_raw_message_edit(update(world, guild_id=world.guild.id, channel_id=world.general.id,
                                                 bot=True))
    pinned = update(world, guild_id=world.guild.id, channel_id=world.general.id, edited=False)
    assert pinned.message.edited_at is None and "content" in pinned.data
    await chat(world).on_raw_message_edit(pinned)
    assert edits == []


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
async def test_pinning_an_old_message_keeps_what_it_taught(world, edits):
    pinned = update(world, guild_id=world.guild.id, channel_id=world.general.id, content="I moved to Oslo",
                    edited=False)
    learned = await world.engine.remember(NewMemory("Alice lives in Oslo", "personal", owner_id=world.alice.id,
                                                    source_message_ids=[pinned.message_id]))  # pruned since
    await chat(world).on_raw_message_edit(pinned)
    assert list(await world.engine.get_many([learned])) == [learned]
    # edited in January, learned from since, pruned, pinned now: the update carries January's edit time
    edited_long_ago = update(world, guild_id=world.guild.id, channel_id=world.general.id, content="I moved to Bergen")
    learned_since = await world.engine.remember(NewMemory("Alice lives in Bergen", "personal", owner_id=world.alice.id,
                                                          source_message_ids=[edited_long_ago.message_id]))
    await chat(world).on_raw_message_edit(edited_long_ago)
    assert list(await world.engine.get_many([learned_since])) == [learned_since]


async def test_a_real_edit_of_a_pruned_message_takes_back_what_its_old_words_taught(world, edits):
    just_now = datetime.now(timezone.utc) + timedelta(seconds=5)
    edited = update(world, guild_id=world.guild.id, channel_id=world.general.id, content="I moved to Bergen",
                    edited_at=just_now.isoformat())
    learned = await world.engine.remember(NewMemory("Alice lives in Oslo", "personal", owner_id=world.alice.id,
                                                    source_message_ids=[edited.message_id]))  # pruned since
    await chat(world).on_raw_message_edit(edited)
    assert await world.engine.get_many([learned]) == {}


async def test_an_update_without_edited_at_of_a_pruned_message_keeps_its_facts(engine):
    learned = await engine.remember(NewMemory("Alice lives in Oslo", "personal", owner_id=7,
                                              source_message_ids=[2000]))  # message 2000 was pruned since
    pipeline = Pipeline(engine)
    assert not await pipeline.edited(2000, "I moved to Oslo")      # no edited_at: a pin, a preview
    assert list(await engine.get_many([learned])) == [learned]
    assert not await pipeline.edited(2000, "I moved to Bergen", time.time())  # a real edit
    assert await engine.get_many([learned]) == {}
