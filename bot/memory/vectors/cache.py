"""The vector search path: numpy over each visibility key's vectors, loaded from vec0.

sqlite-vec 0.1.9 (scalar build) scans each vector in scalar code, plus a fixed cost per partition;
numpy `X @ q` reads the same vectors at memory bandwidth, many times faster.
So the engine keeps, per visibility key, a matrix of that key's vectors, and a scoped
KNN is one matrix-vector product per visible key: its cost is what the viewer may see. The
matrix is float32 or, by default, int8 with a scale per row (arrays.py, MUNINN_VECTOR_FORM):
int8 scores choose a short list whose stored float32 vectors are read in one go and give the
exact scores returned (`_rescored`).

vec0 stays the store of record. Every `vectors.put`/`vectors.remove` appends the memory id to
`vector_changes` in the same transaction; before each search the cache applies the changes it
has not seen (from any connection or process), so it answers like vec0 would. A connection
inside a write transaction may see changes that could still roll back: those are not applied
to the shared cache but scored exactly for that one search (the overlay). A key is loaded
whole from vec0's chunk tables (one blob per chunk) under the cache's lock; keys that do not
fit the memory budget are held partially when they are big (their ids and sign codes, the best
candidates read back from the store: partial.py) and searched inside vec0 otherwise (`vectors.knn_vec0`). A viewer who sees
at least `codes_min` vectors over all their keys has them shortlisted by sign-bit codes first
and only the shortlist is scored in float32 (vector_codes.py); a key's codes are packed the
first time a search needs them.

The storage reads the cache makes (the change log, one key's vectors, one vector, the
fallback search) go through a `VectorSource`: SQLite's (sqlite/vec0.py), and on
PostgreSQL postgres/vector_source.py (memory_vectors; the log read by transaction). The
cache and its scoring are one code path for both.

The parts: arrays.py (one key's arrays, the numpy scoring), source.py (the VectorSource
protocol, what a read of the change log gives), keys.py (the keys held: sync with the log,
loads, evictions, warming), partial.py and partial_keys.py (the keys held partially),
shared.py and snapshot.py (the keys mapped from one snapshot file that every process on the
machine shares); this module, the searches over them.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from bot.memory.connection import Connection
from bot.memory.scope import ACTIVE
from bot.memory.vectors import codes as vector_codes
from bot.memory.vectors import index as vectors
from bot.memory.vectors.arrays import KeyVectors, distance_of, rescore_count, top_scores_of, top_scores_over, unit
from bot.memory.vectors.shared import SharedKeys
from bot.memory.vectors.source import Overlay, read_with


class VectorCache(SharedKeys):
    """Shared by all connections of one engine (attach with `vectors.attach_cache`)."""

    # -- search ---------------------------------------------------------------

    def _code_keys(self, entries: list[tuple[str, KeyVectors]]) -> None:
        """Pack the codes of keys searched by code for the first time (once per key, in time
        proportional to its rows, off the lock; a key whose arrays regrow meanwhile stays exact).
        The codes and their bytes count only while the key still holds this entry (not evicted,
        reloaded or reset meanwhile). One thread packs a key: a search that finds it being packed
        scores it whole meanwhile (four first searches at once packed it four times). Installed
        codes evict other keys, least recently used first, as a load does (the budget holds)."""
        for key, entry in entries:
            if entry.codes is not None or not self._key_coded(entry.n):
                continue
            with self._lock:  # the arrays and their row count from one moment (a regrow swaps them)
                if self._keys.get(key) is not entry or key in self._packing:
                    continue
                self._packing.add(key)
                rows = entry.matrix, entry.n
            packed = None
            try:
                packed = KeyVectors.pack_codes(*rows)
            finally:
                with self._lock:
                    self._packing.discard(key)
                    if packed is not None and self._keys.get(key) is entry:
                        before = entry.nbytes
                        entry.install_codes(packed)
                        self._bytes += entry.nbytes - before
                        self._evict_beside(key)

    def answers_alone(self, keys: Sequence[str]) -> bool:
        """Whether every one of `keys` is held whole (or known to hold no vector): a search of them
        is then this process's own work, with no search in the database."""
        with self._lock:
            return all(key in self._keys or (self._listed is not None and key not in self._listed
                                              and key not in self._given) for key in keys)

    def knn(self, conn: Connection, info: vectors.IndexInfo, query: Sequence[float], keys: list[str],
            k: int, as_of: float | None = None) -> list[tuple[int, float]]:
        """The k nearest vectors under `keys` to `query`: [(id, L2 distance)], nearest first (only those
        stored by `as_of`, when given). Cached keys are scored here and the others searched by the source;
        changes in `conn`'s open transaction are scored for this search alone. VectorSizeError for a zero
        or non-finite query."""
        q = unit(query)
        overlay = self._sync(conn, info)
        if overlay is None:
            return self.source.search(conn, info, q.tolist(), keys, k, as_of)
        entries, in_vec0 = [], []
        for key in dict.fromkeys(keys):
            entry = self._entry(conn, info, key)
            if entry is None:
                in_vec0.append(key)
            else:
                entries.append((key, entry))
        # A viewer who sees at least codes_min vectors, over all their keys, gets one shortlist by
        # code over all of them but the small ones (a heavy user's DM: many vectors in keys each
        # too small for codes on its own, costly to read whole at every search). As of a past moment:
        # exact. A shortlist is chosen before the time filter, which could leave few of its rows
        # (recall falls far when few rows qualify).
        coded = as_of is None and self._coded(sum(entry.n for _, entry in entries))
        if coded:
            self._code_keys(entries)
        with self._lock:  # each key's arrays and codes from one moment (a regrow swaps them)
            views = [(entry.view(), entry.codes, entry.dead > 0) for _, entry in entries]
        skip = np.fromiter(overlay, dtype=np.int64) if overlay else None
        partly: list[tuple[float, int]] = []
        if in_vec0 and as_of is None:  # keys held partially: exact scores of their best candidates
            partly, in_vec0 = self._partial_search(conn, info, in_vec0, q, k, skip)
        exact, parts = [], []
        for view, codes, removed in views:
            if coded and codes is not None and self._key_coded(view[3]):
                ids, _, matrix, n, scales = view
                parts.append((codes, ids, matrix, n, removed, scales))
            else:
                exact.append(view)
        # int8 rows give close scores: the best `short` of them are rescored exactly below
        short = k if self.form == "float32" else rescore_count(k)
        scored = top_scores_of(*vector_codes.search_many(parts, q, k, skip), short) if parts else []
        scored += top_scores_over(exact, q, short, as_of, skip)
        if self.form != "float32":
            scored = self._rescored(conn, info, scored, q, short)
        scored += partly
        if in_vec0:
            scored += [(1.0 - d * d / 2.0, mid) for mid, d in self.source.search(conn, info, q.tolist(), in_vec0, k, as_of)
                       if mid not in overlay]
        if overlay:
            scored += self._overlay_scores(conn, info, overlay, set(keys), q, as_of)
        scored.sort(key=lambda item: (-item[0], item[1]))
        return [(mid, distance_of(score)) for score, mid in scored[:k]]

    def _rescored(self, conn: Connection, info: vectors.IndexInfo, scored: list[tuple[float, int]],
                  q: np.ndarray, short: int) -> list[tuple[float, int]]:
        """The `short` best of `scored` (close scores of int8 rows) with their exact scores, from
        the stored float32 vectors read in one go; one no longer stored (removed since the sync)
        is left out, as the next sync would."""
        if not scored:
            return scored
        scored.sort(key=lambda item: (-item[0], item[1]))
        wanted = [mid for _, mid in scored[:short]]
        found = self.source.read_vectors(conn, info, wanted)
        return [(float(found[mid] @ q), mid) for mid in wanted if mid in found]

    def cosines(self, conn: Connection, info: vectors.IndexInfo, query: Sequence[float],
                ids: Sequence[int], *, synced: bool = False) -> dict[int, float]:
        """Cosine to `query` of each id whose vector is in a cached key (a recall has just
        loaded the viewer's keys for its search), without touching vec0. Ids changed in an
        open transaction, or not cached, are left out: the caller reads those from vec0.
        `synced`: outside a transaction, just after a search that synced (no second log read)."""
        q = unit(query)
        overlay = set() if synced and self._identity is not None else self._sync(conn, info)
        if overlay is None:
            return {}
        found: list[tuple[int, np.ndarray]] = []
        with self._lock:  # rows are never rewritten in place (KeyVectors): the row views stay valid
            located = self._key_of.locate([memory_id for memory_id in ids if memory_id not in overlay])
            found = [(memory_id, self._keys[key].matrix[row]) for memory_id, (key, row) in located.items()]
        if not found:
            return {}
        if self.form != "float32":  # int8 rows are close, not exact: the stored vectors, read in one go
            stored = self.source.read_vectors(conn, info, [memory_id for memory_id, _ in found])
            found = [(memory_id, stored[memory_id]) for memory_id, _ in found if memory_id in stored]
            if not found:
                return {}
        rows = np.stack([vector for _, vector in found])
        # vec0's vec_distance_cosine divides by both norms; so does this (stored vectors are unit already).
        scores = (rows @ q) / np.maximum(np.linalg.norm(rows, axis=1), np.finfo(np.float32).tiny)
        return {memory_id: float(score) for (memory_id, _), score in zip(found, scores.tolist(), strict=True)}

    def _overlay_scores(self, conn: Connection, info: vectors.IndexInfo, ids: set[int], keys: set[str],
                        q: np.ndarray, as_of: float | None) -> list[tuple[float, int]]:
        states = ids.states if isinstance(ids, Overlay) else None
        scored: list[tuple[float, int]] = []
        if states is not None:  # the log's read gave them (PostgreSQL): no more round trips
            left = set()
            for memory_id in ids:
                state = states.get(memory_id)
                vector = read_with(states, memory_id, info.dim)
                if state is None:
                    continue  # removed
                if vector is None:
                    left.add(memory_id)
                elif state[0] in keys and (as_of is None or state[1] <= as_of):
                    scored.append((float(vector @ q), memory_id))
            ids = left
            if not ids:
                return scored
        marks = ",".join("?" * len(ids))
        wanted = [memory_id for memory_id, vis_key, created_at in conn.execute(
                  f"SELECT id, vis_key, created_at FROM memories WHERE id IN ({marks}) AND embedded = 1 AND {ACTIVE}",
                  tuple(ids)) if vis_key in keys and (as_of is None or created_at <= as_of)]
        found = self.source.read_vectors(conn, info, wanted)
        return scored + [(float(found[memory_id] @ q), memory_id) for memory_id in wanted if memory_id in found]

    def neighbours(self, conn: Connection, info: vectors.IndexInfo, items: Sequence[tuple[int, str]],
                   k: int, block_bytes: int = 64 << 20) -> dict[int, list[tuple[int, float]]]:
        """For each (memory id, its key): its k nearest other vectors under that same key, as
        (id, distance), nearest first. One matrix product per key and block of queries (BLAS
        gemm), instead of one search per memory. Outside write transactions only."""
        out: dict[int, list[tuple[int, float]]] = {}
        by_key: dict[str, list[int]] = {}
        for memory_id, key in items:
            by_key.setdefault(key, []).append(memory_id)
        usable = self._sync(conn, info) is not None
        for key, wanted in by_key.items():
            entry = self._entry(conn, info, key, may_defer=False) if usable else None
            if entry is None:
                for memory_id in wanted:
                    out[memory_id] = self.source.similar_to_memory(conn, info, memory_id, [key], k)
                continue
            with self._lock:  # the rows and the arrays they index, from one moment
                ids, _, matrix, n, scales = entry.view()
                rows = [entry.row_of.get(mid) for mid in wanted]
            ids, matrix = ids[:n], matrix[:n]
            if scales is not None:  # int8 rows: the key's exact rows, read from the store as a load does
                ids, _, matrix = self.source.load_key(conn, info, key)
                row_of = {int(mid): row for row, mid in enumerate(ids.tolist())}
                rows = [row_of.get(mid) for mid in wanted]
                n = len(ids)
            present = [(mid, row) for mid, row in zip(wanted, rows, strict=True) if row is not None]
            step = max(1, block_bytes // max(1, 4 * n))
            for start in range(0, len(present), step):
                block = present[start:start + step]
                scores = matrix[[row for _, row in block]] @ matrix.T  # len(block) x n, rows contiguous
                scores[:, ids < 0] = -np.inf
                for line, (mid, row) in enumerate(block):
                    row_scores = scores[line]
                    row_scores[row] = -np.inf
                    out[mid] = sorted(((other, distance_of(score)) for score, other in top_scores_of(ids, row_scores, k)),
                                      key=lambda pair: (pair[1], pair[0]))
        return out
