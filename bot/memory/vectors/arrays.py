"""One visibility key's vectors as numpy arrays, and the scoring of a query against them.

A key's rows are held in one of two forms (MUNINN_VECTOR_FORM): `float32`, the stored vectors
as they are, or `int8`, each row scaled by its largest component to the int8 range and kept
with that scale (a quarter of the bytes). An int8 row's dot product with a unit query is
close to the exact one, off by at most half a step per component: good enough to choose a
short list, not to answer. The cache (cache.py) rescores that short list exactly from the store of
record. A per-row scale (not one per key) keeps every row's accuracy whatever is appended
later: a key's range never has to grow and no row is ever quantised twice.
"""
from __future__ import annotations

import threading
from typing import Sequence

import numpy as np

from bot.memory.vectors import codes as vector_codes
from bot.memory.vectors import index as vectors
from bot.memory.vectors.lookup import FileRows

SLACK_ROWS = 4             # room for a few new vectors before a key's arrays are copied
GROWTH = 1.25              # then 25 % more, so appends cost O(1) on average
MIN_DEAD_TO_COMPACT = 64
FORMS = ("float32", "int8")
INT8_MAX = 127
RESCORE_EXTRA = 8
DECODE_BYTES = 1 << 20     # int8 rows are widened to float32 this many bytes at a time (stays in the CPU cache)
QUANTISE_BYTES = 4 << 20   # float32 rows quantised at a time when a key is loaded


# (ids, created, matrix, n, scales): one key's arrays as a search reads them (KeyVectors.view)
View = tuple[np.ndarray, np.ndarray, np.ndarray, int, "np.ndarray | None"]


def quantise(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(int8 rows, float32 scale of each row): row ~ scale * int8 row, the largest component
    mapped to +-INT8_MAX (an all-zero row gets scale 0)."""
    rows = np.asarray(rows, dtype=np.float32).reshape(-1, rows.shape[-1])
    peak = np.max(np.abs(rows), axis=1) if rows.size else np.zeros(len(rows), dtype=np.float32)
    scales = (peak / INT8_MAX).astype(np.float32)
    safe = np.where(scales > 0, scales, 1.0).astype(np.float32)
    codes = np.rint(rows / safe[:, None])
    np.clip(codes, -INT8_MAX, INT8_MAX, out=codes)
    return codes.astype(np.int8), scales


def quantise_into(matrix: np.ndarray, rows: np.ndarray, scales: np.ndarray) -> None:
    """Quantise float32 `matrix` into the first rows of `rows` and `scales`, a block at a time:
    quantising a big key whole took several float32 copies of it at once."""
    n, dim = matrix.shape
    step = max(1, QUANTISE_BYTES // (4 * max(1, dim)))
    for start in range(0, n, step):
        end = min(n, start + step)
        rows[start:end], scales[start:end] = quantise(matrix[start:end])


def in_form(matrix: np.ndarray, form: str) -> tuple[np.ndarray, np.ndarray | None]:
    """A key's float32 rows in `form`: (int8 rows, their scales) or (float32 rows, None)."""
    if form != "int8":
        return np.ascontiguousarray(matrix, dtype=np.float32), None
    rows, scales = np.empty(matrix.shape, dtype=np.int8), np.empty(len(matrix), dtype=np.float32)
    quantise_into(matrix, rows, scales)
    return rows, scales


_buffers = threading.local()


def _decode_buffer(rows: int, dim: int) -> np.ndarray:
    """This thread's float32 scratch of at least rows x dim (no allocation per search)."""
    buffer = getattr(_buffers, "block", None)
    if buffer is None or buffer.shape[1] != dim or len(buffer) < rows:
        buffer = _buffers.block = np.empty((rows, dim), dtype=np.float32)
    return buffer[:rows]


def scores_of(matrix: np.ndarray, q: np.ndarray, scales: np.ndarray | None) -> np.ndarray:
    """`matrix @ q` as float32 for rows in either form: int8 rows (with their `scales`) are
    widened a block at a time into a scratch buffer, then multiplied by their scale."""
    if scales is None:
        return matrix @ q
    n, dim = matrix.shape
    out = np.empty(n, dtype=np.float32)
    step = max(16, DECODE_BYTES // (4 * max(1, dim)))
    block = _decode_buffer(min(step, max(1, n)), dim)
    for start in range(0, n, step):
        end = min(n, start + step)
        rows = block[:end - start]
        np.copyto(rows, matrix[start:end], casting="unsafe")
        np.matmul(rows, q, out=out[start:end])
    out *= scales[:n]
    return out


class KeyVectors:
    """One key's vectors in rows [0, n) of preallocated arrays. A removed vector keeps its row
    with id -1 until the next compaction. Appends write past `n` and replacements swap whole
    arrays, so a search holding an older (arrays, n) view never reads a half-written row.
    `codes`: the rows' sign codes (vector_codes.py), only for a key searched by code (packed at
    load for a key big enough to be searched by code alone, else by the first search that
    shortlists it: `pack_codes` / `install_codes`), else None. Packing every key made each
    key's load markedly slower and took memory for codes no search read.
    `form`: float32 rows, or int8 rows with each row's scale in `scales` (None for float32)."""
    __slots__ = ("ids", "created", "matrix", "scales", "codes", "n", "dead", "row_of")

    def __init__(self, ids: np.ndarray, created: np.ndarray, matrix: np.ndarray, spare: int = 0,
                 coded: bool = False, form: str = "float32"):
        n = len(ids)
        cap = n + SLACK_ROWS + spare
        self.ids = np.full(cap, -1, dtype=np.int64)
        self.created = np.zeros(cap, dtype=np.float64)
        self.scales: np.ndarray | None = None
        if form == "int8":
            self.matrix = np.zeros((cap, matrix.shape[1]), dtype=np.int8)
            self.scales = np.zeros(cap, dtype=np.float32)
            quantise_into(matrix, self.matrix, self.scales)  # in place: no second copy of the key
        else:
            self.matrix = np.zeros((cap, matrix.shape[1]), dtype=np.float32)
            self.matrix[:n] = matrix
        self.ids[:n], self.created[:n] = ids, created
        self.codes: np.ndarray | None = None
        if coded:
            self.codes = vector_codes.empty(matrix.shape[1], cap)
            self.codes[:, :n] = vector_codes.pack(self.matrix[:n])
        self.n = n
        self.dead = 0
        self.row_of: dict[int, int] | FileRows = {int(mid): i for i, mid in enumerate(ids)}

    @classmethod
    def mapped(cls, ids: np.ndarray, created: np.ndarray, matrix: np.ndarray, scales: np.ndarray | None,
               codes: np.ndarray | None, n: int) -> "KeyVectors":
        """A key over arrays given whole, at their capacity (a snapshot's private map, snapshot.py):
        rows [0, n) hold its vectors (id -1: removed), the rows past `n` are free. Nothing is
        copied: an append or a removal writes the process's own copy of that page alone."""
        entry = cls.__new__(cls)
        entry.ids, entry.created, entry.matrix, entry.scales, entry.codes, entry.n = ids, created, matrix, scales, codes, n
        entry.dead = int((ids[:n] < 0).sum())
        entry.row_of = FileRows(ids, n)  # not a dict: that took more memory per row than the row
        return entry

    @property
    def nbytes(self) -> int:
        """The bytes its arrays take (ids, times, matrix, codes when packed), counted against the cache's budget."""
        codes = self.codes.nbytes if self.codes is not None else 0
        scales = self.scales.nbytes if self.scales is not None else 0
        return self.matrix.nbytes + self.ids.nbytes + self.created.nbytes + codes + scales

    @staticmethod
    def row_bytes(dim: int, form: str) -> int:
        """The bytes one row takes in `form` (vector, its scale, id, created_at), codes aside."""
        return dim + 4 + 16 if form == "int8" else dim * 4 + 16

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

    def view(self) -> View:
        """(ids, created, matrix, n, scales) as of now: a search reads rows [0, n)
        of these arrays, which later appends and swaps leave as they are."""
        return self.ids, self.created, self.matrix, self.n, self.scales

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
        if self.scales is not None:
            rows, scales = quantise(np.asarray(vector, dtype=np.float32).reshape(1, -1))
            self.matrix[row], self.scales[row] = rows[0], scales[0]
        else:
            self.matrix[row] = vector
        if self.codes is not None:
            self.codes[:, row] = vector_codes.pack(self.matrix[row:row + 1])[:, 0]
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
        matrix = np.zeros((capacity, self.matrix.shape[1]), dtype=self.matrix.dtype)
        ids[:count], created[:count], matrix[:count] = (self.ids[:self.n][alive], self.created[:self.n][alive],
                                                        self.matrix[:self.n][alive])
        if self.scales is not None:
            scales = np.zeros(capacity, dtype=np.float32)
            scales[:count] = self.scales[:self.n][alive]
            self.scales = scales
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


def rescore_count(k: int) -> int:
    """How many of the best close (int8) scores are rescored exactly for `k` results:
    RESCORE_EXTRA more (a true top-k row ranked just below the k-th by its close score is
    still read; twice k kept no more of the exact top k on real embeddings, bench/compact.py)."""
    return k + RESCORE_EXTRA


def distance_of(score: float) -> float:
    """L2 distance between unit vectors from their dot product (what vec0 returns)."""
    return float(np.sqrt(max(0.0, 2.0 - 2.0 * float(score))))


def top_scores(ids: np.ndarray, created: np.ndarray, matrix: np.ndarray, q: np.ndarray, k: int,
               as_of: float | None, skip: np.ndarray | None,
               scales: np.ndarray | None = None) -> list[tuple[float, int]]:
    """The k best (dot product, id) of one key's rows for the unit query `q`, in no particular
    order, leaving out removed rows, those created after `as_of` and the ids in `skip`."""
    if len(ids) == 0:
        return []
    scores = scores_of(matrix, q, scales)
    scores[ids < 0] = -np.inf
    if as_of is not None:
        scores[created > as_of] = -np.inf
    if skip is not None:
        scores[np.isin(ids, skip)] = -np.inf
    return top_scores_of(ids, scores, k)


def top_scores_over(views: list[View], q: np.ndarray, k: int,
                    as_of: float | None, skip: np.ndarray | None) -> list[tuple[float, int]]:
    """The k best over several keys' rows: one product per key (their arrays stay where they
    are, no copy), then one selection over all the scores instead of one per key."""
    views = [view for view in views if view[3] > 0]
    if len(views) == 1:
        ids, created, matrix, n, scales = views[0]
        return top_scores(ids[:n], created[:n], matrix[:n], q, k, as_of, skip,
                          None if scales is None else scales[:n])
    if not views:
        return []
    ids = np.concatenate([view[0][:view[3]] for view in views])
    scores = np.concatenate([scores_of(matrix[:n], q, None if scales is None else scales[:n])
                             for _, _, matrix, n, scales in views])
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
