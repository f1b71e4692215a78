"""A key held partially: its ids and sign codes in memory, its vectors left in the store.

A key too big for the cache's budget was searched by the store's exact scan, which reads every
vector (a busy channel of hundreds of thousands: a second and more a search). Held partially it
takes about an eighth of the bytes of its int8 rows (an id and a 1-bit-per-dimension code a
vector) and is searched in three steps: the Hamming distance of every code to the query's picks a
shortlist, the query's dot product with each shortlisted code read as +-1 per dimension
(`codes.asymmetric`, which keeps the query's magnitudes) picks the best of those, and only these
are read from the store and scored exactly. The results carry exact scores; what the code steps
miss is lost (recall@10 against the exact scan: docs/performance.md).

The store stays the authority: the exact read takes a vector only if the store still holds it
under this key (storage `read_key_vectors`), so a memory forgotten or moved since is never
returned, whatever the codes still hold.
"""
from __future__ import annotations

import numpy as np

from bot.memory.vectors import codes as vector_codes
from bot.memory.vectors.lookup import FileRows

SHORTLIST = 2000      # rows kept by Hamming distance
RESCORE_MIN = 160     # of those, the best by the codes' dot product read from the store and scored exactly...
RESCORE_PER_K = 10    # ... and at least this many per wanted result
GROWTH = 1.25         # appends regrow the arrays by this much


def rescore_count(k: int) -> int:
    """How many rows of a partially held key are read from the store for `k` results."""
    return max(RESCORE_MIN, RESCORE_PER_K * k)


class PartialKey:
    """One key's ids and sign codes, rows [0, n) of preallocated arrays; a removed row keeps its
    place with id -1 (its code is never read again: it is kept out of every shortlist). Appends
    write past `n` and a regrow swaps whole arrays, so a search holding an older view never reads
    a half-written row. The caller (the cache) holds its lock around `add` and `discard`."""
    __slots__ = ("ids", "codes", "n", "dead", "row_of")

    def __init__(self, ids: np.ndarray, codes: np.ndarray, spare: int = 0):
        n = len(ids)
        self.ids = np.full(n + spare, -1, dtype=np.int64)
        self.ids[:n] = ids
        self.codes = np.zeros((codes.shape[0], n + spare), dtype=np.uint64)
        self.codes[:, :n] = codes[:, :n]
        self.n = n
        self.dead = 0
        self.row_of = FileRows(self.ids, n)  # sorted ids: a dict took more memory per row than the code

    @staticmethod
    def row_bytes(dim: int) -> int:
        """The bytes one vector takes held partially (its id and its code)."""
        return 8 + vector_codes.words_for(dim) * 8

    @property
    def nbytes(self) -> int:
        """The bytes its arrays take, counted against the cache's budget."""
        return self.ids.nbytes + self.codes.nbytes

    @property
    def live(self) -> int:
        """How many rows hold a vector."""
        return self.n - self.dead

    def view(self) -> tuple[np.ndarray, np.ndarray, int]:
        """(ids, codes, n) as of now, for a search off the lock."""
        return self.ids, self.codes, self.n

    def discard(self, memory_id: int) -> None:
        """Remove a memory's row (its id -1); nothing when it is not here."""
        row = self.row_of.pop(memory_id, None)
        if row is not None:
            self.ids[row] = -1
            self.dead += 1

    def add(self, memory_id: int, vector: np.ndarray) -> None:
        """Hold a memory's code in the next free row (replacing any it had here)."""
        self.discard(memory_id)
        if self.n == len(self.ids):
            self._regrow(int(self.live * GROWTH) + 4)
        row = self.n
        self.codes[:, row] = vector_codes.pack(np.asarray(vector, dtype=np.float32).reshape(1, -1))[:, 0]
        self.ids[row] = memory_id
        self.row_of[memory_id] = row
        self.n += 1

    def _regrow(self, capacity: int) -> None:
        alive = self.ids[:self.n] >= 0
        count = int(alive.sum())
        ids = np.full(max(capacity, count + 1), -1, dtype=np.int64)
        codes = np.zeros((self.codes.shape[0], len(ids)), dtype=np.uint64)
        ids[:count], codes[:, :count] = self.ids[:self.n][alive], self.codes[:, :self.n][:, alive]
        self.ids, self.codes, self.n, self.dead = ids, codes, count, 0
        self.row_of = FileRows(ids, count)


def candidates(view: tuple[np.ndarray, np.ndarray, int], q: np.ndarray, k: int,
               skip: np.ndarray | None) -> list[int]:
    """The ids of a partially held key worth reading exactly for `k` results to the unit query
    `q`: the best `rescore_count(k)` by the codes' dot product among the SHORTLIST nearest codes
    by Hamming distance; removed rows and the ids in `skip` left out."""
    ids, codes, n = view
    if n == 0:
        return []
    distances = vector_codes.hamming(codes, n, vector_codes.pack(q[None])[:, 0])
    out_of_reach = codes.shape[0] * 64 + 1  # past any code's distance: never shortlisted
    gone = ids[:n] < 0
    if skip is not None:
        gone |= np.isin(ids[:n], skip)
    distances[gone] = out_of_reach
    rows = vector_codes.nearest_rows(distances, SHORTLIST)
    rows = rows[distances[rows] < out_of_reach]
    wanted = rescore_count(k)
    if len(rows) > wanted:
        estimate = vector_codes.asymmetric(codes[:, rows], q)
        rows = rows[np.argpartition(-estimate, wanted - 1)[:wanted]]
    found = ids[np.sort(rows)]
    return found[found >= 0].tolist()  # a row removed meanwhile reads -1
