"""Sign-bit codes of the vectors, for searching what a viewer sees without reading every float32.

A vector's code is the sign of each dimension, one bit each (768 dims: 96 bytes against 3 kB of
float32). The Hamming distance between two codes tracks the angle between the vectors, so a
search ranks all the viewer's rows by code (one shortlist over all their keys: `search_many`),
then scores only the best `rerank_count` of them exactly in float32 and returns exact scores.
The code scan reads 1/32 of the bytes the exact product reads: for a busy channel's key the
Hamming pass and the rescoring together cost a small fraction of the exact product.

Codes are stored column-major, (words, capacity) uint64: a block of rows is one XOR, one
popcount and one sum over the leading axis, several times faster in numpy than row-major codes, whose
per-row sum over a dozen words is numpy's slow short-axis reduction.

Recall@10 against exact, with 2 % of the rows rescored: nearly all of it on real MiniLM
embeddings (LoCoMo turns, 384 dims: no real key of 20k+ vectors was at hand), much less
on isotropic random vectors (the bench's hash vectors), which have no structure for any
shortlist to exploit.
"""
from __future__ import annotations

import numpy as np

PACK_BLOCK = 16384      # rows packed at a time (packbits needs a bool copy of the block)
SCAN_BLOCK = 16384      # rows per XOR/popcount block: the temporaries stay in the CPU cache
RERANK_SHARE = 0.02     # share of a key's rows rescored exactly
RERANK_MIN = 256        # ... but at least this many
RERANK_PER_K = 8        # ... and this many per wanted result


def words_for(dim: int) -> int:
    """The uint64 words one code of `dim` dimensions takes."""
    return (dim + 63) // 64


def empty(dim: int, capacity: int) -> np.ndarray:
    """Zeroed codes for `capacity` rows: (words, capacity) uint64."""
    return np.zeros((words_for(dim), capacity), dtype=np.uint64)


def pack(matrix: np.ndarray) -> np.ndarray:
    """(words, rows) uint64 sign codes of `matrix`'s rows (bit set: dimension > 0)."""
    rows, dim = matrix.shape
    words = words_for(dim)
    out = np.zeros((words, rows), dtype=np.uint64)
    for start in range(0, rows, PACK_BLOCK):
        block = np.packbits(matrix[start:start + PACK_BLOCK] > 0, axis=1)
        padded = np.zeros((len(block), words * 8), dtype=np.uint8)
        padded[:, :block.shape[1]] = block
        out[:, start:start + len(block)] = padded.view(np.uint64).T
    return out


def hamming(codes: np.ndarray, n: int, query_code: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Hamming distance of rows [0, n) of `codes` to `query_code` (words,): uint16 (n,).
    The per-word counts are first added in pairs as uint8 (two words: at most 128 bits), so the
    widening sum to uint16, the slowest of the passes, reads half as many rows."""
    words = codes.shape[0]
    pairs = words // 2
    out = np.empty(n, dtype=np.uint16) if out is None else out
    block = min(SCAN_BLOCK, max(1, n))
    xored = np.empty((words, block), dtype=np.uint64)
    counts = np.empty((words, block), dtype=np.uint8)
    summed = np.empty((words - pairs, block), dtype=np.uint8)
    q = query_code[:, None]
    for start in range(0, n, block):
        end = min(n, start + block)
        m = end - start
        np.bitwise_xor(codes[:, start:end], q, out=xored[:, :m])
        np.bitwise_count(xored[:, :m], out=counts[:, :m])
        np.add(counts[:pairs, :m], counts[words - pairs:, :m], out=summed[:pairs, :m])
        if words % 2:  # the middle word has no partner
            summed[pairs, :m] = counts[pairs, :m]
        np.sum(summed[:, :m], axis=0, dtype=np.uint16, out=out[start:end])
    return out


def nearest_rows(distances: np.ndarray, count: int) -> np.ndarray:
    """Rows of the `count` smallest distances, ties at the cut broken by row (sorted rows).
    A histogram finds the cut: two linear passes instead of an argpartition."""
    if count >= len(distances):
        return np.arange(len(distances))
    cumulative = np.cumsum(np.bincount(distances))
    cut = int(np.searchsorted(cumulative, count))  # the distance at which `count` is reached
    below = np.flatnonzero(distances < cut)
    at_cut = np.flatnonzero(distances == cut)[:count - len(below)]
    return np.sort(np.concatenate([below, at_cut]))


def rerank_count(n: int, k: int) -> int:
    """How many of `n` shortlisted rows are scored exactly for `k` results: the
    largest of RERANK_MIN, RERANK_PER_K x k and RERANK_SHARE of the rows."""
    return max(RERANK_MIN, RERANK_PER_K * k, int(RERANK_SHARE * n))


def search(codes: np.ndarray, ids: np.ndarray, matrix: np.ndarray, n: int, q: np.ndarray, k: int,
           skip: np.ndarray | None, removed: bool = True,
           scales: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """`search_many` over one key."""
    return search_many([(codes, ids, matrix, n, removed, scales)], q, k, skip)


# per key: (codes, ids, matrix, n, removed, scales): see search_many
Part = tuple[np.ndarray, np.ndarray, np.ndarray, int, bool, "np.ndarray | None"]


def search_many(parts: list[Part], q: np.ndarray, k: int,
                skip: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """(ids, scores) of the rows shortlisted by code over several keys' rows, one shortlist
    for all of them (as big as one key of all their rows would get); removed and skipped rows
    score -inf. `parts`: per key (codes, ids, matrix, n, removed, scales), `removed`: rows [0, n)
    may hold removed ones (id -1; False skips looking for them); `scales`: the rows are int8
    with these scales (arrays.py; their scores are then close, not exact), None: float32 rows.
    Not for searches as of a past moment (the caller keeps those exact: a time filter could
    leave few of the shortlisted rows)."""
    query_code = pack(q[None])[:, 0]
    offsets = np.cumsum([0] + [n for _, _, _, n, _, _ in parts])
    distances = np.empty(int(offsets[-1]), dtype=np.uint16)
    for (codes, ids, _, n, removed, _), start in zip(parts, offsets.tolist(), strict=False):
        mine = hamming(codes, n, query_code, out=distances[start:start + n])
        # Removed rows take no place in the shortlist: one past the farthest possible distance (not
        # uint16's max: nearest_rows' bincount would then count 65,536 bins per search, several times its cost).
        if removed:
            mine[ids[:n] < 0] = codes.shape[0] * 64 + 1
    rows = nearest_rows(distances, rerank_count(len(distances), k))
    bounds = np.searchsorted(rows, offsets).tolist()
    got, scored = [], []
    for (_, ids, matrix, _, _, scales), start, lo, hi in zip(parts, offsets.tolist(), bounds, bounds[1:], strict=False):
        mine = rows[lo:hi] - start
        got.append(ids[mine])
        # sorted rows: read in order
        scored.append(matrix[mine] @ q if scales is None else (matrix[mine].astype(np.float32) @ q) * scales[mine])
    got_ids = np.concatenate(got) if got else np.zeros(0, dtype=np.int64)
    scores = np.concatenate(scored) if scored else np.zeros(0, dtype=np.float32)
    scores[got_ids < 0] = -np.inf
    if skip is not None:
        scores[np.isin(got_ids, skip)] = -np.inf
    return got_ids, scores


_BYTE_BITS = np.unpackbits(np.arange(256, dtype=np.uint8)[:, None], axis=1).astype(np.float32)  # (256, 8), packbits' order


def asymmetric(codes: np.ndarray, q: np.ndarray) -> np.ndarray:
    """The dot product of the query with each code read as +-1 per dimension: float32 (rows,) for
    (words, rows) codes. A far closer estimate than the Hamming distance, which throws the query's
    magnitudes away: one table of partial sums per code byte (256 entries), then one lookup a byte."""
    words, rows = codes.shape
    padded = np.zeros(words * 64, dtype=np.float32)
    padded[:len(q)] = q
    table = (_BYTE_BITS @ padded.reshape(-1, 8).T).T  # (bytes, 256): the query's sum over each byte's set bits
    code_bytes = np.ascontiguousarray(codes.T).view(np.uint8)  # (rows, bytes), the bytes as pack wrote them
    picked = np.take(table.ravel(), code_bytes + (np.arange(words * 8, dtype=np.intp) * 256)[None, :])
    return (2.0 * picked.sum(axis=1) - padded.sum()).astype(np.float32)
