"""Search of very big keys (the busy channel at a million memories) through a partition of
their vectors into clusters, inside the vector cache.

An exact search reads every vector a viewer may see: 320k x 768 float32 (983 MB) for the busy
channel of the 1M world, 36 ms of `X @ q` on an idle core, hundreds under load (bench/README.md).
Past `VectorCache.approx_min` vectors, a key's rows are grouped by nearest centroid (spherical
k-means, run once on the engine's loader thread) and stored list after list, so a search scores
the centroids, then exactly every vector of the nearest lists until `SCAN_SHARE` of the key's
rows is read, contiguous slices, no gather. Vectors added after the partition (the tail rows)
are always scored exactly; removed ones are masked like everywhere else (id -1). Recall on
real embeddings (MiniLM, LoCoMo turns): ~0.95 at a 20 % share (bench/README.md), on the bench's
isotropic random vectors much less (no structure to cluster). Keys below the threshold, and a
big key before its partition is built or after its arrays were regrown, are searched exactly.

Off by default since the sign-code shortlist (vector_codes.py) replaced it: on the 1M world's
busy key it costs less CPU (18.8 vs 22.6 ms a search), keeps twice the exact top 10 on random
vectors (0.79 vs 0.42) and more on real ones (0.98 vs 0.94), and needs no k-means at start-up
nor a regrouped copy of the key (bench/README.md). A key searched by code is never grouped.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from bot.memory import vector_codes

if TYPE_CHECKING:
    from bot.memory.vector_cache import KeyVectors

ROWS_PER_LIST = 1024        # mean list size: 312 lists at 320k vectors
MAX_LISTS = 4096
TRAIN_PER_LIST = 32         # k-means learns on a sample of this many vectors per list
TRAIN_ROUNDS = 8
ASSIGN_BLOCK = 16384        # rows per block when every vector is given its list
SCAN_SHARE = 0.2            # share of an indexed key's rows a search reads exactly
STALE_TAIL_SHARE = 0.1      # more rows added since the partition than this share: rebuild it
# Free rows after a partition, so appends do not regrow (and drop) it: more than the stale tail,
# so the rebuild is asked for while room is left for the appends made during it. Free rows cost
# no memory until written (np.empty's untouched pages are not resident).
SPARE_SHARE = 1.5 * STALE_TAIL_SHARE


@dataclass(frozen=True)
class ListIndex:
    """Rows [0, indexed) of the key's arrays are sorted by list: list l holds rows
    [offsets[l], offsets[l + 1]). Built over arrays of one identity: a regrow drops it."""
    centroids: np.ndarray  # (lists, dim), unit rows
    offsets: np.ndarray    # (lists + 1,), int64
    indexed: int


def list_count(rows: int) -> int:
    return int(min(MAX_LISTS, max(1, rows // ROWS_PER_LIST)))


def train(matrix: np.ndarray, lists: int, seed: int = 0) -> np.ndarray:
    """Spherical k-means centroids of `matrix`'s rows, learned on a sample."""
    rng = np.random.default_rng(seed)
    rows = len(matrix)
    sample = matrix[np.sort(rng.choice(rows, min(rows, TRAIN_PER_LIST * lists), replace=False))]
    centroids = sample[rng.choice(len(sample), lists, replace=False)].copy()
    for _ in range(TRAIN_ROUNDS):
        nearest = np.argmax(sample @ centroids.T, axis=1)
        sums = np.zeros_like(centroids)
        np.add.at(sums, nearest, sample)
        empty = np.bincount(nearest, minlength=lists) == 0
        if empty.any():  # an empty list restarts at a random sample vector
            sums[empty] = sample[rng.choice(len(sample), int(empty.sum()), replace=False)]
        centroids = sums / np.maximum(np.linalg.norm(sums, axis=1, keepdims=True), np.finfo(np.float32).tiny)
    return np.ascontiguousarray(centroids, dtype=np.float32)


def assign(matrix: np.ndarray, centroids: np.ndarray) -> np.ndarray:
    labels = np.empty(len(matrix), dtype=np.int32)
    for start in range(0, len(matrix), ASSIGN_BLOCK):
        labels[start:start + ASSIGN_BLOCK] = np.argmax(matrix[start:start + ASSIGN_BLOCK] @ centroids.T, axis=1)
    return labels


@dataclass(frozen=True)
class Partition:
    """A key's rows [0, rows) regrouped by list: `order[i]` is the old row of new row i."""
    index: ListIndex
    order: np.ndarray
    matrix: np.ndarray  # the regrouped rows, with room for appends after `rows`
    codes: np.ndarray   # their sign codes (vector_codes.py), same capacity


def partition(matrix: np.ndarray, rows: int, capacity: int) -> Partition:
    """The slow part (seconds at 320k rows), run without any lock: rows [0, rows) of `matrix`
    are never rewritten in place (KeyVectors), so reading them beside searches and appends is safe."""
    live = matrix[:rows]
    centroids = train(live, list_count(rows))
    labels = assign(live, centroids)
    order = np.argsort(labels, kind="stable")
    offsets = np.searchsorted(labels[order], np.arange(len(centroids) + 1)).astype(np.int64)
    regrouped = np.empty((capacity, matrix.shape[1]), dtype=np.float32)
    np.take(live, order, axis=0, out=regrouped[:rows])
    codes = vector_codes.empty(matrix.shape[1], capacity)
    codes[:, :rows] = vector_codes.pack(regrouped[:rows])
    return Partition(ListIndex(centroids, offsets, rows), order, regrouped, codes)


def row_map(ids_then: np.ndarray, part: Partition) -> tuple[np.ndarray, dict[int, int]]:
    """Off the lock: the regrouped rows' ids as they were when the partition started, and the
    id -> row map over them (a dict of 320k entries takes ~135 ms: never under the lock)."""
    regrouped = ids_then[part.order]
    row_of = dict(zip(regrouped.tolist(), range(len(regrouped)), strict=True))
    row_of.pop(-1, None)
    return regrouped, row_of


def install(entry: "KeyVectors", built_over: np.ndarray, part: Partition,
            rows_then: tuple[np.ndarray, dict[int, int]]) -> bool:
    """Swap the regrouped arrays into `entry` (call under the cache's lock). Rows appended
    and ids removed since the partition started are carried over (`rows_then`: row_map's
    answer, so only those changes touch the map here). False when the entry's arrays were
    regrown meanwhile (the partition no longer describes them)."""
    if entry.matrix is not built_over:
        return False
    rows, n = part.index.indexed, entry.n
    capacity = len(part.matrix)
    if n + 1 > capacity:
        return False
    ids = np.full(capacity, -1, dtype=np.int64)
    created = np.zeros(capacity, dtype=np.float64)
    ids[:rows], created[:rows] = entry.ids[part.order], entry.created[part.order]
    ids[rows:n], created[rows:n] = entry.ids[rows:n], entry.created[rows:n]
    part.matrix[rows:n] = entry.matrix[rows:n]
    part.codes[:, rows:n] = entry.codes[:, rows:n]
    ids_then, row_of = rows_then
    for row in np.flatnonzero((ids[:rows] < 0) & (ids_then >= 0)).tolist():  # removed since
        row_of.pop(int(ids_then[row]), None)
    for row in range(rows, n):  # appended since (a replaced vector: removed above, appended here)
        if ids[row] >= 0:
            row_of[int(ids[row])] = row
    entry.ids, entry.created, entry.matrix, entry.codes, entry.row_of = ids, created, part.matrix, part.codes, row_of
    entry.approx = part.index
    return True


def usable(index: ListIndex | None, n: int) -> bool:
    """The partition still describes most of the key (few rows were added since)."""
    return index is not None and n - index.indexed <= max(1, int(index.indexed * STALE_TAIL_SHARE))


def search(index: ListIndex, ids: np.ndarray, created: np.ndarray, matrix: np.ndarray, n: int, q: np.ndarray,
           as_of: float | None, skip: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """(ids, scores) of the rows read: the nearest lists up to SCAN_SHARE of the rows, then the
    tail; rows not read are left out, removed and filtered ones score -inf."""
    sizes = np.diff(index.offsets)
    nearest = np.argsort(-(index.centroids @ q))
    enough = int(np.searchsorted(np.cumsum(sizes[nearest]), SCAN_SHARE * index.indexed)) + 1
    probed = np.sort(nearest[:enough])
    spans: list[tuple[int, int]] = []
    for lst in probed.tolist():  # neighbouring lists are one contiguous slice
        start, end = int(index.offsets[lst]), int(index.offsets[lst + 1])
        if spans and spans[-1][1] == start:
            spans[-1] = (spans[-1][0], end)
        elif end > start:
            spans.append((start, end))
    if n > index.indexed:
        spans.append((index.indexed, n))
    if not spans:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
    got_ids = np.concatenate([ids[a:b] for a, b in spans])
    scores = np.concatenate([matrix[a:b] @ q for a, b in spans])
    scores[got_ids < 0] = -np.inf
    if as_of is not None:
        scores[np.concatenate([created[a:b] for a, b in spans]) > as_of] = -np.inf
    if skip is not None:
        scores[np.isin(got_ids, skip)] = -np.inf
    return got_ids, scores
