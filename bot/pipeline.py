"""The conversation pipeline, shared by the Discord cogs and `muninn chat`.

For each message that Muninn answers: record it in the channel history, recall what
the author may see here (`engine.recall`), assemble the prompt, ask Ollama, hand the
reply to an `Outlet` (a Discord channel, a terminal), record the reply, and only
then give the exchange to the fact extractor, so extraction never delays an answer.

Messages of one channel are answered one at a time, in order (an asyncio.Lock per
channel, whose waiters are served first come, first served); different channels run
side by side, each holding at most one Ollama request, and the client's semaphore
bounds how many run at once. A flood in one channel therefore queues behind itself
only, and past `reply_queue_limit` waiting messages it is recorded but not answered.
When Ollama cannot answer (down, too slow, model missing) the person gets a short
"can't think right now" reply and the log says what to fix.
"""
from __future__ import annotations

import asyncio
import logging
import time
from contextlib import asynccontextmanager, nullcontext
from dataclasses import dataclass, field
from typing import AsyncContextManager, AsyncIterator, Protocol

from . import history, prompt, store
from .engine import Engine
from .exchange import Exchange
from .ollama import OllamaDisabled, OllamaError, OllamaModelMissing, OllamaUnavailable
from .scope import Viewer

log = logging.getLogger(__name__)

CANNOT_THINK = ("Sorry, I can't think right now: my language model isn't answering. "
                "Please try again in a little while.")
LOG_EVERY_SECONDS = 60.0


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

    @property
    def viewer(self) -> Viewer:
        if self.dm:
            return Viewer(user_id=self.author_id, channel_id=self.channel_id, dm=True)
        return Viewer(user_id=self.author_id, channel_id=self.channel_id, guild_id=self.guild_id)


@dataclass(frozen=True)
class Sent:
    """One message the outlet posted; id None when the outlet has no ids (a terminal)."""
    message_id: int | None
    created_at: float


class Outlet(Protocol):
    """Where a reply goes: shows that Muninn is working, then posts the reply."""

    def typing(self) -> AsyncContextManager: ...

    async def send(self, text: str) -> list[Sent]: ...


class ExchangeSink(Protocol):
    """The fact extractor, as the pipeline sees it: takes an exchange, never blocks."""

    def submit(self, exchange: Exchange) -> None: ...


@dataclass
class Reply:
    text: str
    ok: bool                         # False: the "can't think right now" fallback
    sent: list[Sent] = field(default_factory=list)
    prompt: prompt.Prompt | None = None


class _ChannelTurns:
    """One turn at a time per channel, in arrival order; channels do not wait for each other."""

    def __init__(self) -> None:
        self._locks: dict[int, asyncio.Lock] = {}
        self._waiting: dict[int, int] = {}

    def waiting(self, channel_id: int) -> int:
        return self._waiting.get(channel_id, 0)

    @asynccontextmanager
    async def turn(self, channel_id: int) -> AsyncIterator[None]:
        lock = self._locks.setdefault(channel_id, asyncio.Lock())
        self._waiting[channel_id] = self._waiting.get(channel_id, 0) + 1
        try:
            async with lock:
                yield
        finally:
            self._waiting[channel_id] -= 1
            if not self._waiting[channel_id]:  # forget idle channels
                del self._waiting[channel_id]
                del self._locks[channel_id]


class Pipeline:
    def __init__(self, engine: Engine, extractor: ExchangeSink | None = None, *,
                 assistant_id: int = 0, assistant_name: str = "Muninn"):
        self.engine = engine
        self.settings = engine.settings
        self.extractor = extractor
        self.assistant_id = assistant_id      # Muninn's own user id, for its rows in the history
        self.assistant_name = assistant_name
        self._turns = _ChannelTurns()
        self._last_log: dict[str, float] = {}

    # -- history only ----------------------------------------------------------

    async def record(self, incoming: Incoming) -> int:
        """Keep a message Muninn does not answer, as context for later answers."""
        return await self.engine.run(self._record_user, incoming)

    async def edited(self, message_id: int, content: str, edited_at: float | None = None) -> bool:
        return await self.engine.run(history.edit, message_id, content, edited_at)

    async def deleted(self, message_ids: list[int], deleted_at: float | None = None) -> int:
        return await self.engine.run(history.delete, list(message_ids), deleted_at)

    async def is_own_message(self, message_id: int) -> bool:
        return await self.engine.run(history.is_assistant_message, message_id)

    async def always_answer(self, channel_id: int) -> bool:
        """An admin's choice for the channel, else the MUNINN_ALWAYS_ANSWER_CHANNELS default."""
        chosen = await self.engine.run(history.always_answer, channel_id)
        return chosen if chosen is not None else channel_id in self.settings.always_answer_channels

    async def set_always_answer(self, channel_id: int, guild_id: int | None, enabled: bool) -> None:
        await self.engine.run(history.set_always_answer, channel_id, guild_id, enabled)

    async def forget_person(self, user_id: int) -> tuple[int, int]:
        """Delete every personal memory of a person (with FTS rows, vectors and links) and their
        messages in the history, in one transaction. Extraction still running for them is waited
        for first, so it cannot store a fact right after. Returns (memories, messages) removed."""
        drain = getattr(self.extractor, "drain", None)
        if drain is not None:
            try:
                await asyncio.wait_for(drain(), timeout=self.settings.chat_timeout + 5)
            except asyncio.TimeoutError:
                log.warning("fact extraction did not finish in time; forgetting user %s anyway", user_id)
        return await self.engine.run(_forget_person, user_id)

    # -- answering -------------------------------------------------------------

    async def respond(self, incoming: Incoming, outlet: Outlet) -> Reply | None:
        """Answer one message (in its channel's turn). None when the channel's queue is full."""
        if self._turns.waiting(incoming.channel_id) >= self.settings.reply_queue_limit:
            self._log_every("queue", logging.WARNING, "channel %s has %d messages waiting for an answer; "
                            "recording the rest without answering", incoming.channel_id,
                            self._turns.waiting(incoming.channel_id))
            await self.record(incoming)
            return None
        async with self._turns.turn(incoming.channel_id):
            return await self._answer(incoming, outlet)

    async def _answer(self, incoming: Incoming, outlet: Outlet) -> Reply:
        message_id = await self.engine.run(self._record_user, incoming)
        current = history.HistoryMessage(
            id=message_id, channel_id=incoming.channel_id, guild_id=incoming.guild_id,
            author_id=incoming.author_id, author_name=incoming.author_name, role="user",
            content=incoming.content, created_at=incoming.created_at)
        async with outlet.typing():
            recalled = await self.engine.recall(incoming.content, incoming.viewer)
            recent = await self.engine.run(history.recent, incoming.channel_id, self.settings.history_limit,
                                           before=current)
            built = prompt.build(persona=self.settings.persona, tz=self.settings.timezone,
                                 memories=recalled.texts, history=recent, current=current,
                                 token_budget=self.settings.token_budget, place=incoming.place)
            text, ok = await self._think(built)
        sent = await outlet.send(text)
        reply = Reply(text=text, ok=ok, sent=sent, prompt=built)
        if not ok:
            return reply  # the fallback is not conversation: keep it out of the history
        reply_id = None
        if sent:  # nothing posted (no permission to write there): nothing was said
            reply_id = await self.engine.run(
                history.record, channel_id=incoming.channel_id, guild_id=incoming.guild_id,
                author_id=self.assistant_id, author_name=self.assistant_name, role="assistant", content=text,
                created_at=sent[0].created_at, message_id=sent[0].message_id)
        if self.extractor is not None:
            self.extractor.submit(Exchange(
                author_id=incoming.author_id, author_name=incoming.author_name, channel_id=incoming.channel_id,
                guild_id=incoming.guild_id, dm=incoming.dm, user_message=incoming.content,
                user_message_id=message_id, reply=text, reply_message_id=reply_id,
                recalled=tuple(built.memories), created_at=incoming.created_at))
        return reply

    async def _think(self, built: prompt.Prompt) -> tuple[str, bool]:
        """The model's reply, or the friendly fallback (and one log line saying what to fix)."""
        try:
            text = (await self.engine.ollama.chat(built.messages)).strip()
        except OllamaModelMissing as exc:
            self._log_every("missing", logging.ERROR, "cannot answer: %s", exc)
            return CANNOT_THINK, False
        except OllamaDisabled:
            self._log_every("disabled", logging.ERROR, "cannot answer: no OLLAMA_URL is configured; set it "
                            "in .env (for example http://localhost:11434)")
            return CANNOT_THINK, False
        except OllamaUnavailable as exc:
            self._log_every("unavailable", logging.WARNING, "cannot answer: %s", exc)
            return CANNOT_THINK, False
        except OllamaError as exc:
            self._log_every("bad", logging.WARNING, "cannot answer: %s", exc)
            return CANNOT_THINK, False
        if not text:
            self._log_every("empty", logging.WARNING, "%s returned an empty reply", self.settings.chat_model)
            return CANNOT_THINK, False
        return text, True

    def _record_user(self, conn, incoming: Incoming) -> int:
        return history.record(conn, channel_id=incoming.channel_id, guild_id=incoming.guild_id,
                              author_id=incoming.author_id, author_name=incoming.author_name, role="user",
                              content=incoming.content, created_at=incoming.created_at,
                              message_id=incoming.message_id)

    def _log_every(self, key: str, level: int, message: str, *args) -> None:
        """Log a recurring failure once a minute, not once per message."""
        now = time.monotonic()
        if now - self._last_log.get(key, -LOG_EVERY_SECONDS) >= LOG_EVERY_SECONDS:
            self._last_log[key] = now
            log.log(level, message, *args)


def _forget_person(conn, user_id: int) -> tuple[int, int]:
    with conn:
        ids = [memory.id for memory in store.personal_memories(conn, user_id)]
        removed = store.delete(conn, ids)
        messages = history.forget_author(conn, user_id)
    return removed, messages


def no_typing() -> AsyncContextManager:
    """For outlets with nothing to show while Muninn thinks."""
    return nullcontext()
