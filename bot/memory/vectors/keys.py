"""The keys a vector cache holds in memory: kept in step with the change log, loaded, evicted, warmed."""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from contextlib import contextmanager
from typing import Any, Callable, Iterator

import numpy as np

from bot.memory.connection import Connection
from bot.memory.scope import ACTIVE
from bot.memory.vectors import codes as vector_codes
from bot.memory.vectors import index as vectors
from bot.memory.vectors.admission import SecondHit
from bot.memory.vectors.arrays import FORMS, SLACK_ROWS, KeyVectors
from bot.memory.vectors.lookup import KeyIndex, listed
from bot.memory.vectors.source import Changed, Overlay, VectorSource, read_with

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
# A key found too big for the whole budget is searched in the database, and not loaded again for
# this long: new vectors only make it bigger, and each load of a busy channel's key read all of
# it again (its every new message cleared the mark); removals, which may make it fit, are retried then.
TOO_BIG_RETRY_S = 600.0


def spare_rows(n: int) -> int:
    """Free rows to load a key of `n` vectors with: a share of `n` for a key too big to load inline, else none."""
    return int(n * LOAD_SPARE_SHARE) if n > INLINE_LOAD_MAX else 0


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


class CachedKeys:
    """The state of a VectorCache (cache.py, its searches): the keys it holds and their bookkeeping."""

    def __init__(self, budget_bytes: int, source: VectorSource | None = None, codes_min: int = 0,
                 form: str = "float32"):
        if form not in FORMS:
            raise ValueError(f"vector form must be one of {', '.join(FORMS)}, not {form!r}")
        self.budget_bytes = budget_bytes
        # How keys hold their rows (arrays.py): float32 as stored, or int8 with a scale per row,
        # whose search results the cache rescores exactly from the source (VectorCache.knn).
        self.form = form
        self._second_hit = SecondHit(0.0)  # which cold keys a background load admits (the source's `admit_window_s`)
        # where the vectors come from: the backend sets it (SQLite: vec0.attach_cache; PostgreSQL: its storage)
        self.source = source or _NoSource()
        # A search over at least this many vectors (all the viewer's keys) shortlists them by sign
        # code, then rescores exactly (vector_codes.py); 0: never.
        self.codes_min = codes_min
        self._lock = threading.Lock()
        self._keys: OrderedDict[str, KeyVectors] = OrderedDict()  # least recently used first
        self._key_of = KeyIndex(self._keys)  # memory id -> the cached key holding its vector
        self._too_big: dict[str, float] = {}  # key -> when it was found too big (_still_too_big)
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

    @property
    def source(self) -> VectorSource:
        """Where the vectors come from (the backend's VectorSource)."""
        return self._source

    @source.setter
    def source(self, source: VectorSource) -> None:
        self._source = source
        given = not isinstance(source, _NoSource)  # a _NoSource raises on any attribute read
        self._second_hit.window_s = getattr(source, "admit_window_s", 0.0) if given else 0.0

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
        """The bytes the cached keys take, counted against `budget_bytes`."""
        return self._bytes

    def cached_keys(self) -> list[str]:
        """The keys held now, least recently used first."""
        return list(self._keys)

    def _reset(self) -> None:
        self._generation += 1  # voids the loads in flight (_entry)
        self._keys.clear()
        self._key_of.clear()
        self._too_big.clear()
        self._listed = None
        self._given.clear()
        self._second_hit.clear()
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
        wanted = [memory_id for memory_id in ids
                  if (state := now.get(memory_id)) is not None and state[2] and state[0] in self._keys]
        found: dict[int, np.ndarray] = {}
        if states is not None:
            found = {mid: vector for mid in wanted if (vector := read_with(states, mid, info.dim)) is not None}
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

    def _still_too_big(self, key: str) -> bool:
        """Under the lock: whether `key` was found too big for the budget less than TOO_BIG_RETRY_S ago."""
        found = self._too_big.get(key)
        if found is None:
            return False
        if time.monotonic() - found < TOO_BIG_RETRY_S:
            return True
        del self._too_big[key]
        return False

    def _evict_beside(self, key: str) -> None:
        """Under the lock, after `key` grew or arrived: drop the least recently used other keys
        until the cache fits its budget again (`key` stays, even alone over the budget)."""
        while self._bytes > self.budget_bytes and len(self._keys) > 1:
            self._drop(next(other for other in self._keys if other != key))

    def _drop(self, key: str) -> None:
        entry = self._keys.pop(key)
        self._bytes -= entry.nbytes
        for memory_id in listed(entry.row_of):
            self._key_of.pop(memory_id, None)

    def _entry(self, conn: Connection, info: vectors.IndexInfo, key: str, *,
               may_defer: bool = True) -> KeyVectors | None:
        """The key's vectors, loading them if needed (only outside a write transaction, whose
        rows could still roll back); None = search this key inside vec0. That is also the answer
        while another thread loads the key, and (`may_defer`) for a key of more than INLINE_LOAD_MAX
        vectors (or the source's lower `inline_load_max`) when a background loader is set: it is
        loaded there (a busy channel's key takes far longer to load than vec0 takes to answer it,
        and a recall after a restart waited for the load).
        Loads run outside the lock, so searches of other keys go on beside them."""
        with self._lock:
            entry = self._keys.get(key)
            if entry is not None:
                self._keys.move_to_end(key)
                return entry
            if self._listed is not None and key not in self._listed and key not in self._given:
                return _empty_key(info.dim)
            if self._still_too_big(key) or key in self._loading or not conn.get_autocommit():
                return None
        background = self.background
        if background is not None and may_defer and self._defer(conn, info, key):
            with self._lock:
                if key in self._keys or key in self._loading:
                    return self._keys.get(key)
                if not self._second_hit.admit(key):
                    return None  # met once: the store searches it; loaded when met again soon
                self._loading.add(key)
            try:
                background(lambda loader: self._load(loader, info, key, count_first=True))
            except Exception:  # the loader is shut down: the key stays cold, vec0 answers
                with self._lock:
                    self._loading.discard(key)
            return None
        with self._lock:
            if key in self._keys or key in self._loading:
                return self._keys.get(key)
            self._loading.add(key)
        return self._load(conn, info, key)

    def _defer(self, conn: Connection, info: vectors.IndexInfo, key: str) -> bool:
        """Whether a cold key is loaded on the loader rather than by the search that wants it (a big
        one; a source may load more slowly than it searches: its own, lower bound `inline_load_max`)."""
        most = min(INLINE_LOAD_MAX, getattr(self.source, "inline_load_max", INLINE_LOAD_MAX))
        return self.source.key_size_at_least(conn, key, most) > most

    def key_bytes(self, count: int, dim: int) -> int:
        """The bytes a key of `count` vectors takes in this cache once loaded, as the budget counts
        them (KeyVectors.nbytes): its rows with their free rows, each with its id, time and scale,
        and its codes when a search by code may pack them."""
        codes = vector_codes.words_for(dim) * 8 if self._may_code(count) else 0
        return (count + SLACK_ROWS + spare_rows(count)) * (KeyVectors.row_bytes(dim, self.form) + codes)

    def fitting_rows(self, dim: int) -> int:
        """The most vectors one key may hold and still fit the whole budget (`key_bytes`)."""
        low, high = 0, self.budget_bytes // max(1, dim) + 1  # no row takes less than `dim` bytes
        while low < high:
            mid = (low + high + 1) // 2
            if self.key_bytes(mid, dim) <= self.budget_bytes:
                low = mid
            else:
                high = mid - 1
        return low

    def _load(self, conn: Connection, info: vectors.IndexInfo, key: str, *,
              count_first: bool = False) -> KeyVectors | None:
        """Load a key marked as loading (by the caller, under the lock) and publish it; changes
        applied by other threads meanwhile are caught up first. `count_first`: count its vectors
        (up to what fits) before reading them, so that a key too big for the budget is not read
        whole only to be found too big (a big key's load: seconds of the database's and our CPU)."""
        try:
            with self._lock:
                generation, seq = self._generation, self._seq
                if key in self._keys:  # loaded meanwhile (a snapshot mapped, the warm that wrote it)
                    return self._keys[key]
            if not conn.get_autocommit():
                return None
            if count_first or self._counts_before_load():
                fit = self.fitting_rows(info.dim)
                count = self.source.key_size_at_least(conn, key, fit)
                if count > fit:
                    self._found_too_big(conn, info, key, count, generation)
                    return None
            ids, created, matrix = self.source.load_key(conn, info, key)
            # Built off the lock: the copy, the id map and the codes take long for a big key,
            # and every search waits for the lock. A key is too big when its arrays as the budget
            # counts them exceed it: its free rows, ids, scales and codes count too (testing its vectors
            # alone let a key over the budget in, which then evicted every other key, and was
            # evicted in turn by the next key loaded: every key was read again and again).
            entry = (KeyVectors(ids, created, matrix, spare_rows(len(ids)), coded=self._coded(len(ids)), form=self.form)
                     if self.key_bytes(len(ids), info.dim) <= self.budget_bytes else None)
            with self._lock:
                if self._generation != generation:
                    return None  # the cache started over meanwhile (new index, pruned log): this load is void
                if key in self._keys:
                    return self._keys[key]  # another thread loaded or mapped it meanwhile
                if entry is None:
                    self._too_big[key] = time.monotonic()
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
                if key in self._keys or self._still_too_big(key) or key in self._loading:
                    continue
                # with its codes if a search by code may pack them (_code_keys), not only when its
                # load does: else those searches pushed the cache over its budget, evicting keys
                fits = self._bytes + self.key_bytes(count, info.dim) <= self.budget_bytes
                partly = not fits and self._partial_need(count, info.dim, self._bytes) > 0
            if not fits:  # would evict a key already warm: held partially if it qualifies, else left to the store
                if partly and self._hold_partially(conn, info, key):
                    loaded += 1
            elif self._entry(conn, info, key, may_defer=False) is not None:
                loaded += 1
        with self._lock:
            # Loaded biggest first, the biggest keys were the least recently used: the first to go
            # for the first key a recall loaded, however small. A big key reloads slowly (in the
            # background, searched in the database meanwhile), a small one at once: the smallest go first.
            for key in sorted(self._keys, key=lambda held: self._keys[held].n):
                self._keys.move_to_end(key)
        return loaded

    # -- keys held partially (partial_keys.py) ------------------------------------

    def _counts_before_load(self) -> bool:
        """Whether every load counts its key before reading it, not only a background one."""
        return False

    def _found_too_big(self, conn: Connection, info: vectors.IndexInfo, key: str, count: int,
                       generation: int) -> None:
        """A key counted before its load (`count` vectors, at least) does not fit the whole budget:
        the store searches it, and it is not loaded again for a while (TOO_BIG_RETRY_S)."""
        with self._lock:
            if self._generation == generation:
                self._too_big[key] = time.monotonic()

    def _hold_partially(self, conn: Connection, info: vectors.IndexInfo, key: str) -> bool:
        """Hold `key` partially (the warm: it does not fit the room left whole); whether it is."""
        return False

    def _partial_need(self, count: int, dim: int, used: int) -> int:
        """The bytes a key of `count` vectors would take held partially, with `used` bytes taken
        already; 0 when it would not be (too small, no room, or no partial holding here)."""
        return 0

    # -- which keys are searched by code ----------------------------------------

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
