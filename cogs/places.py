"""Where a Discord message was written and by whom, and what applies there: the place's settings
(bot/conversation/overrides.py) and whether Muninn may answer and keep it (bot/conversation/access.py).

`look` reads what the server, the channel and, in a thread, its parent channel have stored, in
one database read, so a change made with /settings applies from the next message on. The
commands that teach Muninn (`TEACHING`) ask the same access rule (`admits`); those that show,
export or forget what it keeps of a person never do, so a blocked person keeps those rights.
"""
from __future__ import annotations

from dataclasses import dataclass

import discord

from bot.conversation import access, overrides
from bot.conversation.access import Author, Verdict
from bot.conversation.overrides import Tuning
from bot.memory.options import Stored

# Slash commands and context menus that make Muninn keep something a person tells it.
TEACHING = frozenset({"memory remember", "Remember this"})
NOT_KEPT = "Muninn keeps nothing you tell it here (this server's access lists or the operator's)."


@dataclass(frozen=True)
class Place:
    """A channel as the settings see it: its id, its guild, the parent channel of a thread (None
    otherwise) and every id the access lists may name for it (itself, its parent, its category)."""
    channel_id: int
    guild_id: int | None
    parent_id: int | None
    ids: tuple[int, ...]


@dataclass(frozen=True)
class Look:
    """What applies to one message: its place, the settings there, and the access verdict."""
    place: Place
    tuning: Tuning
    verdict: Verdict


def place_of(channel, guild_id: int | None) -> Place:
    """The place of a channel or thread (a DM has no guild, no parent)."""
    parent_id = channel.parent_id if isinstance(channel, discord.Thread) else None
    parent = channel.parent if isinstance(channel, discord.Thread) else channel
    category = getattr(parent, "category_id", None)
    ids = tuple(i for i in (channel.id, parent_id, category) if i is not None)
    return Place(channel.id, guild_id, parent_id, ids)


def author_of(message: discord.Message) -> Author:
    """The message's author as the access rule sees them: their roles here, bot, webhook."""
    roles = frozenset(role.id for role in getattr(message.author, "roles", ()))
    return Author(message.author.id, roles, bot=message.author.bot, webhook=message.webhook_id is not None)


def reads_everything(bot) -> bool:
    """Whether the bot runs with the Message Content intent (cogs/client.py decides it at start)."""
    return bool(getattr(bot, "reads_everything", True))


async def tuning_at(bot, place: Place) -> tuple[Tuning, dict[str, str]]:
    """The settings that apply at a place, and the server's stored settings (its access lists)."""
    if place.guild_id is None:  # a DM: the .env alone applies, nothing to read
        stored = Stored()
    else:
        channels = [place.channel_id] + ([place.parent_id] if place.parent_id is not None else [])
        stored = await bot.engine.options.stored(place.guild_id, channels)
    tuning = overrides.resolve(bot.settings, stored, guild_id=place.guild_id, channel_id=place.channel_id,
                               parent_id=place.parent_id, reads_everything=reads_everything(bot))
    return tuning, stored.guild


async def look(bot, message: discord.Message, guild_id: int | None = None) -> Look:
    """Everything that applies to a message: the place's settings and the access verdict.
    `guild_id`: the message's server when discord.py has not cached it (an edit's payload)."""
    place = place_of(message.channel, message.guild.id if message.guild else guild_id)
    tuning, guild = await tuning_at(bot, place)
    verdict = access.admit(bot.settings, author_of(message), guild_id=place.guild_id, places=place.ids, lists=guild)
    return Look(place, tuning, verdict)


async def admits(bot, interaction: discord.Interaction) -> Verdict:
    """The access verdict for the caller of a command, where it runs."""
    if interaction.channel is None:
        return Verdict(False, "no channel")
    place = place_of(interaction.channel, interaction.guild_id)
    guild = (await bot.engine.options.stored(place.guild_id, [])).guild if place.guild_id is not None else {}
    user = interaction.user
    author = Author(user.id, frozenset(role.id for role in getattr(user, "roles", ())), bot=user.bot)
    return access.admit(bot.settings, author, guild_id=place.guild_id, places=place.ids, lists=guild)
