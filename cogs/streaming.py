"""A reply shown on Discord while it is written, as llmcord does: the first words are posted as
soon as they exist, then the message is edited at most about once a second (Discord allows
5 edits per 5 s per channel), and a reply that outgrows 2,000 characters continues in new
messages. `finish` makes what stays posted exactly `split_message(final text)`, so the result
equals the non-streamed reply: parts that differ are edited, missing ones posted, extra ones
deleted.
"""
from __future__ import annotations

import logging
import math
import time
from typing import Callable

import discord

from bot.conversation.outlets import Sent
from bot.conversation.text import split_message

log = logging.getLogger(__name__)

EDIT_INTERVAL = 1.0   # seconds between two updates of a growing reply
NO_MENTIONS = discord.AllowedMentions.none()


class DiscordReplyStream:
    """A reply to `message` shown while it is written: posted, then edited at most every
    `interval` seconds (by `clock`), continued in new messages past 2,000 characters."""
    def __init__(self, message: discord.Message, *, interval: float = EDIT_INTERVAL,
                 clock: Callable[[], float] = time.monotonic):
        self.message = message
        self.interval = interval
        self.clock = clock
        self.posted: list[discord.Message] = []
        self.shown: list[str] = []
        self.last_update = -math.inf
        self.blocked = False   # no permission to post here: stop trying

    async def update(self, text: str) -> None:
        """Show the reply so far, unless the last update was less than
        `interval` ago (the next update, or `finish`, shows it)."""
        if self.blocked or self.clock() - self.last_update < self.interval:
            return  # the next update (or finish) shows it
        await self._show(split_message(text), final=False)

    async def finish(self, text: str) -> list[Sent]:
        """Make the posted messages exactly split_message(text): parts that differ are
        edited, missing ones posted, extra ones deleted. Returns the messages posted."""
        if not self.blocked:
            await self._show(split_message(text), final=True)
        return [Sent(m.id, m.created_at.timestamp()) for m in self.posted]

    async def _show(self, parts: list[str], *, final: bool) -> None:
        self.last_update = self.clock()
        for index, part in enumerate(parts):
            if index < len(self.posted):
                if self.shown[index] != part:
                    await self._edit(index, part)
            elif not await self._post(part):
                return
        if final:
            while len(self.posted) > len(parts):  # the reply shrank (a failure after a partial answer)
                extra = self.posted.pop()
                self.shown.pop()
                try:
                    await extra.delete()
                except discord.HTTPException as exc:
                    log.warning("could not delete a leftover part of a streamed reply: %s", exc)

    async def _post(self, part: str) -> bool:
        try:
            if self.posted:
                posted = await self.message.channel.send(part, allowed_mentions=NO_MENTIONS)
            else:  # the first part answers the message
                posted = await self.message.channel.send(
                    part, reference=self.message.to_reference(fail_if_not_exists=False), allowed_mentions=NO_MENTIONS)
        except discord.Forbidden:
            log.warning("cannot post in channel %s: Muninn lacks the Send Messages permission there",
                        self.message.channel.id)
            self.blocked = True
            return False
        self.posted.append(posted)
        self.shown.append(part)
        return True

    async def _edit(self, index: int, part: str) -> None:
        try:
            self.posted[index] = await self.posted[index].edit(content=part, allowed_mentions=NO_MENTIONS)
            self.shown[index] = part
        except discord.NotFound:
            log.info("a streamed reply was deleted while it was written")
        except discord.HTTPException as exc:
            log.warning("could not edit a streamed reply: %s", exc)
