"""Recall's touch, shared between concurrent recalls: one writer job and one transaction for all
the recalls waiting to touch, instead of one each.

Every recall ends by touching what it found relevant (a write through the engine's single
writer thread) and loading what it returns. With 20 recalls in flight each touch was its own
writer job and its own commit, and every commit makes each read connection drop its page
cache before its next statement (the keyword step then costs ~1-1.5 ms more at 100k;
bench/README.md, issue 12). Here the first touch starts a drain: one writer job applies every
touch queued by then, in arrival order, in one transaction, then loads all their memories in one
query; touches queued meanwhile go in the next job. Each touch is the same UPDATE with its own
recall's time as before, so last_accessed, access_count and stability end exactly as if each
had been its own transaction in that order; a recall's memories are read after its touch, as
before (and after the others' of the same job, as if those had committed just before).
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Sequence

from bot.memory import store
from bot.memory.storage import Connection


@dataclass
class TouchRequest:
    touched: list[int]  # counted as recalled
    ids: list[int]      # to load (the recall's result)
    now: float
    done: asyncio.Future = field(repr=False)


def touch_and_load_all(conn: Connection, storage: Any, requests: Sequence[tuple[list[int], list[int], float]],
                       growth: float) -> list[dict[int, store.Memory]]:
    """On the writer: every request's touch (in order) in one transaction, then all their
    memories in one read."""
    touches = [(touched, now) for touched, _, now in requests if touched]
    if touches:  # a write transaction: never taken (and waited for) when nothing was recalled
        storage.touch_many(conn, touches, growth=growth)
    wanted = list(dict.fromkeys(memory_id for _, ids, _ in requests for memory_id in ids))
    loaded = storage.get_many(conn, wanted)
    return [{memory_id: loaded[memory_id] for memory_id in ids if memory_id in loaded} for _, ids, _ in requests]


class TouchBatcher:
    """Queues recalls' touches; `run(requests)` applies a batch on the writer (touch_and_load_all)."""

    def __init__(self, run: Callable[[list[tuple[list[int], list[int], float]]],
                                     Awaitable[list[dict[int, store.Memory]]]]) -> None:
        self._run = run
        self._waiting: list[TouchRequest] = []
        self._drain_task: asyncio.Task | None = None
        self.jobs = 0  # writer jobs run (for tests and benchmarks: how much was shared)

    async def touch_and_load(self, touched: list[int], ids: list[int], now: float) -> dict[int, store.Memory]:
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
                except Exception as exc:  # each waiting recall raises it, as its own job did before
                    for request in batch:
                        _settle(request.done, exc)
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


def _settle(done: asyncio.Future, outcome: object) -> None:
    if done.done():  # its recall was cancelled
        return
    if isinstance(outcome, asyncio.CancelledError):
        done.cancel()
    elif isinstance(outcome, BaseException):
        done.set_exception(outcome)
    else:
        done.set_result(outcome)
