"""Conversation on Discord: decide when Muninn answers, and keep the channel history current.

Muninn answers every DM; in a server channel, as the place's answer mode says (cogs/places.py,
bot/conversation/overrides.py): when it is mentioned or replied to (`mentions`), every message
(`every`) or never. It never answers a bot or a webhook (itself included), nor anyone the access
lists keep out (bot/conversation/access.py), and keeps nothing of them. Every other message is
recorded, as context for later, when Muninn reads every message (the Message Content intent).
"""
from __future__ import annotations

import logging
from contextlib import asynccontextmanager
from typing import AsyncIterator

import discord
from discord.ext import commands

from bot.conversation.outlets import ForgetOffer, Sent
from bot.conversation.overrides import EVERY, NEVER, Tuning
from bot.conversation.pipeline import Incoming, Pipeline
from bot.conversation.replies import Quoted
from bot.conversation.text import split_message
from bot.logs import Throttle

from . import places, threads
from .confirm import ConfirmForget, ForgetButton, offer_text
from .streaming import DiscordReplyStream

log = logging.getLogger(__name__)

CONVERSATION_TYPES = (discord.MessageType.default, discord.MessageType.reply)
NO_MENTIONS = discord.AllowedMentions.none()
BUSY = "⏳"  # on a message past the queue limit: seen, not answered
SLOW_DOWN = "🐢"  # on a message of someone over their share of answers (MUNINN_RATE_PER_MINUTE): seen, not answered


def is_private_channel(channel, guild_id: int | None, guild: discord.Guild | None) -> bool:
    """True when not everyone in the guild can read this channel (a private channel or thread):
    personal facts learned there then stay there (and in DMs), not the whole server. When it
    cannot be told (uncached guild, roles or parent channel), the answer is private: that
    only narrows where a memory surfaces."""
    if guild_id is None:
        return False  # a DM
    if guild is None or channel is None or getattr(channel, "type", None) == discord.ChannelType.private_thread:
        return True
    try:
        return not channel.permissions_for(guild.default_role).read_messages
    except Exception:
        return True


def is_moderator(message: discord.Message) -> bool:
    """Whether the author may moderate the channel: Manage Messages there (the server's owner and
    administrators have every permission). False in a DM, and when it cannot be told (an author
    not cached as a member): what they teach the room then waits for a moderator."""
    if message.guild is None or not isinstance(message.author, discord.Member):
        return False
    try:
        return message.channel.permissions_for(message.author).manage_messages
    except Exception:
        return False


def guild_of(payload: discord.RawMessageUpdateEvent) -> int | None:
    """The edited message's guild id, also when the guild is not cached (payload.guild_id is None
    then, as for a DM: the channel must not pass for one everybody can read)."""
    raw = payload.data.get("guild_id")
    return int(raw) if raw is not None else payload.guild_id


def mentioned_people(message: discord.Message) -> tuple[tuple[str, int], ...]:
    """Everyone the message mentions, as (display name, user id): its `<@id>` mentions, which the
    text shows as "@display name" (clean_content resolves them the same way), and the author of
    the message it replies to. Bots (Muninn included) are not people to protect."""
    people: dict[int, str] = {}
    for user_id in message.raw_mentions:
        member = (message.guild.get_member(user_id) if message.guild else None) or discord.utils.get(
            message.mentions, id=user_id)
        if member is not None and not member.bot:
            people[member.id] = member.display_name
    for user in message.mentions:
        if not user.bot:
            people.setdefault(user.id, user.display_name)
    return tuple((name, user_id) for user_id, name in people.items())


def replied_to(message: discord.Message) -> int | None:
    """The id of the message of the same channel this one replies to (a forward or a message of
    another channel is not followed), or None."""
    reference = message.reference
    if (reference is None or reference.message_id is None or reference.type != discord.MessageReferenceType.reply
            or reference.channel_id != message.channel.id):
        return None
    return reference.message_id


def to_incoming(message: discord.Message, tuning: Tuning | None = None) -> Incoming:
    """The pipeline's view of a Discord message: author, text (mentions shown as "@name"), the
    people it mentions by id, time, whether the channel is private, and a line for the prompt
    saying where the conversation takes place."""
    author = message.author.display_name
    if message.guild is None:
        place = f"You are in a private direct message with {author} on Discord."
    else:
        channel = getattr(message.channel, "name", "a channel")
        place = (f"You are in the channel #{channel} of the Discord server {message.guild.name}; "
                 "several people may be talking.")
    return Incoming(channel_id=message.channel.id, guild_id=message.guild.id if message.guild else None,
                    author_id=message.author.id, author_name=author, content=message.clean_content,
                    created_at=message.created_at.timestamp(), message_id=message.id,
                    dm=message.guild is None, place=place, mentions=mentioned_people(message),
                    moderator=is_moderator(message), tuning=tuning, reply_to=replied_to(message),
                    private=is_private_channel(message.channel, message.guild.id if message.guild else None, message.guild))


class DiscordOutlet:
    """Replies to one message: typing while Muninn thinks, then the answer in 2,000-character
    parts (streamed, see cogs/streaming.py); a ⏳ reaction when it will not be answered (🐢 when its
    author is over their share of answers)."""

    def __init__(self, message: discord.Message):
        self.message = message

    @asynccontextmanager
    async def typing(self) -> AsyncIterator[None]:
        """Show Discord's typing indicator during the block; when it cannot be shown, the block runs all the same."""
        indicator = self.message.channel.typing()
        try:
            await indicator.__aenter__()
        except discord.HTTPException:  # no typing is no reason to stay silent
            yield
            return
        try:
            yield
        finally:
            await indicator.__aexit__(None, None, None)

    async def send(self, text: str) -> list[Sent]:
        """Post `text` in 2,000-character parts, the first as a reply to the message, mentioning
        nobody; returns the parts posted, which stop at the first one Muninn may not post."""
        sent: list[Sent] = []
        reference = self.message.to_reference(fail_if_not_exists=False)
        for part in split_message(text):
            try:
                if reference is not None and not sent:  # the first part answers the message
                    posted = await self.message.channel.send(part, reference=reference, allowed_mentions=NO_MENTIONS)
                else:
                    posted = await self.message.channel.send(part, allowed_mentions=NO_MENTIONS)
            except discord.Forbidden:
                log.warning("cannot post in channel %s: Muninn lacks the Send Messages permission there",
                            self.message.channel.id)
                break
            sent.append(Sent(posted.id, posted.created_at.timestamp()))
        return sent

    async def quoted(self, message_id: int) -> Quoted | None:
        """A message of this channel (the one answered replies to, or one further up its chain), as
        Discord delivered it with the reply or, when it did not, as the channel holds it; None when it
        is gone, or Muninn may not read the channel's history (Read Message History)."""
        found = self.message.reference.resolved if self.message.reference is not None else None
        if not isinstance(found, discord.Message) or found.id != message_id:
            try:
                found = await self.message.channel.fetch_message(message_id)
            except discord.NotFound:
                return None
            except discord.Forbidden:
                log.warning("cannot read the message a reply points at in channel %s: Muninn lacks the Read "
                            "Message History permission there", self.message.channel.id)
                return None
        if found.channel.id != self.message.channel.id:
            return None
        return Quoted(id=found.id, author_id=found.author.id, author_name=found.author.display_name,
                      content=found.clean_content, created_at=found.created_at.timestamp(),
                      refers_to=replied_to(found))

    def stream(self) -> DiscordReplyStream:
        """A DiscordReplyStream answering this message."""
        return DiscordReplyStream(self.message)

    async def busy(self) -> None:
        """React with ⏳: the message was seen, but its channel's queue is full and it will not be answered."""
        await self.message.add_reaction(BUSY)

    async def slow_down(self) -> None:
        """React with 🐢: the message was seen, but its author is over their share of answers and it will not be answered."""
        await self.message.add_reaction(SLOW_DOWN)

    async def confirm_forget(self, offer: ForgetOffer) -> list[Sent]:
        """Post the forget question with its buttons, as a reply to the
        message; returns it as sent ([] when Muninn may not post here)."""
        view = ConfirmForget(offer)
        try:
            view.posted(await self.message.channel.send(
                offer_text(offer), view=view, reference=self.message.to_reference(fail_if_not_exists=False),
                allowed_mentions=NO_MENTIONS))
        except discord.Forbidden:
            view.stop()
            log.warning("cannot post in channel %s: Muninn lacks the Send Messages permission there",
                        self.message.channel.id)
            return []
        assert view.message is not None
        return [Sent(view.message.id, view.message.created_at.timestamp())]


class Chat(commands.Cog):
    """Conversation on Discord: answers the messages Muninn should answer (`should_answer`),
    records the others, and follows edits and deletions into the history."""
    def __init__(self, bot: commands.Bot):
        self.bot = bot
        self._throttle = Throttle()  # one log line a minute for a failure that repeats per message

    async def cog_load(self) -> None:
        """Register the forget buttons, so that questions asked before a restart still answer."""
        self.bot.add_dynamic_items(ForgetButton)  # forget questions asked before a restart still answer

    async def cog_unload(self) -> None:
        """Unregister the forget buttons."""
        self.bot.remove_dynamic_items(ForgetButton)

    @property
    def pipeline(self) -> Pipeline:
        """The bot's conversation pipeline."""
        return self.bot.pipeline  # type: ignore[attr-defined]

    @commands.Cog.listener()
    async def on_message(self, message: discord.Message) -> None:
        """Answer or record a person's message (bots', webhooks', system and empty messages, and
        those the access lists keep out, are ignored); either way it is then settled in the
        channel's arrivals."""
        if message.author.bot or message.webhook_id or message.type not in CONVERSATION_TYPES \
                or not message.content.strip():
            return
        self.pipeline.arrivals.arrived(message.channel.id, message.id)  # before any await
        try:
            try:
                look = await places.look(self.bot, message)
            except Exception as exc:  # a busy or damaged database: who may be kept cannot be told
                if self._throttle.ready("look"):
                    log.error("could not read the settings and access lists of channel %s (%s: %s); messages there "
                              "are neither answered nor kept until the database answers", message.channel.id,
                              type(exc).__name__, exc)
                return
            if not look.verdict:
                log.debug("message %s neither answered nor kept: %s", message.id, look.verdict.reason)
                return
            incoming = to_incoming(message, look.tuning)
            if await self.should_answer(message, look.tuning):
                if opened := await threads.open_thread(self.bot, message, look.tuning):
                    # answered in the thread it opened (cogs/threads.py): out of the channel's order
                    self.pipeline.arrivals.settled(message.channel.id, message.id)
                    in_thread, tuning = opened
                    await self.pipeline.respond(to_incoming(in_thread, tuning), DiscordOutlet(in_thread))
                else:
                    await self.pipeline.respond(incoming, DiscordOutlet(message))
            elif look.tuning.reads_everything:
                await self.pipeline.record(incoming)
        finally:
            self.pipeline.arrivals.settled(message.channel.id, message.id)

    async def should_answer(self, message: discord.Message, tuning: Tuning) -> bool:
        """Whether Muninn answers: every DM; in a server, by the place's answer mode: `every`
        message, `never`, or (`mentions`) when Muninn or its role is mentioned or the message
        replies to one of Muninn's."""
        if message.guild is None:
            return True
        if tuning.answer == NEVER:
            return False
        me = self.bot.user
        assert me is not None
        if any(user.id == me.id for user in message.mentions):
            return True
        own_role = message.guild.self_role  # people often pick the bot's role instead of the bot
        if own_role is not None and own_role in message.role_mentions:
            return True
        reference = message.reference
        if reference is not None and reference.message_id is not None:
            replied_to = reference.resolved
            if isinstance(replied_to, discord.Message):
                if replied_to.author.id == me.id:
                    return True
            elif await self.pipeline.is_own_message(reference.message_id):
                return True
        return tuning.answer == EVERY

    @commands.Cog.listener()
    async def on_raw_message_edit(self, payload: discord.RawMessageUpdateEvent) -> None:
        """A person edited a message: the history and what was learned from
        it follow (pins, link previews and bots' messages are ignored)."""
        message = payload.message
        # Pins, link previews and new threads also send updates: only an edit carries edited_at.
        if "content" not in payload.data or message.author.bot or message.edited_at is None:
            return
        look = await places.look(self.bot, message, guild_of(payload))
        if not look.verdict:
            return  # nothing of theirs is kept, so nothing to follow
        await self.pipeline.edited(payload.message_id, message.clean_content, message.edited_at.timestamp(),
                                   private=is_private_channel(message.channel, guild_of(payload), message.guild),
                                   mentions=mentioned_people(message), moderator=is_moderator(message),
                                   learning=look.tuning.learning)

    @commands.Cog.listener()
    async def on_raw_message_delete(self, payload: discord.RawMessageDeleteEvent) -> None:
        """A message was deleted: the pipeline takes back what was learned from it alone."""
        await self.pipeline.deleted([payload.message_id])

    @commands.Cog.listener()
    async def on_raw_bulk_message_delete(self, payload: discord.RawBulkMessageDeleteEvent) -> None:
        """Messages were deleted at once: as on_raw_message_delete, for all of them."""
        await self.pipeline.deleted(list(payload.message_ids))


async def setup(bot: commands.Bot) -> None:
    """The extension's entry point: add the Chat cog."""
    await bot.add_cog(Chat(bot))
