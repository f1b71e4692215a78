"""One visibility key's vectors as numpy arrays, and the scoring of a query against them."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from bot.memory.vectors import codes as vector_codes
from bot.memory.vectors import index as vectors

SLACK_ROWS = 4             # room for a few new vectors before a key's arrays are copied
GROWTH = 1.25              # then 25 % more, so appends cost O(1) on average
MIN_DEAD_TO_COMPACT = 64


class KeyVectors:
    """One key's vectors in rows [0, n) of preallocated arrays. A removed vector keeps its row
    with id -1 until the next compaction. Appends write past `n` and replacements swap whole
    arrays, so a search holding an older (arrays, n) view never reads a half-written row.
    `codes`: the rows' sign codes (vector_codes.py), only for a key searched by code (packed at
    load for a key big enough to be searched by code alone, else by the first search that
    shortlists it: `pack_codes` / `install_codes`), else None. Packing every key made each
    key's load markedly slower and took memory for codes no search read."""
    __slots__ = ("ids", "created", "matrix", "codes", "n", "dead", "row_of")

    def __init__(self, ids: np.ndarray, created: np.ndarray, matrix: np.ndarray, spare: int = 0,
                 coded: bool = False):
        n = len(ids)
        cap = n + SLACK_ROWS + spare
        self.ids = np.full(cap, -1, dtype=np.int64)
        self.created = np.zeros(cap, dtype=np.float64)
        self.matrix = np.zeros((cap, matrix.shape[1]), dtype=np.float32)
        self.ids[:n], self.created[:n], self.matrix[:n] = ids, created, matrix
        self.codes: np.ndarray | None = None
        if coded:
            self.codes = vector_codes.empty(matrix.shape[1], cap)
            self.codes[:, :n] = vector_codes.pack(matrix)
        self.n = n
        self.dead = 0
        self.row_of = {int(mid): i for i, mid in enumerate(ids)}

    @property
    def nbytes(self) -> int:
        """The bytes its arrays take (ids, times, matrix, codes when packed), counted against the cache's budget."""
        codes = self.codes.nbytes if self.codes is not None else 0
        return self.matrix.nbytes + self.ids.nbytes + self.created.nbytes + codes

    @staticmethod
    def pack_codes(matrix: np.ndarray, n: int) -> tuple[np.ndarray, int, np.ndarray]:
        """Off the lock, given (matrix, n) read under it: (the matrix, n, the codes of its rows
        [0, n) at its capacity), for `install_codes`. Rows [0, n) are never rewritten in place,
        so packing them beside appends is safe."""
        codes = vector_codes.empty(matrix.shape[1], len(matrix))
        codes[:, :n] = vector_codes.pack(matrix[:n])
        return matrix, n, codes

    def install_codes(self, packed: tuple[np.ndarray, int, np.ndarray]) -> None:
        """Under the cache's lock: take codes from `pack_codes`, packing the rows appended since;
        dropped when the arrays were regrown meanwhile (the next search packs again)."""
        matrix, rows, codes = packed
        if self.codes is not None or matrix is not self.matrix:
            return
        if self.n > rows:
            codes[:, rows:self.n] = vector_codes.pack(self.matrix[rows:self.n])
        self.codes = codes

    @property
    def live(self) -> int:
        """How many rows hold a vector: rows [0, n) less the removed ones."""
        return self.n - self.dead

    def view(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        """(ids, created, matrix, n) as of now: a search reads rows [0, n)
        of these arrays, which later appends and swaps leave as they are."""
        return self.ids, self.created, self.matrix, self.n

    def discard(self, memory_id: int) -> None:
        """Remove a memory's vector (its row gets id -1), compacting once enough rows
        are dead; nothing when it is not here. The caller holds the cache's lock."""
        row = self.row_of.pop(memory_id, None)
        if row is not None:
            self.ids[row] = -1
            self.dead += 1
            if self.dead > MIN_DEAD_TO_COMPACT and self.dead * 4 > self.n:
                self._compact()

    def add(self, memory_id: int, created_at: float, vector: np.ndarray) -> None:
        """Store a memory's vector in the next free row (replacing any it had here),
        regrowing the arrays when they are full. The caller holds the cache's lock."""
        self.discard(memory_id)
        if self.n == len(self.ids):
            self._regrow(int(self.n * GROWTH) + SLACK_ROWS)
        row = self.n
        self.matrix[row] = vector
        if self.codes is not None:
            self.codes[:, row] = vector_codes.pack(np.asarray(vector, dtype=np.float32).reshape(1, -1))[:, 0]
        self.created[row] = created_at
        self.ids[row] = memory_id
        self.row_of[memory_id] = row
        self.n += 1

    def _regrow(self, capacity: int) -> None:
        alive = self.ids[:self.n] >= 0
        count = int(alive.sum())
        capacity = max(capacity, count + 1)
        ids = np.full(capacity, -1, dtype=np.int64)
        created = np.zeros(capacity, dtype=np.float64)
        matrix = np.zeros((capacity, self.matrix.shape[1]), dtype=np.float32)
        ids[:count], created[:count], matrix[:count] = (self.ids[:self.n][alive], self.created[:self.n][alive],
                                                        self.matrix[:self.n][alive])
        codes = None
        if self.codes is not None:
            codes = vector_codes.empty(self.matrix.shape[1], capacity)
            codes[:, :count] = self.codes[:, :self.n][:, alive]
        self.ids, self.created, self.matrix, self.codes, self.n, self.dead = ids, created, matrix, codes, count, 0
        self.row_of = {int(mid): i for i, mid in enumerate(ids[:count])}

    def _compact(self) -> None:
        self._regrow(self.n - self.dead + SLACK_ROWS)



def unit(vector: Sequence[float]) -> np.ndarray:
    """The query as a float32 unit vector; VectorSizeError when it is zero or not finite."""
    q = np.asarray(vector, dtype=np.float32)
    norm = float(np.sqrt(q @ q))
    if not np.isfinite(norm) or norm == 0.0:
        raise vectors.VectorSizeError("embedding is zero or not finite")
    return q / norm


def distance_of(score: float) -> float:
    """L2 distance between unit vectors from their dot product (what vec0 returns)."""
    return float(np.sqrt(max(0.0, 2.0 - 2.0 * float(score))))


def top_scores(ids: np.ndarray, created: np.ndarray, matrix: np.ndarray, q: np.ndarray, k: int,
               as_of: float | None, skip: np.ndarray | None) -> list[tuple[float, int]]:
    """The k best (dot product, id) of one key's rows for the unit query `q`, in no particular
    order, leaving out removed rows, those created after `as_of` and the ids in `skip`."""
    if len(ids) == 0:
        return []
    scores = matrix @ q
    scores[ids < 0] = -np.inf
    if as_of is not None:
        scores[created > as_of] = -np.inf
    if skip is not None:
        scores[np.isin(ids, skip)] = -np.inf
    return top_scores_of(ids, scores, k)


def top_scores_over(views: list[tuple[np.ndarray, np.ndarray, np.ndarray, int]], q: np.ndarray, k: int,
                    as_of: float | None, skip: np.ndarray | None) -> list[tuple[float, int]]:
    """The k best over several keys' rows: one product per key (their arrays stay where they
    are, no copy), then one selection over all the scores instead of one per key."""
    views = [view for view in views if view[3] > 0]
    if len(views) == 1:
        ids, created, matrix, n = views[0]
        return top_scores(ids[:n], created[:n], matrix[:n], q, k, as_of, skip)
    if not views:
        return []
    ids = np.concatenate([view[0][:view[3]] for view in views])
    scores = np.concatenate([view[2][:view[3]] @ q for view in views])
    scores[ids < 0] = -np.inf
    if as_of is not None:
        scores[np.concatenate([view[1][:view[3]] for view in views]) > as_of] = -np.inf
    if skip is not None:
        scores[np.isin(ids, skip)] = -np.inf
    return top_scores_of(ids, scores, k)


def top_scores_of(ids: np.ndarray, scores: np.ndarray, k: int) -> list[tuple[float, int]]:
    """The k highest of `scores` as (score, id), in no particular order, leaving out those set to -inf."""
    if len(scores) > k:
        top = np.argpartition(-scores, k - 1)[:k]
    else:
        top = np.arange(len(scores))
    return [(float(scores[i]), int(ids[i])) for i in top if scores[i] != -np.inf]
