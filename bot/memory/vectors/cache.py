"""The vector search path: numpy over each visibility key's vectors, loaded from vec0.

sqlite-vec 0.1.9 (scalar build) scans each vector in scalar code, plus a fixed cost per partition;
numpy `X @ q` reads the same vectors at memory bandwidth, many times faster.
So the engine keeps, per visibility key, a float32 matrix of that key's vectors, and a scoped
KNN is one matrix-vector product per visible key: its cost is what the viewer may see.

vec0 stays the store of record. Every `vectors.put`/`vectors.remove` appends the memory id to
`vector_changes` in the same transaction; before each search the cache applies the changes it
has not seen (from any connection or process), so it answers like vec0 would. A connection
inside a write transaction may see changes that could still roll back: those are not applied
to the shared cache but scored exactly for that one search (the overlay). A key is loaded
whole from vec0's chunk tables (one blob per chunk) under the cache's lock; keys that do not
fit the memory budget are searched inside vec0 instead (`vectors.knn_vec0`). A viewer who sees
at least `codes_min` vectors over all their keys has them shortlisted by sign-bit codes first
and only the shortlist is scored in float32 (vector_codes.py); a key's codes are packed the
first time a search needs them.

The storage reads the cache makes (the change log, one key's vectors, one vector, the
fallback search) go through a `VectorSource`: SQLite's (sqlite/vec0.py), and on
PostgreSQL postgres/vector_source.py (memory_vectors; the log read by transaction). The
cache and its scoring are one code path for both.
"""
from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # many small products at once: one core each
os.environ.setdefault("OMP_NUM_THREADS", "1")

import threading
from collections import OrderedDict
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator, Protocol, Sequence

import numpy as np

from bot.memory.connection import Connection
from bot.memory.scope import ACTIVE
from bot.memory.vectors import codes as vector_codes
from bot.memory.vectors import index as vectors

SLACK_ROWS = 4             # room for a few new vectors before a key's arrays are copied
GROWTH = 1.25              # then 25 % more, so appends cost O(1) on average
MIN_DEAD_TO_COMPACT = 64
RELOAD_AFTER_CHANGES = 256  # more changes than this (and 1 % of the key) to one cached key: reload it on demand
MAX_APPLY = 10_000         # more changed ids than this in one poll: start over instead of applying them
SYNC_TRIES = 3             # log reads outside the lock before one is made under it (VectorCache._sync)
# A cold key with more vectors than this is loaded in the background (when the engine gives a
# loader) and searched in vec0 meanwhile: loading a big key takes far longer than vec0's search of it.
INLINE_LOAD_MAX = 5000
# A key of more vectors than that is loaded with this share of free rows: without them the fifth
# message in a busy channel after a start copied the whole key under the cache's
# lock, every recall waiting. Free rows are not resident until written (np.zeros' lazy pages).
LOAD_SPARE_SHARE = 1 / 8
# In a search by code, a key of fewer vectors than this is still scored whole (cheap at that
# size): packing a key's codes costs time per row once, on its first search by
# code, and a typical viewer of a big database (global by code, their channels and personal keys whole) paid
# that on every first recall in a new channel with a lower floor (measurably more CPU per
# recall). Bigger keys (a heavy user's own) join.
CODES_KEY_MIN = 5000


def spare_rows(n: int) -> int:
    return int(n * LOAD_SPARE_SHARE) if n > INLINE_LOAD_MAX else 0


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
        return self.n - self.dead

    def view(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
        return self.ids, self.created, self.matrix, self.n

    def discard(self, memory_id: int) -> None:
        row = self.row_of.pop(memory_id, None)
        if row is not None:
            self.ids[row] = -1
            self.dead += 1
            if self.dead > MIN_DEAD_TO_COMPACT and self.dead * 4 > self.n:
                self._compact()

    def add(self, memory_id: int, created_at: float, vector: np.ndarray) -> None:
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


# A changed memory as the change log's read saw it: id -> (vis_key, created_at, its vector (None:
# not read with it)) for an active memory with a vector; id -> None for one without (removed).
Changed = dict[int, "tuple[str, float, np.ndarray | None] | None"]


class Overlay(set):
    """Ids changed since the cache's mark, seen inside a transaction (their changes may still
    roll back): scored for that search alone. `states`: what the log's read gave of them."""

    def __init__(self, ids: Iterable[int], states: Changed | None) -> None:
        super().__init__(ids)
        self.states = states


class VectorSource(Protocol):
    """The storage reads of the cache, per backend. A mark is opaque to the cache: where in the
    change log it has read up to."""

    def poll(self, conn: Any, mark: Any) -> tuple[str | None, list[int], Any, bool, Changed | None]:
        """(the index's epoch, ids changed since `mark` (None: none, just the current mark), the
        mark after them, False when the log was pruned past `mark`, and the changed memories as
        of that mark when the same read gives them (else None: `_apply` reads them))."""
    def changed_between(self, conn: Any, older: Any, newer: Any) -> set[int]: ...
    def key_size_at_least(self, conn: Any, key: str, cap: int) -> int: ...
    def load_key(self, conn: Any, info: vectors.IndexInfo, key: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]: ...
    def read_vectors(self, conn: Any, info: vectors.IndexInfo, ids: Sequence[int]) -> dict[int, np.ndarray]: ...
    def search(self, conn: Any, info: vectors.IndexInfo, query: list[float], keys: list[str], k: int,
               as_of: float | None) -> list[tuple[int, float]]:
        """The store's own exact search (keys the cache does not hold)."""
    def similar_to_memory(self, conn: Any, info: vectors.IndexInfo, memory_id: int, keys: list[str],
                          k: int) -> list[tuple[int, float]]: ...
_EMPTY: dict[int, KeyVectors] = {}


class _NoSource:
    """A cache not yet given its backend's source: any read is a programming error."""

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError("this VectorCache has no source yet: attach it to a connection (vec0.attach_cache) "
                           "or hand it to a storage backend")


def _empty_key(dim: int) -> KeyVectors:
    """A key without vectors, shared: its searches never write to it (only cached keys get appends)."""
    empty = _EMPTY.get(dim)
    if empty is None:
        empty = _EMPTY[dim] = KeyVectors(np.zeros(0, dtype=np.int64), np.zeros(0), np.zeros((0, dim), dtype=np.float32))
    return empty


class VectorCache:
    """Shared by all connections of one engine (attach with `vectors.attach_cache`)."""

    def __init__(self, budget_bytes: int, source: VectorSource | None = None, codes_min: int = 0):
        self.budget_bytes = budget_bytes
        # where the vectors come from: the backend sets it (SQLite: vec0.attach_cache; PostgreSQL: its storage)
        self.source: VectorSource = source or _NoSource()
        # A search over at least this many vectors (all the viewer's keys) shortlists them by sign
        # code, then rescores exactly (vector_codes.py); 0: never.
        self.codes_min = codes_min
        self._lock = threading.Lock()
        self._keys: OrderedDict[str, KeyVectors] = OrderedDict()  # least recently used first
        self._key_of: dict[int, str] = {}
        self._too_big: set[str] = set()
        self._loading: set[str] = set()  # keys a thread is loading now (outside the lock)
        self._packing: set[str] = set()  # keys whose codes a thread is packing now (outside the lock)
        # Keys that held vectors when a warm listed them, and keys given a vector since (applied
        # changes): once a warm has listed them, a key in neither is empty and needs no read
        # (a viewer's own personal keys mostly are: two reads each, per recall).
        self._listed: set[str] | None = None
        self._given: set[str] = set()
        self._generation = 0
        # Runs `job(connection)` on another thread, later (the engine's loader); None: load inline.
        self.background: Callable[[Callable[[Connection], object]], None] | None = None
        self._identity: tuple | None = None
        self._seq: Any = 0  # the source's mark: SQLite's last applied seq, PostgreSQL's snapshot
        self._applied = 0  # how many polls' changes were applied (_sync: did one land meanwhile?)
        self._bytes = 0
        self._reads = threading.local()  # one_log_read: this thread's block, and whether it read the log

    def has_source(self) -> bool:
        """Whether a backend has given this cache the source of its vectors."""
        return not isinstance(self.source, _NoSource)

    @contextmanager
    def one_log_read(self) -> Iterator[None]:
        """Within the block, this thread's searches read the change log once (the first one):
        the searches of one fact write's planning (2-3, each a round trip on PostgreSQL) answer
        as of that read; the write checks against its plan's mark whether any vector changed since."""
        outer = getattr(self._reads, "active", False)
        self._reads.active = True
        try:
            yield
        finally:
            if not outer:
                self._reads.active = self._reads.synced = False

    # -- bookkeeping --------------------------------------------------------

    @property
    def nbytes(self) -> int:
        return self._bytes

    def cached_keys(self) -> list[str]:
        return list(self._keys)

    def _reset(self) -> None:
        self._generation += 1  # voids the loads in flight (_entry)
        self._keys.clear()
        self._key_of.clear()
        self._too_big.clear()
        self._listed = None
        self._given.clear()
        self._bytes = 0

    def read_ahead(self, conn: Connection) -> tuple[Any, int, int] | None:
        """In a one_log_read block that has not read the log yet, outside a transaction: where to
        read it from, for a caller that reads it in a statement of its own (storage.plan_state)
        and hands it to `take_read_ahead`; None: the searches read it themselves."""
        if not getattr(self._reads, "active", False) or getattr(self._reads, "synced", False) \
                or not conn.get_autocommit():
            return None
        with self._lock:
            return None if self._identity is None else (self._seq, self._applied, self._generation)

    def take_read_ahead(self, conn: Connection, info: vectors.IndexInfo, ahead: tuple[Any, int, int],
                        polled: tuple[str | None, list[int], Any, bool, Changed | None]) -> None:
        """The log read from `ahead`'s mark (read_ahead): applied as a search's own read would be
        (_sync), unless another thread applied changes or started over meanwhile: then the
        block's first search reads it again."""
        _, applied, generation = ahead
        with self._lock:
            if self._applied != applied or self._generation != generation:
                return
            overlay = self._take(conn, info, polled, fresh=False)
        if overlay is not None:
            self._reads.synced = True

    def _sync(self, conn: Connection, info: vectors.IndexInfo) -> set[int] | None:
        """Apply committed changes; returns the ids changed in `conn`'s open transaction (if any),
        to be scored exactly by the caller instead; None when the cache cannot answer now (the
        table was re-created in that open transaction).
        The log is read outside the lock (on PostgreSQL a network round trip, which every search
        of the process waited behind while one thread read it) and applied under the lock only if
        no other thread applied changes or started over meanwhile: then the cache is as it was when
        the read began, so applying it is what one read under the lock would have done (another
        thread that only moved the mark found no change, and so nothing this read missed). Else it
        is read again from the new mark; after SYNC_TRIES such races, under the lock as before."""
        once = getattr(self._reads, "active", False) and conn.get_autocommit()
        if once and getattr(self._reads, "synced", False):
            return set()  # one_log_read: read already in this block
        overlay = self._read_log(conn, info)
        if once and overlay is not None:
            self._reads.synced = True
        return overlay

    def _read_log(self, conn: Connection, info: vectors.IndexInfo) -> set[int] | None:
        for _ in range(SYNC_TRIES):
            with self._lock:
                if self._identity is None:
                    break  # the first read sets the identity: under the lock, once
                seq, applied, generation = self._seq, self._applied, self._generation
            polled = self.source.poll(conn, seq)
            with self._lock:
                if self._applied == applied and self._generation == generation:
                    return self._take(conn, info, polled, fresh=False)
        with self._lock:
            fresh = self._identity is None
            return self._take(conn, info, self.source.poll(conn, None if fresh else self._seq), fresh=fresh)

    def _take(self, conn: Connection, info: vectors.IndexInfo,
              polled: tuple[str | None, list[int], Any, bool, Changed | None], *, fresh: bool) -> set[int] | None:
        """_sync under the lock: apply `polled`, read from the current mark (from none: `fresh`)."""
        epoch, changed, mark, complete, states = polled
        identity = (epoch, info.model, info.dim)
        if identity != self._identity:
            if not conn.get_autocommit():
                return None
            self._reset()
            self._identity = identity
            self._seq = mark if fresh else self.source.poll(conn, None)[2]
            return set()
        if not conn.get_autocommit():
            return Overlay(changed, states)  # maybe uncommitted: scored for this search only, the mark stays
        # Start over when the log was pruned past us, even if nothing is left to read: on
        # PostgreSQL a long transaction's change can commit after newer ones and be pruned
        # before we saw it (skipping it would keep a vector under its old key for good).
        # Also when the changes are too many to apply one by one (one SQL parameter each).
        if not complete or len(changed) > MAX_APPLY:
            self._reset()
        elif changed:
            self._apply(conn, info, set(changed), states)
            self._applied += 1
        self._seq = mark
        return set()

    def _apply(self, conn: Connection, info: vectors.IndexInfo, ids: set[int],
               states: Changed | None = None) -> None:
        """Apply the changes of `ids`; `states`: what the log's read gave of them (PostgreSQL: their
        keys and vectors in the same round trip; two more were a round trip each per write)."""
        if not ids:  # a load's catch-up may find none: PostgreSQL's mark moves with any commit, and `IN ()` is an error there
            return
        if states is not None:
            now = {mid: (state[0], state[1], 1) for mid, state in states.items() if state is not None}
        else:
            marks = ",".join("?" * len(ids))
            now = {row[0]: row[1:] for row in conn.execute(
                f"SELECT id, vis_key, created_at, embedded FROM memories WHERE id IN ({marks}) AND {ACTIVE}", tuple(ids))}
        per_key: dict[str, int] = {}
        for memory_id in ids:
            old_key = self._key_of.pop(memory_id, None)
            if old_key is not None and old_key in self._keys:
                self._keys[old_key].discard(memory_id)
            state = now.get(memory_id)
            if state is not None and state[2]:
                per_key[state[0]] = per_key.get(state[0], 0) + 1
                self._given.add(state[0])
        for key, count in per_key.items():
            if key in self._keys and count > max(RELOAD_AFTER_CHANGES, self._keys[key].live // 100):
                self._drop(key)
            self._too_big.discard(key)
        wanted = [memory_id for memory_id in ids
                  if (state := now.get(memory_id)) is not None and state[2] and state[0] in self._keys]
        found: dict[int, np.ndarray] = {}
        if states is not None:
            found = {mid: vector for mid in wanted if (vector := _read_with(states, mid, info.dim)) is not None}
        missing = [memory_id for memory_id in wanted if memory_id not in found]
        if missing:
            found.update(self.source.read_vectors(conn, info, missing))
        for memory_id in wanted:
            state = now[memory_id]
            vector = found.get(memory_id)
            if vector is not None:
                entry = self._keys[state[0]]
                before = entry.nbytes
                entry.add(memory_id, state[1], vector)
                self._bytes += entry.nbytes - before
                self._key_of[memory_id] = state[0]

    def _evict_beside(self, key: str) -> None:
        """Under the lock, after `key` grew or arrived: drop the least recently used other keys
        until the cache fits its budget again (`key` stays, even alone over the budget)."""
        while self._bytes > self.budget_bytes and len(self._keys) > 1:
            self._drop(next(other for other in self._keys if other != key))

    def _drop(self, key: str) -> None:
        entry = self._keys.pop(key)
        self._bytes -= entry.nbytes
        for memory_id in entry.row_of:
            self._key_of.pop(memory_id, None)

    def _entry(self, conn: Connection, info: vectors.IndexInfo, key: str, *,
               may_defer: bool = True) -> KeyVectors | None:
        """The key's vectors, loading them if needed (only outside a write transaction, whose
        rows could still roll back); None = search this key inside vec0. That is also the answer
        while another thread loads the key, and (`may_defer`) for a key of more than INLINE_LOAD_MAX
        vectors when a background loader is set: it is loaded there (a busy channel's key takes far longer
        to load than vec0 takes to answer it, and a recall after a restart waited for the load).
        Loads run outside the lock, so searches of other keys go on beside them."""
        with self._lock:
            entry = self._keys.get(key)
            if entry is not None:
                self._keys.move_to_end(key)
                return entry
            if self._listed is not None and key not in self._listed and key not in self._given:
                return _empty_key(info.dim)
            if key in self._too_big or key in self._loading or not conn.get_autocommit():
                return None
        background = self.background
        if (background is not None and may_defer
                and self.source.key_size_at_least(conn, key, INLINE_LOAD_MAX) > INLINE_LOAD_MAX):
            with self._lock:
                if key in self._keys or key in self._loading:
                    return self._keys.get(key)
                self._loading.add(key)
            try:
                background(lambda loader: self._load(loader, info, key))
            except Exception:  # the loader is shut down: the key stays cold, vec0 answers
                with self._lock:
                    self._loading.discard(key)
            return None
        with self._lock:
            if key in self._keys or key in self._loading:
                return self._keys.get(key)
            self._loading.add(key)
        return self._load(conn, info, key)

    def _load(self, conn: Connection, info: vectors.IndexInfo, key: str) -> KeyVectors | None:
        """Load a key marked as loading (by the caller, under the lock) and publish it; changes
        applied by other threads meanwhile are caught up first."""
        try:
            with self._lock:
                generation, seq = self._generation, self._seq
            if not conn.get_autocommit():
                return None
            ids, created, matrix = self.source.load_key(conn, info, key)
            # Built off the lock: the copy, the id map and the codes take long for a big key,
            # and every search waits for the lock.
            entry = (KeyVectors(ids, created, matrix, spare_rows(len(ids)), coded=self._coded(len(ids)))
                     if matrix.nbytes <= self.budget_bytes
                     else None)
            with self._lock:
                if self._generation != generation:
                    return None  # the cache started over meanwhile (new index, pruned log): this load is void
                if entry is None:
                    self._too_big.add(key)
                    return None
                self._keys[key] = entry
                self._bytes += entry.nbytes
                for memory_id in entry.row_of:
                    self._key_of[memory_id] = key
                if self._seq != seq:  # applied while loading, skipped for this key: apply again
                    # only what may concern this key: ids applied to another cached key since are
                    # right there (applying them again left a dead row and a copy behind)
                    changed = self.source.changed_between(conn, seq, self._seq)
                    self._apply(conn, info, {i for i in changed if self._key_of.get(i, key) == key})
                self._evict_beside(key)
                return self._keys.get(key)
        finally:
            with self._lock:
                self._loading.discard(key)

    def warm(self, conn: Connection, info: vectors.IndexInfo, stop: threading.Event | None = None) -> int:
        """Load every key that fits the budget, largest first (the keys most viewers see), so that
        no recall pays a cold load (cheap for a small key, slow for a big one). Each key
        loads like a recall's own cold load would (`_entry`), so it is safe beside searches and
        writes. Stops early when `stop` is set. Returns how many keys it loaded."""
        if not conn.get_autocommit() or self._sync(conn, info) is None:
            return 0
        per_vector = info.dim * 4 + 16  # matrix row + id + created_at (+ a code in a key searched by code)
        loaded = 0
        with self._lock:
            generation = self._generation
        sizes = [(str(key), int(count)) for key, count in conn.execute(
            f"SELECT vis_key, count(*) AS n FROM memories WHERE embedded = 1 AND {ACTIVE} "
            "GROUP BY vis_key ORDER BY n DESC, vis_key")]
        with self._lock:
            # Every key with a vector: those listed (the list was read after the sync above), and
            # those given one since by a change (_apply adds them to _given, also ones applied by
            # other threads meanwhile).
            if self._generation == generation:
                self._listed = {key for key, _ in sizes}
        for key, count in sizes:
            if stop is not None and stop.is_set():
                break
            with self._lock:
                if key in self._keys or key in self._too_big or key in self._loading:
                    continue
                # with its codes if a search by code may pack them (_code_keys), not only when its
                # load does: else those searches pushed the cache over its budget, evicting keys
                row_bytes = per_vector + (vector_codes.words_for(info.dim) * 8 if self._may_code(count) else 0)
                if self._bytes + (count + SLACK_ROWS + spare_rows(count)) * row_bytes > self.budget_bytes:
                    continue  # would evict a key already warm
            if self._entry(conn, info, key, may_defer=False) is not None:
                loaded += 1
        return loaded

    # -- search ---------------------------------------------------------------

    def _coded(self, n: int) -> bool:
        """A search over `n` vectors shortlists them by code (vector_codes.py)."""
        return 0 < self.codes_min <= n

    def _key_coded(self, n: int) -> bool:
        """In a search by code, a key of `n` vectors is shortlisted (else scored whole): one big
        enough to be searched by code alone always is."""
        return n >= min(CODES_KEY_MIN, self.codes_min)

    def _may_code(self, n: int) -> bool:
        """A key of `n` vectors may get codes, at its load or on a search by code."""
        return self.codes_min > 0 and self._key_coded(n)

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

    def knn(self, conn: Connection, info: vectors.IndexInfo, query: Sequence[float], keys: list[str],
            k: int, as_of: float | None = None) -> list[tuple[int, float]]:
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
        exact, parts = [], []
        for view, codes, removed in views:
            if coded and codes is not None and self._key_coded(view[3]):
                ids, _, matrix, n = view
                parts.append((codes, ids, matrix, n, removed))
            else:
                exact.append(view)
        scored = top_scores_of(*vector_codes.search_many(parts, q, k, skip), k) if parts else []
        scored += top_scores_over(exact, q, k, as_of, skip)
        if in_vec0:
            scored += [(1.0 - d * d / 2.0, mid) for mid, d in self.source.search(conn, info, q.tolist(), in_vec0, k, as_of)
                       if mid not in overlay]
        if overlay:
            scored += self._overlay_scores(conn, info, overlay, set(keys), q, as_of)
        scored.sort(key=lambda item: (-item[0], item[1]))
        return [(mid, distance_of(score)) for score, mid in scored[:k]]

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
            for memory_id in ids:
                key = self._key_of.get(memory_id)
                entry = self._keys.get(key) if key is not None and memory_id not in overlay else None
                row = entry.row_of.get(memory_id) if entry is not None else None
                if entry is not None and row is not None:
                    found.append((memory_id, entry.matrix[row]))
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
                vector = _read_with(states, memory_id, info.dim)
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
                ids, _, matrix, n = entry.view()
                rows = [entry.row_of.get(mid) for mid in wanted]
            ids, matrix = ids[:n], matrix[:n]
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


def _read_with(states: Changed, memory_id: int, dim: int) -> np.ndarray | None:
    """The vector the log's read gave for `memory_id`, if it has the index's size."""
    state = states.get(memory_id)
    vector = state[2] if state is not None else None
    return vector if vector is not None and len(vector) == dim else None


def unit(vector: Sequence[float]) -> np.ndarray:
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
    if len(scores) > k:
        top = np.argpartition(-scores, k - 1)[:k]
    else:
        top = np.arange(len(scores))
    return [(float(scores[i]), int(ids[i])) for i in top if scores[i] != -np.inf]
