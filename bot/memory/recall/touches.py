"""Recall's touch, shared between concurrent recalls: one writer job and one transaction for all
the recalls waiting to touch, instead of one each.

Every recall ends by touching what it found relevant (a write through the engine's single
writer thread) and loading what it returns. With many recalls in flight each touch was its own
writer job and its own commit, and every commit makes each read connection drop its page
cache before its next statement (the keyword step then reads its pages again, noticeably
slower). Here the first touch starts a drain: one writer job applies every
touch queued by then, in arrival order, in one transaction, then loads all their memories in one
query; touches queued meanwhile go in the next job. Each touch is the same UPDATE with its own
recall's time as before, so last_accessed, access_count and stability end exactly as if each
had been its own transaction in that order; a recall's memories are read after its touch, as
before (and after the others' of the same job, as if those had committed just before).

A touch is bookkeeping: when a batch's transaction fails (the database locked past the busy
timeout, a full disk, one request the database refuses) no recall fails for it. The batch's
touches are tried again one request at a time, so one bad request does not cost the others
their touch (every other memory's decay clock stays exact); a request whose own touch fails
is loaded without it, and one line says so. The retries are bounded: one each, and none
after a failure of the whole database (busy, full, damaged: `bot.memory.errors.explain` knows them),
which would only make every recall wait again for the same answer.
"""
from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Sequence

from bot.memory import records
from bot.memory.errors import explain
from bot.memory.storage import Connection

log = logging.getLogger(__name__)

Batch = list[tuple[list[int], list[int], float]]  # (touched, ids to load, time) per recall


@dataclass
class TouchRequest:
    """One recall waiting on the batcher: what it touches, what it loads, its time, and its answer."""
    touched: list[int]  # counted as recalled
    ids: list[int]      # to load (the recall's result)
    now: float
    done: asyncio.Future = field(repr=False)


def touch_and_load_all(conn: Connection, storage: Any, requests: Sequence[tuple[list[int], list[int], float]],
                       growth: float) -> list[dict[int, records.Memory]]:
    """On the writer: every request's touch (in order) in one transaction, then all their
    memories in one read."""
    touches = [(touched, now) for touched, _, now in requests if touched]
    wanted = list(dict.fromkeys(memory_id for _, ids, _ in requests for memory_id in ids))
    # a backend may touch and load in one statement (PostgreSQL, one recall's touch: a round trip less)
    together = getattr(storage, "touch_and_load", None)
    loaded = together(conn, touches, wanted, growth=growth) if together is not None and touches else None
    if loaded is None:
        if touches:  # a write transaction: never taken (and waited for) when nothing was recalled
            storage.touch_many(conn, touches, growth=growth)
        loaded = storage.get_many(conn, wanted)
    return [{memory_id: loaded[memory_id] for memory_id in ids if memory_id in loaded} for _, ids, _ in requests]


class TouchBatcher:
    """Queues recalls' touches; `run(requests)` applies a batch on the writer (touch_and_load_all),
    `load(ids)` reads memories without touching them (a recall whose touch failed)."""

    def __init__(self, run: Callable[[Batch], Awaitable[list[dict[int, records.Memory]]]],
                 load: Callable[[list[int]], Awaitable[dict[int, records.Memory]]]) -> None:
        self._run = run
        self._load = load
        self._waiting: list[TouchRequest] = []
        self._drain_task: asyncio.Task | None = None
        self.jobs = 0  # writer jobs run (for tests and benchmarks: how much was shared)

    async def touch_and_load(self, touched: list[int], ids: list[int], now: float) -> dict[int, records.Memory]:
        """Queue one recall's touch and load; returns those of `ids` found, by id (loaded untouched
        when the touch failed). A cancelled caller stops waiting; its touch is applied all the same."""
        request = TouchRequest(touched, ids, now, asyncio.get_running_loop().create_future())
        self._waiting.append(request)
        if self._drain_task is None:
            self._drain_task = asyncio.create_task(self._drain())
        # A cancelled recall cancels only its wait: its touch is applied all the same, as when it
        # was a writer job of its own.
        return await request.done

    async def _drain(self) -> None:
        batch: list[TouchRequest] = []
        try:
            while self._waiting:
                batch, self._waiting = self._waiting, []
                self.jobs += 1
                try:
                    loaded = await self._run([(r.touched, r.ids, r.now) for r in batch])
                except Exception as exc:
                    await self._one_at_a_time(batch, exc)
                    continue
                for request, memories in zip(batch, loaded, strict=True):
                    _settle(request.done, memories)
            batch = []
        except BaseException as exc:  # cancelled (the loop is closing): no recall waits forever
            for request in (*batch, *self._waiting):
                _settle(request.done, exc)
            self._waiting = []
            raise
        finally:
            self._drain_task = None

    async def _one_at_a_time(self, batch: list[TouchRequest], failure: Exception) -> None:
        """The batch's transaction failed: each request's touch on its own (once; none after a
        failure of the whole database), and the recalls whose touch failed get their memories
        untouched."""
        retry = len(batch) > 1 and explain(failure) is None  # a lone request has had its own try
        untouched: list[TouchRequest] = []
        for request in batch:
            if retry:
                try:
                    _settle(request.done, (await self._run([(request.touched, request.ids, request.now)]))[0])
                    continue
                except Exception as exc:
                    failure = exc
                    retry = explain(exc) is None
            untouched.append(request)
        log.warning("could not count %d of %d recalls as recalls of their memories (their decay clocks stay as they "
                    "were; the recalls answer all the same): %s", len(untouched), len(batch), _one_line(failure))
        try:
            loaded = await self._load(list(dict.fromkeys(i for request in untouched for i in request.ids)))
        except Exception as exc:  # the memories cannot be read either: these recalls fail, as they must
            for request in untouched:
                _settle(request.done, exc)
            return
        for request in untouched:
            _settle(request.done, {i: loaded[i] for i in request.ids if i in loaded})


def _one_line(exc: BaseException) -> str:
    text = explain(exc) or str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _settle(done: asyncio.Future, outcome: object) -> None:
    if done.done():  # its recall was cancelled
        return
    if isinstance(outcome, asyncio.CancelledError):
        done.cancel()
    elif isinstance(outcome, BaseException):
        done.set_exception(outcome)
    else:
        done.set_result(outcome)
