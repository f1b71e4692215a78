"""The SQLite backend of the storage interface (storage.py): a thin delegation to the modules
that hold SQLite's SQL (store, vectors, fts via retrieval, privacy, leases, scope), which stay
where they are. One file, WAL, one writer connection plus read connections, all sharing the
engine's in-process vector cache."""
from __future__ import annotations

import json
import threading
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Callable, ContextManager, Sequence

import apsw

from bot.memory import decay, records
from bot.memory.recall import ranking, retrieval
from bot.memory.recall.retrieval import Candidate
from bot.memory.scope import ACTIVE, Viewer, key_filter, personal_keys, visible_keys
from bot.memory.sql import leases, privacy, queries, store, teachers
from bot.memory.sql.marks import MESSAGES_PENDING, SCRUB_PENDING, clear_marks, pending_marks
from bot.memory.sql.transactions import write_transaction
from bot.memory.sqlite import db, fts, recall_sql, vector_keys
from bot.memory.sqlite import vec0 as vectors
from bot.memory.sqlite.checkpoints import Checkpoints
from bot.memory.sqlite.partial_source import SQLitePartialSource
from bot.memory.storage import SCRUBBED, PlanState
from bot.memory.vectors.cache import VectorCache
from bot.memory.vectors.index import IndexInfo, cosine_from_distance


class SQLiteStorage:
    """The storage interface on one SQLite file (`path`; ":memory:" is one database per
    connection). With `vector_cache`, every connection searches through it and the writer's
    WAL checkpoints run off the commit path (checkpoints.py); without it, searches read vec0."""
    name = "sqlite"
    row_refusals: tuple[type[Exception], ...] = (apsw.ConstraintError, apsw.TooBigError, apsw.RangeError)

    def __init__(self, path: Path | str, vector_cache: VectorCache | None) -> None:
        self.path = path
        self.vector_cache = vector_cache
        if vector_cache is not None and not vector_cache.has_source():
            vector_cache.source = SQLitePartialSource()  # vec0's reads, and those of keys held partially
        self.checkpoints: Checkpoints | None = None  # the writer's WAL checkpoints (checkpoints.py)
        self._writer: apsw.Connection | None = None

    # -- connections -------------------------------------------------------------
    def open_writer(self) -> apsw.Connection:
        """The writer connection, its schema migrated; with a vector cache, it searches
        through it and its WAL checkpoints run off the commit path (checkpoints.py)."""
        conn = db.connect(self.path)
        if self.vector_cache is not None:
            vectors.attach_cache(conn, self.vector_cache)
            # on the engine's loader thread, not in the writer's commits
            self.checkpoints = Checkpoints(self.vector_cache.background)
            self.checkpoints.install(conn)
            self._writer = conn
        return conn

    def open_reader(self) -> apsw.Connection:
        """A read-only connection (query_only, no memory map), opened while no
        background checkpoint runs; it searches through the vector cache, if any."""
        # not while a background checkpoint writes pages into the file: the check of its header
        # before opening (files.check_before_open) could find it shorter than the header says
        with self._own_checkpoint():
            conn = db.connect(self.path, migrate_schema=False)
        conn.execute("PRAGMA query_only = 1")
        # No memory map on the readers. After any commit (each recall's touch is one) a reader
        # drops its map with its page cache and maps the file again at its next statement, and
        # every page it then reads costs a fault: the keyword step after a write was far slower
        # with the map than without. Read
        # through the OS page cache instead; the writer keeps its map (its own commits keep it).
        conn.execute("PRAGMA mmap_size = 0")
        if self.vector_cache is not None:
            vectors.attach_cache(conn, self.vector_cache)
        return conn

    def close(self, conn: apsw.Connection) -> None:
        """Close `conn`; the writer's queued or running checkpoint ends first."""
        if conn is self._writer and self.checkpoints is not None:
            self.checkpoints.close(conn)  # a checkpoint queued or running ends first: the file is left tidy
            self._writer = None
        conn.close()

    def lost(self, conn: apsw.Connection, error: BaseException) -> bool:
        """Always False: a file does not go away under an open connection."""
        return False  # a file does not go away under an open connection

    def where(self) -> str:
        """The database file's path."""
        return str(self.path)

    def shares_readers(self) -> bool:
        """False for ":memory:" (one database per connection), else True."""
        return str(self.path) != ":memory:"  # ":memory:" is one database per connection

    def prepare(self, conn: apsw.Connection) -> None:
        """Upgrades beyond the migrations, once at start: vectors moved to one partition per visibility
        key, the index of vec0's partitions, the trigger that moves a vector with its memory's key."""
        if vectors.needs_upgrade(conn):
            import logging
            log = logging.getLogger("bot.memory.engine")
            log.info("moving the vectors to one partition per visibility key (once; large databases take minutes)")
            log.info("moved %d vectors to the new layout", vectors.upgrade_layout(conn))
        if vectors.index_info(conn) is not None:  # databases made before the index existed get it now
            vectors.index_partitions(conn)
        if vectors.table_exists(conn):  # files made before the trigger existed get it now
            vector_keys.follow_keys(conn)

    # -- the vector index ----------------------------------------------------------
    def index_info(self, conn: apsw.Connection) -> IndexInfo | None:
        """The vector index recorded in meta, or None (vec0.index_info)."""
        return vectors.index_info(conn)

    def index_for(self, conn: apsw.Connection, model: str, dim: int) -> IndexInfo | None:
        """The index for `dim`-dimensional vectors of `model`, created with
        the first embedding; None when they do not fit (vec0.index_for)."""
        return vectors.index_for(conn, model, dim)

    def reset_index(self, conn: apsw.Connection, model: str, dim: int) -> None:
        """Drop the vec0 table and create one for `model` and
        `dim`, in one transaction, marking the reindex pending."""
        with write_transaction(conn):
            vectors.drop_index(conn)
            vectors.create_index(conn, model, dim)
            vectors.mark_reindex_pending(conn)  # recall says "partial" until every vector is back

    def index_state(self, conn: apsw.Connection) -> tuple[IndexInfo | None, bool]:
        """(index_info, reindex_pending) in one statement (vec0.index_state)."""
        return vectors.index_state(conn)

    def mark_reindex_done(self, conn: apsw.Connection) -> None:
        """Clear the reindex-pending mark, if set."""
        vectors.mark_reindex_done(conn)

    def warm(self, conn: apsw.Connection, info: IndexInfo, stop: threading.Event) -> int:
        """Load the vector cache's keys (VectorCache.warm) until `stop` is set; 0 without a cache."""
        return self.vector_cache.warm(conn, info, stop) if self.vector_cache is not None else 0

    def neighbours_many(self, conn: apsw.Connection, info: IndexInfo, items: Sequence[tuple[int, str]],
                        k: int) -> dict[int, list[tuple[int, float]]]:
        """For each (id, vis_key): its k nearest others under that key as (id, cosine), nearest first."""
        return {mid: [(other, cosine_from_distance(d)) for other, d in found]
                for mid, found in vectors.neighbours_many(conn, info, items, k).items()}

    # -- what the lifecycle's write rules need -------------------------------------------
    def current_index(self, conn: apsw.Connection, model: str) -> IndexInfo | None:
        """The vector index if it was made with `model`, else None."""
        return vectors.current_index(conn, model)

    def knn(self, conn: apsw.Connection, info: IndexInfo, vector: Sequence[float], keys: list[str],
            k: int) -> list[tuple[int, float]]:
        """The k nearest active memories under `keys` (through the cache, when attached): [(id, L2 distance)]."""
        return vectors.knn(conn, info, vector, keys, k)

    def similar_to_memory(self, conn: apsw.Connection, info: IndexInfo, memory_id: int, keys: list[str],
                          k: int) -> list[tuple[int, float]]:
        """The k nearest active memories under `keys` to a stored memory's own vector, itself left out."""
        return vectors.similar_to_memory(conn, info, memory_id, keys, k)

    def change_mark(self, conn: apsw.Connection) -> int:
        """The latest vector change (max seq of the change log): equal
        marks mean no vector was stored or removed in between."""
        return vectors.change_mark(conn)

    def plan_state(self, conn: apsw.Connection, model: str, owners: Sequence[int] = (),
                   probes: Sequence[tuple[str, list[str]]] = (), same_text_limit: int = 0,
                   taught: Sequence[tuple[int, int]] = (), since: float = 0.0) -> PlanState:
        """What planning a fact write reads (Storage.plan_state), one statement after another."""
        return PlanState(self.change_mark(conn), self.current_index(conn, model),
                         {owner: personal_keys(conn, owner) for owner in dict.fromkeys(owners)},
                         [self.keyword_search(conn, words, [key], all_words=True, limit=same_text_limit)
                          for key, words in probes],
                         {pair: store.taught_since(conn, *pair, since) for pair in dict.fromkeys(taught)})

    def one_log_read(self, conn: apsw.Connection) -> ContextManager[None]:
        """VectorCache.one_log_read, or a no-op without a cache."""
        return self.vector_cache.one_log_read() if self.vector_cache is not None else nullcontext()

    def unchanged_since(self, conn: apsw.Connection, mark: int) -> bool:
        """Whether no vector was stored or removed since `mark`
        (change_mark); one writer at a time, so seq is commit order."""
        return vectors.change_mark(conn) == mark  # one writer at a time: seq is commit order

    def lock_keys(self, conn: apsw.Connection, keys: Sequence[str]) -> None:
        """Nothing to do: a write transaction begins IMMEDIATE, holding the file's one write lock."""

    def begin_fact_write(self, conn: apsw.Connection, keys: Sequence[str], model: str, dim: int | None, mark: Any,
                         probes: Sequence[tuple[str, list[str]]], same_text_limit: int, searched: Sequence[int] = ()
                         ) -> tuple[IndexInfo | None, bool, list[list[tuple[int, str]]]]:
        """Storage.begin_fact_write, inside the caller's write transaction, which holds the file's
        one write lock: any vector change since `mark` counts (`searched` is not needed)."""
        self.lock_keys(conn, keys)  # (one writer: any change since `mark` counts; a search costs no round trip)
        info = vectors.index_for(conn, model, dim) if dim is not None else None
        unchanged = mark is not None and self.unchanged_since(conn, mark)
        return info, unchanged, [self.keyword_search(conn, words, [key], all_words=True, limit=same_text_limit)
                                 if words else [] for key, words in probes]

    def keyword_search(self, conn: apsw.Connection, words: list[str], keys: list[str], *, all_words: bool,
                       limit: int) -> list[tuple[int, str]]:
        """Active memories under `keys` holding every word (lowest id first) or any word
        (best bm25 first), through FTS5: [(id, text)]; [] without words or keys."""
        if not words or not keys:
            return []
        where, params = key_filter(keys, "m.vis_key")
        expression = (" AND " if all_words else " OR ").join(fts.quote(w) for w in words)
        order = "m.id" if all_words else "bm25(memories_fts)"
        return [(row[0], row[1]) for row in conn.execute(
            "SELECT m.id, m.text FROM memories_fts JOIN memories m ON m.id = memories_fts.rowid "
            f"WHERE memories_fts MATCH ? AND {where} AND m.{ACTIVE} ORDER BY {order} LIMIT ?",
            (expression, *params, limit))]

    def reinforce(self, conn: apsw.Connection, memory_id: int, *, importance: float, sources: list[str],
                  growth: float, now: float, teacher: tuple[int, float, str] | None = None) -> None:
        """Strengthen a memory learned again (Storage.reinforce), in one UPDATE (and its teacher's upsert)."""
        conn.execute(
            "UPDATE memories SET stability = min(stability * ?, ?), importance = max(importance, ?), "
            "source_message_ids = ?, last_accessed = max(?, coalesce(last_accessed, 0)), updated_at = ? "
            "WHERE id = ?",
            (growth, decay.MAX_STABILITY_DAYS, importance, json.dumps(sources), now, now, memory_id))
        if teacher is not None:
            conn.execute(teachers.upsert_statement(), (memory_id, *teacher))

    # -- writes ------------------------------------------------------------------
    def insert(self, conn: apsw.Connection, memories: Sequence[records.NewMemory], *, base_stability_days: float,
               model: str, vecs: list[list[float]] | None, now: float | None,
               info: IndexInfo | None = None) -> list[int]:
        """Insert memories, with their vectors when `vecs` fit the index, in one transaction; returns their
        ids. `info` is used when it matches `model` and the vectors' size, else the index is read again."""
        with write_transaction(conn):
            if info is None or not vecs or info.model != model or info.dim != len(vecs[0]):
                info = vectors.index_for(conn, model, len(vecs[0])) if vecs else None
            return store.insert_many(conn, memories, base_stability_days=base_stability_days,
                                     vector_info=info, vectors_=vecs if info else None, now=now)

    def store_vectors(self, conn: apsw.Connection, model: str, ids: list[int], vecs: list[list[float]]) -> int:
        """Store the backfill's vectors in one transaction, skipping memories archived or deleted
        meanwhile and vectors of another size; returns len(ids), or 0 when they do not fit the index."""
        with write_transaction(conn):
            info = vectors.index_for(conn, model, len(vecs[0]))
            if info is None:
                return 0
            for memory_id, vector in zip(ids, vecs, strict=True):
                if len(vector) == info.dim:
                    store.set_vector(conn, info, memory_id, vector)
        return len(ids)

    def delete(self, conn: apsw.Connection, memory_ids: Sequence[int]) -> int:
        """Hard-delete memories with their FTS rows, vectors and links (store.delete); returns how many went."""
        return store.delete(conn, memory_ids)

    def scrub(self, conn: apsw.Connection, forgotten: Sequence[str] = SCRUBBED) -> None:
        """FTS5 optimize and a TRUNCATE checkpoint (store.scrub), with background checkpoints
        paused; the whole scrub is cheap here, so `forgotten` does not narrow it."""
        with self._own_checkpoint():
            store.scrub(conn)  # secure_delete zeroed the pages already; FTS5 segments and the WAL remain: all of it, cheap
        if self.vector_cache is not None:  # and the vector snapshot files' copies of removed vectors
            self.vector_cache.scrub_snapshots(conn)

    def finish_scrub(self, conn: apsw.Connection) -> bool:
        """What earlier forgets left for maintenance: the whole scrub for
        SCRUB_PENDING, else a TRUNCATE checkpoint for MESSAGES_PENDING;
        the marks are cleared only once it worked. True if there was any."""
        marks = pending_marks(conn, (SCRUB_PENDING, MESSAGES_PENDING))
        if not marks:
            return False
        with self._own_checkpoint():
            if SCRUB_PENDING in marks:
                store.scrub(conn)
                if self.vector_cache is not None:
                    self.vector_cache.scrub_snapshots(conn)
            elif not store.truncate_wal(conn):  # the history's words only: `messages` has no FTS index (optimize:
                return True  # slow on a big database, under the write lock); secure_delete zeroed the pages. Kept: retried
        clear_marks(conn, marks)  # only once it worked: a failed scrub is retried next time
        return True

    def _own_checkpoint(self) -> ContextManager[None]:
        """Waits for a background checkpoint and keeps new ones from starting meanwhile: the
        writer's TRUNCATE checkpoint would find the checkpoint lock taken and leave the forgotten
        words in the WAL; a reader opening would find the file mid-copy."""
        return self.checkpoints.paused() if self.checkpoints is not None else nullcontext()

    def archive(self, conn: apsw.Connection, memory_id: int, reason: str, now: float | None = None) -> None:
        """Take a memory out of retrieval (store.archive: its FTS row and vector go; the row stays)."""
        store.archive(conn, memory_id, reason, now)

    def restore(self, conn: apsw.Connection, memory_id: int) -> None:
        """Bring an archived memory back (store.restore); its vector comes with the next backfill."""
        store.restore(conn, memory_id)

    def touch_many(self, conn: apsw.Connection, recalls: Sequence[tuple[Sequence[int], float]], *, growth: float) -> None:
        """Several recalls' touches in one transaction (bot/memory/recall/touches.py)."""
        store.touch_many(conn, recalls, growth=growth)

    def forget_sources(self, conn: apsw.Connection, message_ids: Sequence[int],
                       learned_before: float | None = None) -> list[int]:
        """Take deleted messages out of the memories learned from them and delete the
        memories left with no source (store.forget_sources); returns the deleted ids."""
        return store.forget_sources(conn, message_ids, learned_before)

    def add_link(self, conn: apsw.Connection, source_id: int, target_id: int, kind: str, weight: float = 1.0,
                 now: float | None = None) -> bool:
        """Link two memories, keeping the larger weight (store.add_link);
        False, and no link, between two people's personal memories."""
        return store.add_link(conn, source_id, target_id, kind, weight, now)

    # -- reads -------------------------------------------------------------------
    def get(self, conn: apsw.Connection, memory_id: int) -> records.Memory:
        """A memory by id, archived or not, with no scope check; MemoryNotFound when there is none."""
        return store.get(conn, memory_id)

    def get_many(self, conn: apsw.Connection, memory_ids: Sequence[int]) -> dict[int, records.Memory]:
        """Those of `memory_ids` that exist, by id."""
        return store.get_many(conn, memory_ids)

    def get_visible(self, conn: apsw.Connection, viewer: Viewer, memory_id: int) -> records.Memory:
        """The memory if it is active and `viewer` may see it; otherwise MemoryNotFound."""
        return store.get_visible(conn, viewer, memory_id)

    def list_visible(self, conn: apsw.Connection, viewer: Viewer, *, scope: str | None, limit: int,
                     offset: int) -> tuple[list[records.Memory], int]:
        """One page of the active memories `viewer` may see, newest first, and how many there are in all."""
        return store.list_visible(conn, viewer, scope=scope, limit=limit, offset=offset)

    def memories_of(self, conn: apsw.Connection, user_id: int, scopes: Sequence[str]) -> list[records.Memory]:
        """A person's memories of `scopes`, archived ones included, oldest first (forget-all, export)."""
        return store.memories_of(conn, user_id, scopes)

    def existing_external_ids(self, conn: apsw.Connection, ids: Sequence[str]) -> set[str]:
        """Which of these external ids are stored already."""
        return store.existing_external_ids(conn, ids)

    def refresh_statistics(self, conn: apsw.Connection) -> None:
        """Nothing to do: SQLite's keyword step counts words in FTS5's index itself, and its
        statements are planned without sqlite_stat tables (none is ever made)."""

    def unembedded(self, conn: apsw.Connection, limit: int) -> list[tuple[int, str]]:
        """Up to `limit` active memories without a vector, as (id, text), lowest id first."""
        return store.unembedded_ids(conn, limit)

    def count_active(self, conn: apsw.Connection) -> int:
        """How many memories are active (not archived)."""
        return int(queries.query_value(conn, "SELECT count(*) FROM memories WHERE archived_at IS NULL"))

    def stats(self, conn: apsw.Connection) -> dict:
        """The counts `muninn stats` shows (store.stats)."""
        return store.stats(conn)

    # -- retrieval's SQL -------------------------------------------------------------
    def visible_keys(self, conn: apsw.Connection, viewer: Viewer) -> list[str]:
        """The visibility keys `viewer` may read, global first (scope.visible_keys)."""
        return visible_keys(conn, viewer)

    def fts_candidates(self, conn: apsw.Connection, query: str, keys: list[str], limit: int,
                       as_of: float | None) -> list[Candidate]:
        """The keyword path through FTS5 (recall_sql.fts_candidates)."""
        return recall_sql.fts_candidates(conn, query, keys, limit, as_of)

    def keyword_step(self, conn: apsw.Connection, query: str, keys: list[str], limit: int,
                     as_of: float | None) -> tuple[list[Candidate], tuple[IndexInfo | None, bool]]:
        """fts_candidates, then index_state, as two statements."""
        return self.fts_candidates(conn, query, keys, limit, as_of), self.index_state(conn)

    def searched_words(self, conn: apsw.Connection, words: list[str]) -> list[str]:
        """The query's words without the very common ones (fts.selective)."""
        return fts.selective(conn, words)

    def vector_candidates(self, conn: apsw.Connection, info: IndexInfo, vector: list[float], keys: list[str],
                          limit: int, as_of: float | None) -> list[Candidate]:
        """The vector path (recall_sql.vector_candidates)."""
        return recall_sql.vector_candidates(conn, info, vector, keys, limit, as_of)

    def spread_to_neighbours(self, conn: apsw.Connection, ranked: list[Candidate], keys: list[str], share: float,
                             as_of: float | None) -> list[Candidate]:
        """The neighbour loan (retrieval.spread_to_neighbours)."""
        return retrieval.spread_to_neighbours(conn, ranked, keys, share, as_of)

    def final_order(self, conn: apsw.Connection, candidates: list[Candidate], now: float,
                    **options: Any) -> list[Candidate]:
        """The final ranking (ranking.final_order; `options`: its keywords)."""
        return ranking.final_order(conn, candidates, now, **options)

    def graph_neighbours(self, conn: apsw.Connection, seeds: list[Candidate], keys: list[str], limit: int,
                         as_of: float | None, admit: Callable[[Candidate], bool] | None = None) -> list[Candidate]:
        """The 1-hop walk of the link graph (retrieval.graph_neighbours)."""
        return retrieval.graph_neighbours(conn, seeds, keys, limit, as_of, admit)

    def measure_similarity(self, conn: apsw.Connection, vector: Sequence[float], chosen: list[Candidate],
                           info: IndexInfo | None) -> None:
        """recall_sql.measure_similarity, made just after the vector search on this
        connection: outside a transaction the change log is not read again."""
        recall_sql.measure_similarity(conn, vector, chosen, info, after_search=True)  # recall.steps.search_step: just after it

    # -- privacy -------------------------------------------------------------------
    def pause(self, conn: apsw.Connection, user_id: int) -> bool:
        """Pause `user_id`'s memory (privacy.pause); False when it already was."""
        return privacy.pause(conn, user_id)

    def resume(self, conn: apsw.Connection, user_id: int) -> bool:
        """End a pause (privacy.resume); False when there was none."""
        return privacy.resume(conn, user_id)

    def paused_users(self, conn: apsw.Connection) -> set[int]:
        """The ids of everyone whose memory is paused."""
        return privacy.paused_users(conn)

    def take_pause_notice(self, conn: apsw.Connection, user_id: int) -> bool:
        """True once per pause (privacy.take_pause_notice)."""
        return privacy.take_pause_notice(conn, user_id)

    def personal_from_messages(self, conn: apsw.Connection, owner_id: int,
                               message_ids: Sequence[int]) -> list[records.Memory]:
        """The owner's active personal memories learned from any of these messages."""
        return privacy.personal_from_messages(conn, owner_id, message_ids)

    def own_memory(self, conn: apsw.Connection, owner_id: int, memory_id: int) -> records.Memory:
        """A memory this person owns, archived or not; MemoryNotFound otherwise (privacy.own_memory)."""
        return privacy.own_memory(conn, owner_id, memory_id)

    def forget_personal(self, conn: apsw.Connection, owner_id: int, memory_ids: Sequence[int]) -> int:
        """Delete those of `memory_ids` that are the owner's personal memories (scrubbed when any went); returns how many."""
        return privacy.forget_personal(conn, owner_id, memory_ids)

    def last_message_of(self, conn: apsw.Connection, channel_id: int, author_id: int,
                        before: int | None) -> int | None:
        """The id of the author's latest message in the channel's history other than `before`, or None."""
        return privacy.last_message_of(conn, channel_id, author_id, before)

    def drop_own_message(self, conn: apsw.Connection, author_id: int, message_id: int) -> bool:
        """Take one of the author's messages out of the history, then scrub; False when there was none."""
        return privacy.drop_own_message(conn, author_id, message_id)

    # -- several processes on one database -------------------------------------------
    def take_lease(self, conn: apsw.Connection, name: str, holder: str, seconds: float) -> bool:
        """Take or renew the lease (leases.take); False if another holder has it."""
        return leases.take(conn, name, holder, seconds)

    def release_lease(self, conn: apsw.Connection, name: str, holder: str) -> bool:
        """Give the lease up if `holder` has it (leases.release)."""
        return leases.release(conn, name, holder)

    def lease_holder(self, conn: apsw.Connection, name: str) -> str | None:
        """Who holds the lease now, or None (leases.holder_of)."""
        return leases.holder_of(conn, name)

    def last_run(self, conn: apsw.Connection, job: str) -> float | None:
        """When `job` last finished, in unix seconds, or None (leases.last_run)."""
        return leases.last_run(conn, job)

    def record_run(self, conn: apsw.Connection, job: str, at: float) -> None:
        """Record that `job` finished at `at` (leases.record_run)."""
        leases.record_run(conn, job, at)


SQLITE = SQLiteStorage(":memory:", None)  # the operations on a given connection (storage.storage_of)
