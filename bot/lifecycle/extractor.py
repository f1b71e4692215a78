"""The background extractor: `submit` returns at once; a worker batches quick consecutive
messages of one channel, extracts per author and stores each author's facts in one
transaction. When Ollama is unavailable, the batch waits for its cooldown to end and is tried
again (a few times in a row at most), so a short outage costs no facts; other failures are
logged in one line and dropped. The conversation never notices."""
from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from typing import Callable, Iterable, Sequence, TypeVar

from bot.conversation.exchange import Exchange
from bot.lifecycle import room_policy
from bot.lifecycle.fact_store import store_facts
from bot.lifecycle.facts import by_author, extract_author_facts, usable
from bot.llm.errors import OllamaUnavailable
from bot.memory.engine import Engine
from bot.memory.errors import explain

log = logging.getLogger(__name__)

MAX_BATCH = 8             # exchanges of one channel in one batch (one LLM call per author in it)
MAX_BACKLOG = 200         # batches waiting; beyond it the oldest are dropped (logged)
MAX_TRIES = 3             # attempts in a row while Ollama is unavailable, each after its cooldown
T = TypeVar("T")

# -- the background extractor ----------------------------------------------------

def _clock() -> float:
    """The event loop's clock (monotonic), also when called outside a running loop."""
    try:
        return asyncio.get_running_loop().time()
    except RuntimeError:
        return time.monotonic()


class Extractor:
    """Runs extraction in the background: `submit` never blocks or raises."""

    def __init__(self, engine: Engine, *, batch_delay: float = 1.5):
        self.engine = engine
        self.batch_delay = batch_delay
        self.max_wait = batch_delay * 4        # a busy channel is still extracted every few seconds
        self._pending: dict[int, list[Exchange]] = {}
        self._first_seen: dict[int, float] = {}
        self._last_seen: dict[int, float] = {}
        self._timers: dict[int, asyncio.Task] = {}
        self._queue: list[list[Exchange]] = []
        self._worker: asyncio.Task | None = None
        self._forgotten: dict[int, float] = {}   # user id -> when forget() was called
        self._gone: dict[int, float] = {}        # message id -> when forget_messages() was called
        self._gone_lock = threading.Lock()       # an edit marks its message gone on the database thread
        self._in_flight: list[float] = []        # when each batch being processed was taken
        self._closed = False
        self.processed = 0       # batches finished (for tests and stats)
        self.failed = 0          # batches whose processing raised (logged)
        self.stored = 0          # memories written (new or reinforced), for what `muninn chat` says at the end
        self.dropped = 0         # messages `close` gave up on (its timeout ran out)
        self._tries = 0          # failed attempts in a row while Ollama is unavailable
        self._current: list[Exchange] | None = None   # the batch the worker is on

    @property
    def enabled(self) -> bool:
        """Whether submitted exchanges are extracted: MUNINN_EXTRACTION is
        on and an Ollama URL is set (else `submit` drops them)."""
        return bool(self.engine.settings.extraction) and self.engine.ollama.enabled

    def submit(self, exchange: Exchange) -> None:
        """Queue an exchange for extraction; returns immediately."""
        try:
            if self._closed or not self.enabled:
                return
            loop = asyncio.get_running_loop()
            channel = exchange.channel_id
            now = loop.time()
            self._pending.setdefault(channel, []).append(exchange)
            self._first_seen.setdefault(channel, now)
            self._last_seen[channel] = now
            if len(self._pending[channel]) >= MAX_BATCH:
                self._flush(channel)
            elif channel not in self._timers:
                self._timers[channel] = loop.create_task(self._debounce(channel))
        except Exception:  # the conversation must never notice
            log.exception("could not queue an exchange for fact extraction")

    def forget(self, user_id: int) -> None:
        """A person asked to be forgotten: drop their waiting messages, and make a batch already
        being processed store nothing of theirs (checked again on the database thread right
        before each write). Call it before deleting their memories."""
        self._forgotten[user_id] = _clock()
        self._drop_waiting(lambda exchange: exchange.author_id == user_id)

    def forget_messages(self, message_ids: Iterable[int]) -> None:
        """Messages were deleted (or their words edited) before their facts were stored: never
        extract them, and make a batch already extracting them store nothing of them (as
        `forget` does for a person). An edit's new words, submitted after this, are extracted."""
        gone = set(message_ids)
        self.mark_gone(gone)
        self._drop_waiting(lambda exchange: exchange.user_message_id in gone)

    def mark_gone(self, message_ids: Iterable[int]) -> None:
        """Make a batch already extracting these messages store nothing of them. Safe on the
        database thread: an edit calls it inside its own write job, so a fact write queued behind
        that job already sees the mark (called after the job returned, it would not)."""
        if self._in_flight:  # only a running batch needs to know; pruned like `_forgotten`
            now = _clock()
            with self._gone_lock:
                self._gone.update((message_id, now) for message_id in message_ids)

    def _drop_waiting(self, unwanted: Callable[[Exchange], bool]) -> None:
        for channel in list(self._pending):
            kept = [e for e in self._pending[channel] if not unwanted(e)]
            if kept:
                self._pending[channel] = kept
            else:
                self._drop_pending(channel)
        self._queue = [kept for kept in ([e for e in batch if not unwanted(e)] for batch in self._queue) if kept]

    def _forgotten_since(self, user_id: int | None, taken_at: float) -> bool:
        at = self._forgotten.get(user_id) if user_id is not None else None
        return at is not None and at >= taken_at

    def _gone_since(self, exchange: Exchange, taken_at: float) -> bool:
        at = self._gone.get(exchange.user_message_id) if exchange.user_message_id is not None else None
        return at is not None and at >= taken_at

    async def _debounce(self, channel: int) -> None:
        """Wait until the channel is quiet for batch_delay (at most max_wait), then flush."""
        loop = asyncio.get_running_loop()
        try:
            while channel in self._pending:
                quiet_at = self._last_seen[channel] + self.batch_delay
                latest = self._first_seen[channel] + self.max_wait
                wait = min(quiet_at, latest) - loop.time()
                if wait <= 0:
                    break
                await asyncio.sleep(wait)
        finally:
            if self._timers.get(channel) is asyncio.current_task():
                del self._timers[channel]
        self._flush(channel)

    def _drop_pending(self, channel: int) -> list[Exchange] | None:
        batch = self._pending.pop(channel, None)
        self._first_seen.pop(channel, None)
        self._last_seen.pop(channel, None)
        timer = self._timers.pop(channel, None)
        if timer is not None and timer is not asyncio.current_task():
            timer.cancel()
        return batch

    def _flush(self, channel: int) -> None:
        batch = self._drop_pending(channel)
        if not batch:
            return
        if len(self._queue) >= MAX_BACKLOG:
            dropped = self._queue.pop(0)
            log.warning("fact extraction is %d batches behind; dropped %d old messages of channel %s",
                        MAX_BACKLOG, len(dropped), dropped[0].channel_id)
        self._queue.append(batch)
        self._ensure_worker()

    def _ensure_worker(self) -> None:
        # The worker ends when the queue is empty (an idle task would look like unfinished work
        # to test harnesses and keeps nothing useful); a new batch starts a new one.
        if self._worker is None or self._worker.done():
            self._worker = asyncio.get_running_loop().create_task(self._work())

    async def _work(self) -> None:
        while self._queue:
            batch = self._queue.pop(0)
            self._current = batch
            try:
                await self.process(batch, taken_at=_clock())
                self.processed += 1
                self._tries = 0
            except asyncio.CancelledError:
                raise
            except Deferred as deferred:
                self._current = None  # back in the queue: `waiting` counts it
                await self._again_later(deferred)
            except Exception as exc:
                self.failed += 1
                cause = explain(exc)
                if cause is not None:  # the database's fault (locked, full, damaged): one line says which
                    log.error("fact extraction failed for %d messages in channel %s; their facts are NOT "
                              "stored: %s", len(batch), batch[0].channel_id, cause)
                else:
                    log.exception("fact extraction failed for %d messages in channel %s; they are skipped",
                                  len(batch), batch[0].channel_id)
            finally:
                self._current = None

    async def _again_later(self, deferred: "Deferred") -> None:
        """Ollama was unavailable: put what is left of the batch back at the head of the queue
        (where a forget still reaches it) and wait out the cooldown; after MAX_TRIES in a row, drop it."""
        self._tries += 1
        if self._tries >= MAX_TRIES:
            self._tries = 0
            self.failed += 1
            log.error("fact extraction failed %d times in a row for %d messages in channel %s; their facts are "
                      "NOT stored: %s", MAX_TRIES, len(deferred.left), deferred.left[0].channel_id, deferred.cause)
            return
        log.log(logging.WARNING if self._tries == 1 else logging.INFO,
                "fact extraction of %d messages waits for Ollama (%s); trying again in %g s",
                len(deferred.left), deferred.cause, self.retry_delay)
        self._queue.insert(0, list(deferred.left))
        await asyncio.sleep(self.retry_delay)

    @property
    def retry_delay(self) -> float:
        """How long a batch waits after Ollama was unavailable: until its cooldown for background work ends."""
        return self.engine.settings.ollama_cooldown + 0.1

    async def process(self, batch: Sequence[Exchange], *, taken_at: float | None = None) -> list[int]:
        """Extract and store the facts of one channel's batch, author by author (one LLM call
        and one transaction each); returns the memory ids. Nothing is stored for an author
        forgotten after `taken_at` (default: now). Deferred when Ollama was unavailable: it
        holds the messages of the authors not done yet."""
        taken_at = _clock() if taken_at is None else taken_at
        self._in_flight.append(taken_at)
        try:
            batch = usable(batch)
            ids: list[int] = []
            authors = list(by_author(batch).items())
            for done, (author_id, own) in enumerate(authors):
                own = [e for e in own if not self._gone_since(e, taken_at)]
                if not own or self._forgotten_since(author_id, taken_at):
                    continue
                try:
                    extracted = await extract_author_facts(self.engine, own, batch)
                except OllamaUnavailable as exc:
                    self.stored += len(ids)
                    raise Deferred([e for _, rest in authors[done:] for e in rest], exc) from None
                facts = await room_policy.apply(self.engine, extracted, own)
                if self._forgotten_since(author_id, taken_at):
                    continue
                if self._resubmit_if_gone(own, taken_at):
                    continue

                refused: list[bool] = []

                def keep(author_id: int = author_id, own: list[Exchange] = own,
                         refused: list[bool] = refused) -> bool:  # on the database thread
                    if any(self._gone_since(e, taken_at) for e in own):
                        refused.append(True)
                        return False
                    return not self._forgotten_since(author_id, taken_at)
                ids += await store_facts(self.engine, facts, own, keep=keep)
                if refused:  # a message went right before the write: the rest is extracted again
                    self._resubmit_if_gone(own, taken_at)
            self.stored += len(ids)
            return ids
        finally:
            self._in_flight.remove(taken_at)
            oldest = min(self._in_flight, default=math.inf)
            self._forgotten = {uid: at for uid, at in self._forgotten.items() if at >= oldest}
            with self._gone_lock:
                self._gone = {message_id: at for message_id, at in self._gone.items() if at >= oldest}

    def _resubmit_if_gone(self, own: list[Exchange], taken_at: float) -> bool:
        """Some of these messages went while their facts were extracted: the facts (each drawn
        from all of them) are not stored, and the messages still there are extracted again."""
        if not any(self._gone_since(e, taken_at) for e in own):
            return False
        for exchange in own:
            if not self._gone_since(exchange, taken_at):
                self.submit(exchange)
        return True

    async def drain(self) -> None:
        """Flush every waiting batch now and wait until all work is done."""
        while True:
            for channel in list(self._pending):
                self._flush(channel)
            worker = self._worker
            if worker is None or worker.done():
                if not self._queue:
                    return
                self._ensure_worker()
                continue
            await asyncio.wait([worker])   # never raises, and never cancels the worker

    @property
    def waiting(self) -> int:
        """Exchanges not yet extracted (waiting for their batch, or queued)."""
        return sum(map(len, self._pending.values())) + sum(map(len, self._queue))

    async def close(self, timeout: float | None = None, *, report: bool = True) -> None:
        """Finish queued work (for at most `timeout` seconds, logging what is dropped after
        that unless `report` is False: the caller says it), then stop; later submits are ignored.
        `dropped` then counts the messages given up on."""
        if self._closed:
            return
        try:
            await asyncio.wait_for(self.drain(), timeout)
        except asyncio.TimeoutError:
            self.dropped = self.waiting + len(self._current or ())
            if self.dropped and report:
                log.warning("fact extraction did not finish within %g s; %d waiting messages (and any batch "
                            "being extracted) are dropped", timeout, self.waiting)
        finally:
            self._closed = True
            for timer in list(self._timers.values()):
                timer.cancel()
            if self._worker is not None:
                self._worker.cancel()
                try:
                    await self._worker
                except (asyncio.CancelledError, Exception):
                    pass


class Deferred(Exception):
    """Ollama was unavailable: `left` are the messages whose facts are still to be extracted."""

    def __init__(self, left: list[Exchange], cause: Exception):
        super().__init__(str(cause))
        self.left, self.cause = left, cause
