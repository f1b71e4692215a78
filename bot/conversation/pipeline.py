"""The conversation pipeline, shared by the Discord cogs and `muninn chat`.

For each message that Muninn answers: record it in the channel history, recall what
the author may see here (`engine.recall`), assemble the prompt, ask Ollama, hand the
reply to an `Outlet` (a Discord channel, a terminal), record the reply, and only
then give the exchange to the fact extractor, so extraction never delays an answer.

Messages of one channel are answered one at a time, in order (an asyncio.Lock per
channel, whose waiters are served first come, first served); different channels run
side by side, each holding at most one Ollama request, and the client's semaphore
bounds how many run at once. A flood in one channel therefore queues behind itself
only, and past `reply_queue_limit` waiting messages it is recorded but not answered. One
person gets a fair share of answers (bot/conversation/rate.py): past MUNINN_RATE_PER_MINUTE
their messages are recorded, not answered, and cost no call to the model.
When Ollama cannot answer (down, too slow, model missing) the person gets a short
"can't think right now" reply and the log says what to fix; when recall or the history
fails (a busy or damaged database), the answer goes on without them.

Forgetting a person (`forget_person`, /memory forget-all) also wins against work that
was already under way for them: a message received before it is answered, but neither
it nor the reply is kept, nor handed to the extractor.

Outlets may offer more than `send`, declared by a protocol each, and the pipeline uses what they offer:
- `stream()` (StreamingOutlet): the reply is shown as Ollama writes it (MUNINN_STREAM_REPLIES), with the
  reasoning of reasoning models held back; what stays posted equals the non-streamed reply;
- `busy()` (BusyOutlet): a visible sign for a message past the queue limit (never silence);
- `slow_down()` (SlowDownOutlet): a quiet sign, once a minute at most, for a person over their share;
- `confirm_forget(offer)` (ConfirmingOutlet): "forget that I live in Oslo" in plain words
  (bot/conversation/forget_intent.py) shows the person's matching memories and forgets them
  on confirmation; such a request is neither answered by the model nor kept.
- `quoted(id)` (QuotingOutlet): the older message a reply points at, and its chain (replies.py).
The place's settings (`Incoming.tuning`, bot/conversation/overrides.py) add to the persona, hint
the language, size the history in the prompt and say whether facts are learned there.
A person who paused Muninn's memory (/memory pause) is answered, but nothing of theirs is
kept or extracted, and Muninn says so once. `stop_accepting` and `wait_idle` let a graceful
shutdown finish the replies in flight.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from dataclasses import dataclass, field
from typing import Awaitable, TypeVar

from bot.conversation import forget_intent, prompt, replies
from bot.conversation.arrivals import Arrivals
from bot.conversation.claims import claims
from bot.conversation.exchange import Exchange, ExchangeSink
from bot.conversation.outlets import (
    DISCORD_COMMANDS,
    BusyOutlet,
    ConfirmingOutlet,
    ForgetOffer,
    Outlet,
    Sent,
    SlowDownOutlet,
    StreamingOutlet,
    command_names,
)
from bot.conversation.overrides import Tuning, default
from bot.conversation.rate import MemberRate
from bot.conversation.thinking import Thinking
from bot.conversation.turns import ChannelTurns
from bot.conversation.watch import Watch
from bot.logs import Throttle
from bot.memory.engine import Engine
from bot.memory.messages import Edit, Forgotten, HistoryMessage, storable_text
from bot.memory.scope import Viewer

log = logging.getLogger(__name__)
T = TypeVar("T")
D = TypeVar("D")

# The notices name the commands of the place the person talks in (outlets.command_names).
PAUSED = ("(Your memory with me is paused: I answer, but I keep nothing of what you say. "
          "`{resume}` turns it back on.)")
FORGET_ALL = ("To forget everything I remember about you, use `{forget_all}`: it asks once "
              "more, then deletes your memories and your messages in my history.")
PAUSED_NOTE = PAUSED.format(resume=DISCORD_COMMANDS.resume)
LOG_EVERY_SECONDS = 60.0
PRUNE_EVERY = 25  # history inserts per channel between two prunes to MUNINN_HISTORY_KEEP


@dataclass(frozen=True)
class Incoming:
    """A message someone wrote, wherever it came from."""
    channel_id: int
    guild_id: int | None       # None = a DM
    author_id: int
    author_name: str
    content: str
    created_at: float          # unix seconds
    message_id: int | None = None  # None: allocate a local id (`muninn chat`)
    dm: bool = False
    place: str = ""            # one line for the model: where this conversation happens
    private: bool = False      # a guild channel not everyone in the guild can read
    # Everyone the message mentions, as (display name, user id); the content names them "@name"
    mentions: tuple[tuple[str, int], ...] = ()
    moderator: bool = False    # the author may moderate the channel (exchange.Exchange.moderator)
    tuning: Tuning | None = None  # the settings of the place (overrides.py); None: the .env's
    reply_to: int | None = None  # the message of this channel it replies to (replies.py brings it in)

    @property
    def viewer(self) -> Viewer:
        """Who is asking, for recall's scope rule: the author in this DM, or in this channel of its guild."""
        if self.dm:
            return Viewer(user_id=self.author_id, channel_id=self.channel_id, dm=True)
        return Viewer(user_id=self.author_id, channel_id=self.channel_id, guild_id=self.guild_id)


@dataclass
class Reply:
    """What `respond` did with a message: the reply's text, whether the model gave it, the messages posted,
    and the prompt it was built from (None for a plain-words forget request, which the model never sees)."""
    text: str
    ok: bool                         # False: the "can't think right now" fallback
    sent: list[Sent] = field(default_factory=list)
    prompt: prompt.Prompt | None = None


class Pipeline:
    """Answers and records messages for one engine (the module docstring says how).
    `extractor` receives the exchanges to learn from (None: nothing is extracted);
    `assistant_id` and `assistant_name` are Muninn's own in the history."""
    def __init__(self, engine: Engine, extractor: ExchangeSink | None = None, *,
                 assistant_id: int = 0, assistant_name: str = "Muninn"):
        self.engine = engine
        self.settings = engine.settings
        self.extractor = extractor
        self.assistant_id = assistant_id      # Muninn's own user id, for its rows in the history
        self.assistant_name = assistant_name
        self._turns = ChannelTurns()
        self.rate = MemberRate(self.settings.rate_per_minute, self.settings.rate_burst)  # answers per person
        self.arrivals = Arrivals()                  # history in arrival order (arrivals.py)
        self._throttle = Throttle()
        self._thinking = Thinking(engine.ollama, self.settings, self._log)
        self._forgotten_at: dict[int, float] = {}  # user id -> time.monotonic() of their forget-all
        self._inserts: dict[int, int] = {}          # channel id -> history inserts since start
        self.accepting = True                      # False once a shutdown began
        self._active = 0                            # respond() calls in progress
        self._idle = asyncio.Event()
        self._idle.set()
        self.watch = Watch()                        # the bot's metrics replace it (bot/metrics.py)

    # -- shutdown --------------------------------------------------------------

    def stop_accepting(self) -> None:
        """From now on messages are neither answered nor recorded (the bot is stopping)."""
        self.accepting = False

    @property
    def replies_in_flight(self) -> int:
        """How many `respond` calls are in progress (a graceful shutdown waits for them: `wait_idle`)."""
        return self._active

    async def wait_idle(self, timeout: float) -> bool:
        """Wait until no reply is in progress; False if some still were after `timeout` s."""
        try:
            await asyncio.wait_for(self._idle.wait(), max(0.0, timeout))
            return True
        except asyncio.TimeoutError:
            return False

    # -- history only ----------------------------------------------------------

    async def record(self, incoming: Incoming) -> int | None:
        """Keep a message Muninn does not answer, as context for later answers."""
        if not self.accepting or await self.engine.memory_paused(incoming.author_id):
            return None
        received = time.monotonic()
        incoming = storable(incoming)
        try:
            message_id = await self._record(self._user_row(incoming))
        finally:
            self.arrivals.settled(incoming.channel_id, incoming.message_id)
        if message_id is not None and self._forgotten_since(incoming.author_id, received):
            await self._drop_forgotten([message_id])
            return None
        return message_id

    async def edited(self, message_id: int, content: str, edited_at: float | None = None, *,
                     private: bool = False, mentions: tuple[tuple[str, int], ...] = (),
                     moderator: bool = False, learning: bool = True) -> bool:
        """A person edited a message: the history keeps the new text, and the old words go as a
        deleted message's do (what was learned from them alone is taken back, and if they still
        wait for extraction they never are; the next maintenance scrubs them from the files).
        New words of a message Muninn answered are extracted as a new message's would be ("I moved
        to Oslo" corrected to "Bergen" teaches Bergen); `private`, `mentions` and `moderator` as for a new
        message (Incoming); `learning` False: the place learns nothing (overrides.py)."""
        received = time.monotonic()
        extractor = self.extractor

        # on the database thread: a fact write of the old words queued behind this edit sees it
        gone = None if extractor is None else (lambda: extractor.mark_gone([message_id]))
        edit = await self.engine.messages.edit(message_id, content, edited_at, self.settings.history_limit,
                                               on_change=gone)
        if edit.taken_back:
            log.info("message %s was edited: %d memories learned from its old words alone were taken back",
                     message_id, len(edit.taken_back))
        if edit.kind is not Edit.SAME_WORDS and extractor is not None:
            extractor.forget_messages([message_id])  # and never extract the old words still waiting
        if edit.message is not None and edit.reply is not None and learning:
            await self._extract_edited(edit.message, edit.reply, edit.before, private, received, mentions, moderator)
        return edit.kind is not Edit.UNKNOWN

    async def _extract_edited(self, message: HistoryMessage, reply: HistoryMessage, before: tuple[HistoryMessage, ...],
                              private: bool, received: float, mentions: tuple[tuple[str, int], ...],
                              moderator: bool = False) -> None:
        if self.extractor is None or await self.engine.memory_paused(message.author_id):
            return
        if self._forgotten_since(message.author_id, received):
            return  # /memory forget-all ran during the edit: its new words are not learned either
        author = Incoming(channel_id=message.channel_id, guild_id=message.guild_id, author_id=message.author_id,
                          author_name=message.author_name, content=message.content, created_at=message.created_at,
                          message_id=message.id, dm=message.guild_id is None, private=private)
        self.extractor.submit(Exchange(
            author_id=message.author_id, author_name=message.author_name, channel_id=message.channel_id,
            guild_id=message.guild_id, dm=author.dm, user_message=message.content, user_message_id=message.id,
            reply=reply.content, reply_message_id=reply.id, created_at=message.created_at,
            participants=participants(list(before), author), private=private, mentions=mentions,
            speakers=speakers(list(before), author), moderator=moderator))

    async def deleted(self, message_ids: list[int], deleted_at: float | None = None) -> int:
        """A person deleted messages: mark them in the history, and take back what Muninn
        learned from them alone (and what it was about to learn), in one transaction."""
        if self.extractor is not None:
            self.extractor.forget_messages(message_ids)
        return await self.engine.messages.delete(message_ids, deleted_at)

    async def is_own_message(self, message_id: int) -> bool:
        """Whether the message is one of Muninn's own replies in the history (False when the history does not hold it)."""
        return await self.engine.messages.is_own(message_id)

    async def forget_person(self, user_id: int) -> Forgotten:
        """Delete a person's personal memories, the room memories they taught, others' memories
        that mention them (with FTS rows, vectors and links) and their messages in the history,
        in one transaction, then scrub the database so no deleted text stays recoverable. Their
        exchanges waiting for extraction are dropped first, and replies still being written for
        them are not kept."""
        self._forgotten_at[user_id] = time.monotonic()
        if self.extractor is not None:
            self.extractor.forget(user_id)
        return await self.engine.messages.forget_person(user_id)

    async def pause(self, user_id: int) -> bool:
        """/memory pause: keep nothing of this person from now on, their messages still waiting
        for extraction included. False when it was already paused."""
        if self.extractor is not None:
            self.extractor.forget(user_id)
        return await self.engine.pause_memory(user_id)

    async def resume(self, user_id: int) -> bool:
        """/memory resume: keep what this person says again; False when their memory was not paused."""
        return await self.engine.resume_memory(user_id)

    async def forget_memories(self, user_id: int, memory_ids: list[int]) -> int:
        """Forget those of the ids that are this person's personal memories, leaving no trace."""
        return await self.engine.forget_personal(user_id, memory_ids)

    def _forgotten_since(self, user_id: int, received: float) -> bool:
        return self._forgotten_at.get(user_id, float("-inf")) >= received

    # -- answering -------------------------------------------------------------

    async def respond(self, incoming: Incoming, outlet: Outlet) -> Reply | None:
        """Answer one message (in its channel's turn). None when the channel's queue is full
        (the outlet shows that it is busy) or the bot is stopping."""
        if not self.accepting:
            return None
        # a plain-words forget request is never held back: it costs no reply, and privacy comes first
        asks_to_forget = isinstance(outlet, ConfirmingOutlet) and forget_intent.detect(incoming.content)
        if not asks_to_forget and not (verdict := self.rate.take(incoming.author_id)).allowed:
            self._log("rate", logging.INFO, "user %s is over MUNINN_RATE_PER_MINUTE; recording their "
                      "messages without answering", incoming.author_id)
            if verdict.notify and isinstance(outlet, SlowDownOutlet):
                await self._sign("slow down", outlet.slow_down())
            self.watch.skipped("rate")
            await self.record(incoming)
            return None
        if self._turns.waiting(incoming.channel_id) >= self.settings.reply_queue_limit:
            self._log("queue", logging.WARNING, "channel %s has %d messages waiting for an answer; "
                      "recording the rest without answering", incoming.channel_id,
                      self._turns.waiting(incoming.channel_id))
            if isinstance(outlet, BusyOutlet):
                await self._sign("busy", outlet.busy())
            self.watch.skipped("queue")
            await self.record(incoming)
            return None
        received = time.monotonic()
        self._active += 1
        self._idle.clear()
        # Queued for its turn now: a later message's answer must not wait for this one (it may
        # hold the turn this one waits for, and would stall WAIT_S); this one is answered next.
        self.arrivals.settled(incoming.channel_id, incoming.message_id)
        try:
            async with self._turns.turn(incoming.channel_id):
                incoming = storable(incoming)
                if isinstance(outlet, ConfirmingOutlet) and (intent := forget_intent.detect(incoming.content)):
                    return await self._offer_to_forget(incoming, intent, outlet)
                reply = await self._answer(incoming, outlet, received)
                self.watch.answered(reply.ok, time.monotonic() - received)
                return reply
        finally:
            self._active -= 1
            if not self._active:
                self._idle.set()

    async def _sign(self, what: str, shown: Awaitable[None]) -> None:
        """Show a quiet sign (busy, slow down) on the outlet; one that cannot be shown is no reason to fail."""
        try:
            await shown
        except Exception as exc:
            self._log(what, logging.WARNING, "could not show the %s sign: %s: %s", what, type(exc).__name__, exc)

    async def _answer(self, incoming: Incoming, outlet: Outlet, received: float) -> Reply:
        paused = await self.engine.memory_paused(incoming.author_id)
        message_id = None if paused else await self._record(self._user_row(incoming))
        current = HistoryMessage(
            id=message_id if message_id is not None else incoming.message_id or 0, channel_id=incoming.channel_id,
            guild_id=incoming.guild_id, author_id=incoming.author_id, author_name=incoming.author_name,
            role="user", content=incoming.content, created_at=incoming.created_at)
        tuning = incoming.tuning or default(self.settings)
        stream = outlet.stream() if self.settings.stream_replies and isinstance(outlet, StreamingOutlet) else None
        async with outlet.typing():
            memories = await self._recall(incoming, touch=not paused)  # paused: not even recall counts
            await self.arrivals.earlier_settled(incoming.channel_id, incoming.message_id)
            recent: list[HistoryMessage] = await self._db_or([], "read the channel history", self.engine.messages.recent(
                incoming.channel_id, tuning.history, before=current))
            recent = await replies.with_chain(self.engine, channel_id=incoming.channel_id, guild_id=incoming.guild_id,
                                              reply_to=incoming.reply_to, recent=recent, outlet=outlet,
                                              assistant_id=self.assistant_id)
            built = prompt.build(persona=tuning.persona(self.settings.persona), tz=self.settings.timezone,
                                 memories=memories, history=recent, current=current,
                                 token_budget=self.settings.token_budget, place=incoming.place)
            text, ok = await self._thinking.reply(built, stream)
        sent = await (outlet.send(text) if stream is None else stream.finish(text))
        reply = Reply(text=text, ok=ok, sent=sent, prompt=built)
        if paused:
            # Nothing of theirs is kept: not the message, not the reply, nothing for extraction.
            if await self.engine.take_pause_notice(incoming.author_id):
                await outlet.send(PAUSED.format(resume=command_names(outlet).resume))
            return reply
        reply_id = None
        # Whose words the reply may repeat: a forget-all of any of them empties it (reply_context).
        heard = list(dict.fromkeys([*(m.author_id for m in recent if m.role == "user"), incoming.author_id]))
        # The fallback is not conversation, and a reply not posted (no permission) was not said:
        # keep both out of the history.
        if ok and sent:
            reply_id = await self._record(dict(
                channel_id=incoming.channel_id, guild_id=incoming.guild_id, author_id=self.assistant_id,
                author_name=self.assistant_name, role="assistant", content=text, created_at=sent[0].created_at,
                message_id=sent[0].message_id, reply_to=message_id, reply_to_author=incoming.author_id,
                context_authors=heard))
        if reply_id is not None and any(self._forgotten_since(author, received)
                                        for author in heard if author != incoming.author_id):
            # Someone in its conversation ran forget-all while it was written: it may repeat their words.
            await self._drop_forgotten([reply_id])
            reply_id = None
        if self._forgotten_since(incoming.author_id, received):
            # /memory forget-all ran while this message waited or was answered: keep none of it.
            # Checked after the last await, so an exchange submitted below came before the forget.
            await self._drop_forgotten([i for i in (message_id, reply_id) if i is not None])
            return reply
        if await self.engine.memory_paused(incoming.author_id):
            return reply  # paused while this was answered: from now on nothing is extracted
        if ok and self.extractor is not None and tuning.learning:
            self.extractor.submit(Exchange(
                author_id=incoming.author_id, author_name=incoming.author_name, channel_id=incoming.channel_id,
                guild_id=incoming.guild_id, dm=incoming.dm, user_message=incoming.content,
                user_message_id=message_id, reply=text, reply_message_id=reply_id,
                recalled=tuple(built.memories), created_at=incoming.created_at,
                participants=participants(recent, incoming), private=incoming.private,
                mentions=incoming.mentions, speakers=speakers(recent, incoming), moderator=incoming.moderator))
        return reply

    async def _offer_to_forget(self, incoming: Incoming, intent: forget_intent.ForgetIntent,
                               outlet: ConfirmingOutlet) -> Reply:
        """A plain-words forget request: find the person's matching personal memories that could
        surface here, and let the outlet ask before forgetting them. Nothing of it is kept."""
        author = incoming.author_id
        if intent.everything:
            text = FORGET_ALL.format(forget_all=command_names(outlet).forget_all)
            return Reply(text=text, ok=True, sent=await outlet.send(text))
        if intent.about is None:  # "don't remember this": their previous message here
            previous = await self.engine.last_message_of(incoming.channel_id, author, before=incoming.message_id)
            ids = [previous] if previous is not None else []
            if ids and self.extractor is not None:
                self.extractor.forget_messages(ids)  # not extracted yet: never will be
            memories = await self.engine.personal_from_messages(author, ids)
            if ids:
                await self.engine.drop_own_message(author, ids[0])
            none_found = ("OK: I dropped your previous message from my history and won't learn from it."
                          if ids else "I have no earlier message of yours here to forget.")
            intro = "From your previous message I had remembered:"
        else:
            result = await self.engine.recall(intent.about, incoming.viewer, touch=False)
            memories = [r.memory for r in result.memories
                        if r.memory.scope == "personal" and r.memory.owner_id == author
                        and _matches(r.candidate.reason(), self.settings)]
            none_found = (f"I found nothing of yours here about “{_clip(intent.about, 80)}”. "
                          f"`{command_names(outlet).list}` shows what I remember about you here.")
            intro = f"About “{_clip(intent.about, 80)}” I remember:"
        if not memories:
            return Reply(text=none_found, ok=True, sent=await outlet.send(none_found))

        async def forget() -> int:
            return await self.forget_memories(author, [m.id for m in memories])
        offer = ForgetOffer(author_id=author, memories=memories, intro=intro, forget=forget,
                            in_private=incoming.dm or incoming.guild_id == 0)
        return Reply(text=intro, ok=True, sent=await outlet.confirm_forget(offer))

    async def _recall(self, incoming: Incoming, *, touch: bool = True) -> list[prompt.Claim]:
        """The memories for the prompt, as attributed claims; none when recall fails (the answer matters more)."""
        try:
            found = await self.engine.recall(incoming.content, incoming.viewer, touch=touch)
            self.watch.recalled(found)
        except Exception as exc:  # apsw.BusyError, a damaged index...: not the person's problem
            self._log("recall", logging.ERROR, "recall failed, answering without memories: %s: %s",
                      type(exc).__name__, exc)
            return []
        chosen = found.relevant()  # none when nothing reaches the relevance floor
        outdated = {r.memory.id: r.candidate.outdated_by for r in chosen if r.candidate.outdated_by}
        return await claims(self.engine, [r.memory for r in chosen], viewer_id=incoming.author_id,
                            viewer_name=incoming.author_name, channel_id=None if incoming.dm else incoming.channel_id,
                            outdated=outdated)

    async def _db_or(self, default: D, what: str, job: Awaitable[T]) -> T | D:
        """The database `job`'s result, or `default` (and one log line a minute) when it fails."""
        try:
            return await job
        except Exception as exc:
            self._log(what, logging.ERROR, "could not %s: %s: %s", what, type(exc).__name__, exc)
            return default

    async def _record(self, row: dict) -> int | None:
        """Store one history row (None if the database refused it), pruning the channel now and
        then to its last MUNINN_HISTORY_KEEP messages."""
        channel_id = row["channel_id"]
        inserts = self._inserts[channel_id] = self._inserts.get(channel_id, 0) + 1
        prune = inserts % PRUNE_EVERY == 1  # the first insert after a start, then every PRUNE_EVERY
        return await self._db_or(None, "record a message", self.engine.messages.record(
            row, keep=self.settings.history_keep if prune else None))

    async def _drop_forgotten(self, message_ids: list[int]) -> None:
        await self._db_or(None, "drop the messages of a forgotten person", self.engine.messages.drop(message_ids))

    @staticmethod
    def _user_row(incoming: Incoming) -> dict:
        return dict(channel_id=incoming.channel_id, guild_id=incoming.guild_id, author_id=incoming.author_id,
                    author_name=incoming.author_name, role="user", content=incoming.content,
                    created_at=incoming.created_at, message_id=incoming.message_id)

    def _log(self, key: str, level: int, message: str, *args) -> None:
        """Log a recurring failure once a minute, not once per message."""
        if self._throttle.ready(key, LOG_EVERY_SECONDS):
            log.log(level, message, *args)


def _matches(reason: dict, settings) -> bool:
    """A recalled memory really about the words: a keyword hit, or a vector neighbour at least as
    close as the lifecycle's "same subject" threshold (a nearest neighbour alone is not enough)."""
    return reason.get("via") != "link" and ("fts_rank" in reason or reason.get("cosine", 0.0) >= settings.update_cosine)


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 1].rstrip() + "…"


def storable(incoming: Incoming) -> Incoming:
    """The message with text SQLite and Ollama accept (no lone surrogates), used everywhere after."""
    return dataclasses.replace(incoming, content=storable_text(incoming.content),
                               author_name=storable_text(incoming.author_name),
                               mentions=tuple((storable_text(name), uid) for name, uid in incoming.mentions))


def participants(recent: list[HistoryMessage], incoming: Incoming) -> tuple[str, ...]:
    """Display names of the people in the conversation (the recent history and the author), so
    extraction can tell a fact about the author from one about someone else who was there."""
    names = [m.author_name for m in recent if m.role == "user"] + [incoming.author_name]
    return tuple(dict.fromkeys(name for name in names if name))


def speakers(recent: list[HistoryMessage], incoming: Incoming) -> tuple[tuple[str, int], ...]:
    """The recent speakers other than the author, as (display name, user id)."""
    return tuple(dict.fromkeys((m.author_name, m.author_id) for m in recent
                               if m.role == "user" and m.author_name and m.author_id != incoming.author_id))
