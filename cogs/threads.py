"""Auto-thread on mention: a channel with `auto_thread` on answers a mention in a new thread.

The thread is opened from the message that mentioned Muninn, named after its first words, and
its answer mode is set to `every` (a thread setting people can change with /settings like any
other), so Muninn then answers every message there. When the thread cannot be opened (Muninn
lacks Create Public Threads, the message already has one), Muninn answers in the channel.
"""
from __future__ import annotations

import logging
from typing import Any, cast

import discord

from bot.conversation.overrides import EVERY, Tuning

from .places import Place, tuning_at

log = logging.getLogger(__name__)

NAME_MAX = 100  # Discord's limit on a thread's name


class InThread:
    """The mention that opened a thread, as the outlet and the pipeline see it: its channel is the
    thread, and the answer there refers to nothing (the message itself is in the parent channel)."""

    def __init__(self, message: discord.Message, thread: discord.Thread):
        self._message = message
        self.channel = thread

    def to_reference(self, **_: Any) -> None:
        """No reference: a reply cannot point at a message of another channel."""
        return None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._message, name)


def mentions_me(message: discord.Message, me: discord.abc.User) -> bool:
    """Whether the message mentions Muninn itself or its role."""
    own_role = message.guild.self_role if message.guild else None
    return any(user.id == me.id for user in message.mentions) or (
        own_role is not None and own_role in message.role_mentions)


def thread_name(message: discord.Message, me: discord.abc.User) -> str:
    """The first words of the message, without Muninn's mention."""
    text = " ".join(message.clean_content.replace(f"@{me.display_name}", " ").split()) or "Muninn"
    return text if len(text) <= NAME_MAX else text[:NAME_MAX - 1].rstrip() + "…"


async def open_thread(bot, message: discord.Message, tuning: Tuning) -> tuple[discord.Message, Tuning] | None:
    """When the channel opens threads on mention and this message mentions Muninn in a channel
    (not a thread): the thread opened from it, answering every message, as (the message as seen
    in the thread, the thread's settings); None otherwise or when it cannot be opened."""
    me = bot.user
    if (message.guild is None or isinstance(message.channel, discord.Thread) or not tuning.auto_thread
            or me is None or not mentions_me(message, me)):
        return None
    try:
        thread = await message.create_thread(name=thread_name(message, me))
    except discord.HTTPException as exc:
        log.warning("cannot open a thread in channel %s (%s): give Muninn the Create Public Threads permission "
                    "there, or turn auto_thread off; answering in the channel", message.channel.id, exc)
        return None
    await bot.engine.options.set_channel(thread.id, message.guild.id, "answer", EVERY)
    category = getattr(message.channel, "category_id", None)
    place = Place(thread.id, message.guild.id, message.channel.id,
                  tuple(i for i in (thread.id, message.channel.id, category) if i is not None))
    in_thread, _ = await tuning_at(bot, place)
    return cast(discord.Message, InThread(message, thread)), in_thread
