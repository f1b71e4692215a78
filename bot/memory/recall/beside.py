"""A recall's vector search on a second read connection, beside its keyword step (PostgreSQL).

On PostgreSQL both steps mostly wait on the server: the keyword statement over a busy
channel's memories and the graph walk of that channel's key index each take a good part of a
busy viewer's recall, and one after the other on one connection their times add up. Once the
viewer's keys and the question's vector are both known, the vector search is handed to another
reader and runs while the keyword statement does; the search step then takes its hits instead
of searching itself. On SQLite a read is CPU in this process, under one GIL: nothing to overlap,
and recall keeps its single job there.

The search step never waits for a walk that has not started: when every reader is busy (many
recalls in flight) the walk is still queued when the keyword step ends, it is withdrawn and the
search step searches on its own connection, as without this. A reader therefore only ever waits
for a walk another reader is running, never for one queued behind it. With as many recalls in
flight as there are readers nothing is handed over at all (Engine._beside): each reader is
wanted by a recall's own job, and many recalls in flight run as they did on one connection each.

Both reads are statements of their own, as the keyword and the vector statement were before
(autocommit: each sees what was committed when it began); `as_of` filters both the same way.
"""
from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Any, Callable

from bot.memory.recall.retrieval import Candidate
from bot.memory.storage import Storage
from bot.memory.vectors.index import IndexInfo

# submit(fn, *args): run fn(conn, *args) on a read connection of another reader; its Future, or
# None when no reader is to spare (then the search step searches on its own connection)
Submit = Callable[..., "Future[list[Candidate]] | None"]


class WalkBeside:
    """One recall's vector search, started on another reader as soon as both the viewer's keys
    (the keyword step's first read, on a reader thread) and the question's vector (given, or
    the embedding's answer, on the event loop) are known, if the keyword step is still running."""

    def __init__(self, submit: Submit, storage: Storage[Any], model: str, depth: int, as_of: float | None,
                 in_memory: Callable[[list[str]], bool] = lambda keys: False) -> None:
        """`model`: the embedding model the index must hold for the vector to be searched at all
        (steps.checked_vector), so the walk searches the index that check will accept.
        `in_memory(keys)`: the vector cache answers those keys alone; then nothing is handed over
        (a search in memory takes less than the hand-off, and would only contend with the keyword step)."""
        self._submit = submit
        self._in_memory = in_memory
        self._storage = storage
        self._model = model
        self._depth = depth
        self._as_of = as_of
        self._lock = threading.Lock()  # keys come on a reader thread, the vector on the event loop
        self._keys: list[str] | None = None
        self._vector: list[float] | None = None
        self._info: IndexInfo | None = None
        self._closed = False
        self.future: Future[list[Candidate]] | None = None

    def keys_known(self, keys: list[str]) -> None:
        """The viewer's keys (read first by the keyword step)."""
        with self._lock:
            self._keys = keys
            self._start()

    def vector_known(self, vector: list[float] | None) -> None:
        """The question's vector (None: there is none, nothing to walk)."""
        with self._lock:
            self._vector = vector
            self._start()

    def no_more(self) -> None:
        """The keyword step is over: a walk not started by now would only add a hand-off."""
        with self._lock:
            self._closed = True

    def _start(self) -> None:
        if self._closed or self.future is not None or not self._keys or self._vector is None:
            return
        if self._in_memory(self._keys):
            self._closed = True
            return
        self._info = IndexInfo(self._model, len(self._vector))
        self.future = self._submit(self._storage.vector_candidates, self._info, self._vector, self._keys,
                                   self._depth, self._as_of)

    def take(self, info: IndexInfo | None, vector: list[float] | None, keys: list[str]) -> list[Candidate] | None:
        """The walk's hits if it searched this very index, vector and keys; None: search here
        (no walk was started, it had not begun (it is withdrawn), or it searched something else)."""
        with self._lock:
            self._closed = True
            future = self.future
        if future is None or future.cancel():
            return None
        if info != self._info or vector is not self._vector or keys is not self._keys:
            return None
        return future.result()

    def cancel(self) -> None:
        """The recall failed or was cancelled: no walk starts, a queued one is withdrawn."""
        with self._lock:
            self._closed = True
            future = self.future
        if future is not None:
            future.cancel()
