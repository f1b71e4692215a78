"""One copy of the cached vectors per machine: the keys a process holds come from a snapshot
file (snapshot.py) that every process serving the database maps, instead of each its own.

The first process to warm writes it (under the folder's exclusive lock, which the others wait
for, then map its file). A process maps a generation and keeps beside it only what changed since
the change-log mark the file reflects: the changes since that mark are applied to the mapped
keys as to any (a removal marks its row, an append fills a free row of the key), each in the
process's own copy of the pages they touch. Past a bound of such changes, one process writes a
new generation from its own keys (the others find it at their next search and map it, on their
loader thread); older generations go once nobody maps them. A snapshot that does not match the
database (another instance, epoch, model, dimension or form), is damaged, or whose mark the
change log no longer reaches back to, is never served: it is deleted with one log line and
rebuilt. The database stays the store of record: a lost snapshot costs a load, never a memory.

Forgetting: `scrub_snapshots` (run with the database's own scrub) zeroes in every generation
the rows of vectors no longer stored.
"""
from __future__ import annotations

import ctypes
import logging
import os
import threading
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from bot.memory.connection import Connection
from bot.memory.scope import ACTIVE
from bot.memory.sql.queries import get_meta
from bot.memory.vectors import codes as vector_codes
from bot.memory.vectors import index as vectors
from bot.memory.vectors import snapshot
from bot.memory.vectors.arrays import SLACK_ROWS, KeyVectors, in_form
from bot.memory.vectors.keys import MAX_APPLY, spare_rows
from bot.memory.vectors.partial_keys import PartialKeys
from bot.memory.vectors.source import Changed

log = logging.getLogger("bot.memory.vectors")

# A new generation is written once a process applied more changes than this share of the
# snapshot's rows (at least DELTA_MIN) since the one it maps: each change costs it a private page or two.
DELTA_SHARE = 1 / 16
DELTA_MIN = 2000
# At start, keys of a mapped file that differ from the database are read again one by one up to
# this many (writes that landed meanwhile); more differ only in a file of another state.
RECHECK_MAX = 64


class SharedKeys(PartialKeys):
    """PartialKeys whose keys are mapped from the machine's snapshot when `snapshot_place` is set."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Given the database's instance token, the folder of its snapshots; None: no snapshot (today's private cache).
        self.snapshot_place: Callable[[str], Path] | None = None
        self._folder: Path | None = None
        self._mapped_generation = 0           # the generation this cache's mapped keys come from (0: none)
        self._from_snapshot: dict[str, KeyVectors] = {}
        self._snapshot_rows = 0
        self._delta = 0                        # changes applied since the generation was mapped
        self._folder_seen: int | None = None   # the folder's mtime when last looked at (a new file changes it)
        self._sharing = False                  # a snapshot job is queued or running on the loader
        self._share_lock = threading.Lock()    # one snapshot job at a time in this process
        self._folder_tried = False

    # -- where ------------------------------------------------------------------

    def snapshot_folder(self, conn: Connection) -> Path | None:
        """This database's snapshot folder for this cache's form (created private), or None when
        snapshots are off or the database has no instance token."""
        if self.snapshot_place is None:
            return None
        if self._folder is None:
            instance = get_meta(conn, "instance")
            if not instance:
                return None
            self._folder = snapshot.make_folder(self.snapshot_place(instance) / self.form)
        return self._folder

    def _about(self, conn: Connection, info: vectors.IndexInfo) -> dict[str, Any] | None:
        """What a snapshot must be of to serve this cache (None: the cache has not read the log yet)."""
        if self._identity is None:
            return None
        return {"instance": get_meta(conn, "instance") or "", "epoch": self._identity[0], "model": info.model,
                "dim": info.dim, "form": self.form}

    def _newest(self, conn: Connection, info: vectors.IndexInfo, folder: Path) -> snapshot.Mapped | None:
        about = self._about(conn, info)
        return snapshot.open_newest(folder, about) if about is not None else None

    # -- warm: map the snapshot, or be the one who writes it ------------------------

    def warm(self, conn: Connection, info: vectors.IndexInfo, stop: threading.Event | None = None) -> int:
        """Map the machine's snapshot, then load the keys it lacks (CachedKeys.warm). With no
        snapshot fit to serve, the first process loads every key from the database and writes
        one; the others wait for it, then map it."""
        try:
            folder = self.snapshot_folder(conn) if conn.get_autocommit() else None
        except OSError as problem:
            log.warning("no vector snapshot folder (%s): this process keeps its own copy of the vectors", problem)
            self.snapshot_place = None
            folder = None
        if folder is None or self._sync(conn, info) is None:
            return super().warm(conn, info, stop)
        try:
            return self._warm_shared(conn, info, folder, stop)
        except (OSError, ValueError, KeyError) as problem:  # a full disk, a read-only folder: the cache serves from its own copy
            log.warning("the vector snapshot in %s failed (%s): this process keeps its own copy of the vectors",
                        folder, problem)
            return super().warm(conn, info, stop)

    def _warm_shared(self, conn: Connection, info: vectors.IndexInfo, folder: Path,
                     stop: threading.Event | None) -> int:
        with self._share_lock:
            with snapshot.folder_lock(folder, exclusive=False):
                mapped = self._newest(conn, info, folder)
            if mapped is not None and self._adopt(conn, info, mapped) and self._matches(conn, info, mapped):
                return len(self._from_snapshot) + super().warm(conn, info, stop)
            with snapshot.folder_lock(folder, exclusive=True):
                mapped = self._newest(conn, info, folder)  # written while we waited?
                if mapped is not None and self._adopt(conn, info, mapped) and self._matches(conn, info, mapped):
                    return len(self._from_snapshot) + super().warm(conn, info, stop)
                if self._build(conn, info, folder, stop):
                    return len(self._from_snapshot) + super().warm(conn, info, stop)
                return super().warm(conn, info, stop)

    def _build(self, conn: Connection, info: vectors.IndexInfo, folder: Path, stop: threading.Event | None) -> bool:
        """Write a generation read from the database key by key straight into the file (the keys
        that fit the budget, biggest first, as a warm loads them), then map it; False when
        stopped. Nothing is kept in this process on the way: loading every key into the cache
        first left its dicts' and arrays' pages with the allocator, after the file replaced them.
        The file's mark is the cache's before the first read: each key is read as of then or
        later, and the changes since the mark are applied again at the mapping (harmless for
        those a key already holds). The caller holds the folder's lock exclusively."""
        about = self._about(conn, info)
        with self._lock:
            if about is None:
                return False
            about = {**about, "mark": self._seq}
        chosen, total = [], 0
        for key, count in conn.execute(f"SELECT vis_key, count(*) AS n FROM memories WHERE embedded = 1 AND {ACTIVE} "
                                       "GROUP BY vis_key ORDER BY n DESC, vis_key"):
            need = self.key_bytes(int(count), info.dim)
            if total + need <= self.budget_bytes:
                chosen.append(str(key))
                total += need
            else:  # room for what the warm will hold partially (partial_keys.py), not written to the file
                total += self._partial_need(int(count), info.dim, total)

        def parts() -> Iterator[snapshot.Part]:
            for key in chosen:
                if stop is not None and stop.is_set():
                    raise _Stopped
                ids, created, matrix = self.source.load_key(conn, info, key)
                if len(ids):
                    rows, scales = in_form(matrix, self.form)
                    codes = vector_codes.pack(rows) if self._coded(len(ids)) else None
                    yield key, ids, created, rows, scales, codes, len(ids) + SLACK_ROWS + spare_rows(len(ids))
        newest = snapshot.generations(folder)
        try:
            snapshot.write(folder, (newest[-1][0] if newest else 0) + 1, about, parts())
        except _Stopped:
            return False
        mapped = self._newest(conn, info, folder)
        return mapped is not None and self._adopt(conn, info, mapped)

    def _matches(self, conn: Connection, info: vectors.IndexInfo, mapped: snapshot.Mapped) -> bool:
        """At start, after mapping: each mapped key holds the vectors the database holds under it
        (how many, and the sum of their ids). A database put back from a backup taken before the
        file was written has a change log that never reached the file's mark: nothing in the log
        tells it apart. A key that differs is read again after a sync (a write may have landed
        between the mapping and the read); one that still differs makes the file stale: it is
        deleted and written anew, none of its keys served."""
        held = {str(key): (int(count), int(total or 0)) for key, count, total in conn.execute(
            f"SELECT vis_key, count(*), sum(id) FROM memories WHERE embedded = 1 AND {ACTIVE} GROUP BY vis_key")}
        wrong = self._differing(held)
        if wrong and len(wrong) <= RECHECK_MAX and self._sync(conn, info) is not None:
            held = {key: _held(conn, key) for key in wrong}
            wrong = self._differing(held, wrong)
        if not wrong:
            return True
        with self._lock:
            self._reset()  # not one of its keys stays
            self._identity = None  # the next read starts over, from the log's current mark
        snapshot.discard(mapped, "stale (it does not match the database: put back from a backup?)")
        self._sync(conn, info)
        return False

    def _differing(self, held: dict[str, tuple[int, int]], keys: list[str] | None = None) -> list[str]:
        """The mapped keys (of `keys`) whose vectors differ from `held`'s (count, sum of ids)."""
        with self._lock:
            wrong = []
            for key, entry in self._from_snapshot.items():
                if self._keys.get(key) is not entry or (keys is not None and key not in keys):
                    continue
                ids = entry.ids[:entry.n]
                ids = ids[ids >= 0]
                if (len(ids), int(ids.sum())) != held.get(key, (0, 0)):
                    wrong.append(key)
            return wrong

    # -- mapping a generation -----------------------------------------------------

    def _adopt(self, conn: Connection, info: vectors.IndexInfo, mapped: snapshot.Mapped) -> bool:
        """Serve `mapped`'s keys (those that fit the budget) instead of this cache's own copies,
        with the changes since its mark applied to them; False when it cannot be served (stale:
        deleted) or this cache is not ready for it."""
        if mapped.generation <= self._mapped_generation or not conn.get_autocommit():
            return False
        entries = [(key, KeyVectors.mapped(*arrays)) for key, arrays in mapped.keys()]  # off the lock: the id maps take long
        with self._lock:
            if self._identity is None:
                return False
            # read under the lock: no other thread applies changes to the keys being replaced meanwhile
            epoch, changed, now, complete, states = self.source.poll(conn, mapped.mark)
            if epoch != mapped.header.get("epoch") or not complete or len(changed) > MAX_APPLY:
                snapshot.discard(mapped, "stale (the change log no longer reaches back to it)"
                                 if epoch == mapped.header.get("epoch") else "of another vector epoch")
                return False
            if (epoch, info.model, info.dim) != self._identity:
                return False
            for key, before in self._from_snapshot.items():  # an older generation's keys: let go of its map
                if self._keys.get(key) is before:
                    self._drop(key)
            installed: dict[str, KeyVectors] = {}
            for key, entry in entries:
                old = self._keys.get(key)
                if self._bytes + entry.nbytes - (old.nbytes if old is not None else 0) > self.budget_bytes:
                    continue
                if old is not None:
                    self._drop(key)
                self._keys[key] = entry
                self._bytes += entry.nbytes
                self._too_big.pop(key, None)
                installed[key] = entry
            # An id both in a mapped key and in a key of this process's own: one of them is
            # behind (it moved between the two marks). Out of the own key, and settled below.
            displaced = self._key_of.map(installed)
            for memory_id, key in displaced.items():
                if key not in installed and key in self._keys:
                    self._keys[key].discard(memory_id)
            # the changes since the mark, for the mapped keys: the others are at this cache's mark already
            ids = {i for i in changed if i not in self._key_of or self._key_of[i] in installed} | set(displaced)
            self._from_snapshot = installed
            self._mapped_generation = mapped.generation
            self._snapshot_rows = mapped.rows
            self._applied += 1  # a log read made before this one is read again (CachedKeys._read_log)
            self._apply(conn, info, ids, _only(states, ids) if not displaced else None)
            # The mapped keys are now as of `now`; the others catch up to it too, so that the cache
            # has one mark again (else the next search applied the mapped keys' changes twice,
            # each a row of their own copy). An id in a mapped key is there as of `now` already.
            if self._seq != now and len(installed) < len(self._keys):
                behind = self.source.changed_between(conn, self._seq, now)
                self._apply(conn, info, {i for i in behind if self._key_of.get(i) not in installed})
            self._seq = now
            self._delta = len(ids)
        del entries
        _give_back_heap()  # the private copies just replaced: small keys' arrays live on the heap
        return True

    def _reset(self) -> None:
        super()._reset()
        self._from_snapshot = {}
        self._mapped_generation = 0
        self._folder_seen = None  # the next search looks at the folder again

    # -- following the others' generations, writing new ones ------------------------------

    def _sync(self, conn: Connection, info: vectors.IndexInfo) -> set[int] | None:
        if self._folder is None and self.snapshot_place is not None and not self._folder_tried \
                and conn.get_autocommit():
            self._folder_tried = True  # a command that never warms maps the snapshot too
            self.snapshot_folder(conn)
        self._look_at_folder(info)
        return super()._sync(conn, info)

    def _look_at_folder(self, info: vectors.IndexInfo) -> None:
        """A stat of the folder per search: when a generation appeared (or this cache started
        over), the loader maps the newest."""
        folder, background = self._folder, self.background
        if folder is None or background is None or self._sharing:
            return
        if self._past_bound():
            with self._lock:
                self._maybe_renew(info)
        try:
            seen: int | None = os.stat(folder).st_mtime_ns
        except OSError:
            seen = None
        if seen == self._folder_seen:
            return
        with self._lock:
            if self._in_background(lambda conn: self._follow(conn, info)):
                self._folder_seen = seen  # else looked at again by the next search

    def _in_background(self, job: Callable[[Connection], None]) -> bool:
        """Queue `job` on the loader unless a snapshot job is queued already; whether it was.
        Under the cache's lock."""
        background = self.background
        if self._sharing or background is None:
            return False
        self._sharing = True

        def run(conn: Connection) -> None:
            try:
                with self._share_lock:
                    job(conn)
            except Exception:  # a snapshot is a cache: the keys this process holds serve on
                log.exception("the vector snapshot job failed; searches go on from this process's own keys")
            finally:
                self._sharing = False
        try:
            background(run)
        except Exception:  # the loader is shut down
            self._sharing = False
            return False
        return True

    def _follow(self, conn: Connection, info: vectors.IndexInfo) -> None:
        """On the loader: map the newest generation if it is newer than the one mapped."""
        folder = self._folder
        newest = snapshot.generations(folder) if folder is not None else []
        if folder is None or not newest or newest[-1][0] <= self._mapped_generation:
            return
        with snapshot.folder_lock(folder, exclusive=False):
            mapped = self._newest(conn, info, folder)
        if mapped is None or not self._adopt(conn, info, mapped):
            return
        generation = mapped.generation
        del mapped  # this process's last hold on an older generation may go with its keys
        with snapshot.folder_lock(folder, exclusive=True, wait=False) as taken:
            if taken:
                snapshot.prune(folder, generation)

    def _apply(self, conn: Connection, info: vectors.IndexInfo, ids: set[int], states: Changed | None = None) -> None:
        super()._apply(conn, info, ids, states)
        self._delta += len(ids)
        self._maybe_renew(info)

    def _past_bound(self) -> bool:
        return bool(self._from_snapshot) and self._delta > max(DELTA_MIN, int(self._snapshot_rows * DELTA_SHARE))

    def _maybe_renew(self, info: vectors.IndexInfo) -> None:
        """Under the cache's lock: past the bound of changes, queue the writing of a new
        generation (when the loader is busy with another snapshot job, the next search does)."""
        folder = self._folder
        if folder is not None and self._past_bound() \
                and self._in_background(lambda loader: self._renew(loader, info, folder)):
            self._delta = 0  # this process tries once per bound; another may write it first

    def _renew(self, conn: Connection, info: vectors.IndexInfo, folder: Path) -> None:
        """On the loader: write a new generation unless another process is writing one (then map theirs)."""
        with snapshot.folder_lock(folder, exclusive=True, wait=False) as taken:
            if taken:
                newest = snapshot.generations(folder)
                if not newest or newest[-1][0] <= self._mapped_generation:
                    self._publish(conn, info, folder)
                    return
        self._follow(conn, info)

    def _publish(self, conn: Connection, info: vectors.IndexInfo, folder: Path) -> None:
        """Write this cache's keys as the next generation, then map it (its own copies go). The
        caller holds the folder's lock exclusively."""
        about = self._about(conn, info)
        with self._lock:
            if about is None or self._identity is None or not self._keys:
                return
            about = {**about, "mark": self._seq}
            # rows [0, n) are never rewritten in place but for their ids (a removal): those are copied
            parts = [(key, entry.ids[:entry.n].copy(), entry.created, entry.matrix, entry.scales, entry.codes, entry.n)
                     for key, entry in self._keys.items() if entry.live > 0]
        newest = snapshot.generations(folder)
        generation = (newest[-1][0] if newest else 0) + 1
        snapshot.write(folder, generation, about, (_compacted(*part) for part in parts))
        del parts  # this process's own copies go once the file's keys replace them
        snapshot.prune(folder, generation)
        mapped = self._newest(conn, info, folder)
        if mapped is not None:
            self._adopt(conn, info, mapped)

    # -- forgetting --------------------------------------------------------------------

    def scrub_snapshots(self, conn: Connection) -> int:
        """Zero, in every snapshot file of this database, the vectors no longer stored (a forgotten
        memory's among them), and delete the generations nobody maps; returns the rows zeroed.
        Run after the database's own scrub, outside a transaction."""
        folder = self.snapshot_folder(conn)
        if folder is None or not snapshot.generations(folder):
            return 0
        live = np.fromiter((int(row[0]) for row in conn.execute(
            f"SELECT id FROM memories WHERE embedded = 1 AND {ACTIVE}")), dtype=np.int64)
        try:
            with snapshot.folder_lock(folder, exclusive=True):
                zeroed = snapshot.scrub(folder, live)
                newest = snapshot.generations(folder)
                if newest:
                    snapshot.prune(folder, newest[-1][0])
            return zeroed
        except OSError as problem:  # not rewritable: then not kept at all (rebuilt at the next start)
            log.warning("could not scrub the vector snapshot in %s (%s): deleted instead", folder, problem)
            for _, path in snapshot.generations(folder):
                path.unlink(missing_ok=True)
            return 0


class _Stopped(Exception):
    """The engine closes: the snapshot being written is dropped."""


def _held(conn: Connection, key: str) -> tuple[int, int]:
    """How many vectors the database holds under `key`, and the sum of their ids."""
    row = next(iter(conn.execute(f"SELECT count(*), sum(id) FROM memories WHERE embedded = 1 AND {ACTIVE} "
                                 "AND vis_key = ?", (key,))))
    return int(row[0]), int(row[1] or 0)


def _give_back_heap() -> None:
    """Return the C heap's free pages to the system (glibc's malloc_trim; nothing elsewhere): the
    private copies a mapped generation replaced were freed, but small arrays are carved from the
    heap, which keeps its pages otherwise, and the process would stay as big as before."""
    global _trim
    if _trim is None:
        try:
            _trim = ctypes.CDLL(None).malloc_trim
        except (OSError, AttributeError):
            _trim = False
    if _trim:
        _trim(0)


_trim: Any = None


def _only(states: Changed | None, ids: set[int]) -> Changed | None:
    return None if states is None else {mid: state for mid, state in states.items() if mid in ids}


def _compacted(key: str, ids: np.ndarray, created: np.ndarray, matrix: np.ndarray, scales: np.ndarray | None,
               codes: np.ndarray | None, n: int) -> snapshot.Part:
    """One key's live rows for the file, with free rows for appends as a load leaves them."""
    alive = ids >= 0
    live = int(alive.sum())
    return (key, ids[alive], created[:n][alive], matrix[:n][alive],
            None if scales is None else scales[:n][alive],
            None if codes is None else codes[:, :n][:, alive], live + SLACK_ROWS + spare_rows(live))
