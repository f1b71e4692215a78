"""The keys a vector cache holds partially (partial.py): chosen, built, kept in step, evicted.

A key is held partially when the budget cannot hold it whole (too big for all of it, or for the
room the warm has left) and it has at least `partial_min` vectors: below that the store's exact
scan of it is cheap enough (sqlite-vec reads a few microseconds a vector), above it the scan
costs more than a partial search (a Hamming pass over its codes and a few hundred vectors read
back). The warm plans whole keys biggest first and holds partially those that do not fit, so
the keys most viewers see are whole; a partial key counts its bytes in the budget and is evicted
like a whole one. Only a store that can read a key's codes and re-read vectors under their key
(SQLite: sqlite/partial_source.py) gets partial keys; searches as of a past moment stay exact.
"""
from __future__ import annotations

import time
from collections import OrderedDict
from typing import Any

import numpy as np

from bot.memory.connection import Connection
from bot.memory.scope import ACTIVE
from bot.memory.vectors import codes as vector_codes
from bot.memory.vectors import index as vectors
from bot.memory.vectors import keys as cache_keys
from bot.memory.vectors.arrays import SLACK_ROWS, KeyVectors
from bot.memory.vectors.keys import CachedKeys, spare_rows
from bot.memory.vectors.partial import PartialKey, candidates
from bot.memory.vectors.source import Changed, read_with

# With keys held partially, a cold key of more vectors than this loads on the loader thread
# while the store answers for it: a recall that met a viewer's cold keys of a few thousand
# vectors spent longer loading them (reading, quantising, evicting) than the store takes to
# search them, and that was the slowest recalls of a busy channel with the cache full.
INLINE_LOAD_MAX = 256


class PartialKeys(CachedKeys):
    """CachedKeys that hold the keys too big for the budget partially (`partial_min` > 0)."""

    def __init__(self, *args: Any, partial_min: int = 0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # a key of at least this many vectors that the budget cannot hold whole is held partially; 0: never
        self.partial_min = partial_min
        self._partial: OrderedDict[str, PartialKey] = OrderedDict()  # least recently used first

    def partial_keys(self) -> list[str]:
        """The keys held partially now, least recently used first."""
        with self._lock:
            return list(self._partial)

    def _partial_ok(self, count: int) -> bool:
        return 0 < self.partial_min <= count and hasattr(self.source, "read_key_vectors")

    def _partial_need(self, count: int, dim: int, used: int) -> int:
        need = (count + spare_rows(count)) * PartialKey.row_bytes(dim)
        return need if self._partial_ok(count) and used + need <= self.budget_bytes else 0

    def _defer(self, conn: Connection, info: vectors.IndexInfo, key: str) -> bool:
        """With keys held partially, also a cold key that would push others out of a full cache
        goes to the loader (its load and the keys it evicts cost the search that meets it far
        more than the store's search of a small key). Only then: no key is read whole there only to
        be found too big, which held up the loader's queue for seconds while the store answered
        every key behind it (a heavy DM user's dozens of small keys, one partition each)."""
        if not self._partial_ok(self.partial_min):
            return super()._defer(conn, info, key)
        most = min(INLINE_LOAD_MAX, cache_keys.INLINE_LOAD_MAX)
        count = self.source.key_size_at_least(conn, key, most)
        row_bytes = KeyVectors.row_bytes(info.dim, self.form)
        return count > most or self._bytes + (count + SLACK_ROWS) * row_bytes > self.budget_bytes

    # -- choosing and building -------------------------------------------------------

    def _counts_before_load(self) -> bool:
        """With partial holding, every load counts its key first: one too big for the whole budget
        is held partially instead of being read whole only to be found so."""
        return self._partial_ok(self.partial_min)

    def _found_too_big(self, conn: Connection, info: vectors.IndexInfo, key: str, count: int,
                       generation: int) -> None:
        """Marked too big as the cache does, and held partially (already, or now) if it qualifies; a
        partial key that now fits is loaded whole, its partial copy serving until then."""
        super()._found_too_big(conn, info, key, count, generation)
        with self._lock:
            held = key in self._partial
        if not held and self._partial_ok(count):
            self._hold_partially(conn, info, key)

    def _hold_partially(self, conn: Connection, info: vectors.IndexInfo, key: str) -> bool:
        """Read `key`'s codes from the store and hold it partially; the changes applied meanwhile
        are caught up as a load does. Whether it is held."""
        if not conn.get_autocommit():
            return False
        with self._lock:
            generation, seq = self._generation, self._seq
            if key in self._partial:
                return True
        ids, codes = self.source.key_codes(conn, info, key)  # type: ignore[attr-defined]
        entry = PartialKey(ids, codes, spare_rows(len(ids)))
        with self._lock:
            if self._generation != generation or key in self._keys:
                return False  # the cache started over, or the key was loaded whole meanwhile
            if key in self._partial:
                return True  # another thread (the warm, a load) built it meanwhile
            self._partial[key] = entry
            self._bytes += entry.nbytes
            self._too_big[key] = time.monotonic()  # searches use the partial key; a whole load is tried later
            if self._seq != seq:
                changed = self.source.changed_between(conn, seq, self._seq)
                self._apply_partial(conn, info, changed, None, only=key)
            self._evict_beside(key)
            return key in self._partial

    # -- searching ----------------------------------------------------------------------

    def _partial_search(self, conn: Connection, info: vectors.IndexInfo, keys: list[str], q: np.ndarray, k: int,
                        skip: np.ndarray | None) -> tuple[list[tuple[float, int]], list[str]]:
        """(exact (score, id) of the partial keys' best candidates, the keys not held partially)."""
        with self._lock:
            views = {}
            for key in keys:
                entry = self._partial.get(key)
                if entry is not None:
                    self._partial.move_to_end(key)
                    views[key] = entry.view()
        scored: list[tuple[float, int]] = []
        for key, view in views.items():
            wanted = candidates(view, q, k, skip)
            found = self.source.read_key_vectors(conn, info, key, wanted)  # type: ignore[attr-defined]
            scored += [(float(vector @ q), memory_id) for memory_id, vector in found.items()]
        return scored, [key for key in keys if key not in views]

    # -- keeping in step ------------------------------------------------------------------

    def _apply(self, conn: Connection, info: vectors.IndexInfo, ids: set[int], states: Changed | None = None) -> None:
        super()._apply(conn, info, ids, states)
        if self._partial:
            self._apply_partial(conn, info, ids, states)

    def _apply_partial(self, conn: Connection, info: vectors.IndexInfo, ids: set[int], states: Changed | None,
                       only: str | None = None) -> None:
        """Under the lock: each of `ids` out of the partial keys, and back into the one its memory
        is under now, if active with a vector (`only`: that key alone)."""
        held = {only: self._partial[only]} if only is not None else self._partial
        for entry in held.values():
            for memory_id in ids:
                entry.discard(memory_id)
        if not ids:
            return
        if states is not None:
            now = {mid: state[0] for mid, state in states.items() if state is not None and mid in ids}
        else:
            marks = ",".join("?" * len(ids))
            now = {int(mid): str(key) for mid, key in conn.execute(
                f"SELECT id, vis_key FROM memories WHERE id IN ({marks}) AND embedded = 1 AND {ACTIVE}", tuple(ids))}
        wanted = {mid: key for mid, key in now.items() if key in held}
        if not wanted:
            return
        found = {mid: vector for mid in wanted
                 if states is not None and (vector := read_with(states, mid, info.dim)) is not None}
        missing = [mid for mid in wanted if mid not in found]
        if missing:
            found.update(self.source.read_vectors(conn, info, missing))
        for memory_id, key in wanted.items():
            vector = found.get(memory_id)
            if vector is not None:
                entry = held[key]
                before = entry.nbytes
                entry.add(memory_id, vector)
                self._bytes += entry.nbytes - before

    # -- letting go -------------------------------------------------------------------------

    def _drop_partial(self, key: str) -> None:
        entry = self._partial.pop(key)
        self._bytes -= entry.nbytes

    def _evict_beside(self, key: str) -> None:
        """Under the lock, after `key` grew or arrived: least recently used first, whole keys go
        until the cache fits its budget again, then partial ones. A whole key big enough to be held
        partially is kept so (its codes from its own rows, no read): a big key evicted outright left
        its viewers the store's exact scan of it, the slowest search of all, to make room for
        small keys the store scans in a moment."""
        if key in self._keys and key in self._partial:  # held whole now: its partial copy goes
            self._drop_partial(key)
        while self._bytes > self.budget_bytes:
            other = next((name for name in self._keys if name != key), None)
            if other is not None:
                entry = self._keys[other]
                self._drop(other)
                if self._partial_ok(entry.live) and other not in self._partial:
                    self._demote(other, entry)
                continue
            other = next((name for name in self._partial if name != key), None)
            if other is None:
                break
            self._drop_partial(other)
            self._too_big.pop(other, None)  # searched by the store until its next load decides again

    def _demote(self, key: str, entry: KeyVectors) -> None:
        """Under the lock: hold an evicted whole key partially, from its own rows."""
        ids, _, matrix, n, _ = entry.view()
        alive = ids[:n] >= 0
        codes = entry.codes[:, :n] if entry.codes is not None else vector_codes.pack(matrix[:n])
        partial = PartialKey(ids[:n][alive], codes[:, alive])
        self._partial[key] = partial
        self._partial.move_to_end(key, last=False)  # least recently used: it was
        self._bytes += partial.nbytes
        self._too_big[key] = time.monotonic()  # not loaded whole again at once (it would evict another)

    def _reset(self) -> None:
        super()._reset()
        self._partial.clear()

