"""The PostgreSQL backend of the storage interface (bot/memory/storage.py).

Keyword path: the generated `text_search` tsvector (english stems, no accents) with a GIN index over active
memories; the query is built from our own tokens (recall.words.tokens: \\w+ runs, no stop words, at
most 24), each through plainto_tsquery and OR'd, so no user text ever reaches to_tsquery's
syntax; ranked by BM25 (bm25.py), scoped in the same statement; common words are handled as on
SQLite (left out, or only the newest matches ranked: keywords.py).
Vector path: the engine's vector cache (vector_cache.py, as on SQLite: numpy over each
visibility key's vectors, fed by postgres/vector_source.py and kept in step through the
`vector_changes` log that a trigger writes, migration 8). Keys it does not hold (still
loading, beyond its memory budget) and engines without one are searched in the server:
pgvector, L2 distance over L2-normalised vectors (as SQLite's, so cosine = 1 - d^2/2),
scoped in the statement, an exact scan (no HNSW index: PostgreSQL migration 9 says why).
Writes: one transaction each; ids come from an identity and are never reused; two
processes writing at once are serialised by row locks and ON CONFLICT; index creation and
leases take an advisory transaction lock.

The fact write's planning and checks are fact_writes.py, the writes writes.py, the server's
vector search and the other recall statements recall_sql.py; this class delegates to them.
"""
from __future__ import annotations

import logging
import threading
import time
from contextlib import nullcontext
from typing import Any, Callable, ContextManager, Sequence

import psycopg

from bot.memory import records
from bot.memory.errors import DatabaseError
from bot.memory.postgres import fact_writes, keywords, leases, recall_sql, writes
from bot.memory.postgres import scrub as postgres_scrub
from bot.memory.postgres.ann import AnnIndexes
from bot.memory.postgres.connection import PgConnection, connect, where
from bot.memory.postgres.index_state import INDEX_STATE_SQL, index_state_of
from bot.memory.postgres.leases import set_meta_value
from bot.memory.postgres.migrations import migrate
from bot.memory.postgres.vector_source import PostgresVectorSource
from bot.memory.recall import ranking, retrieval
from bot.memory.recall.retrieval import Candidate
from bot.memory.scope import ACTIVE, Viewer, visible_keys
from bot.memory.sql import privacy, store
from bot.memory.storage import SCRUBBED, PlanState
from bot.memory.vectors import index as vectors
from bot.memory.vectors.cache import VectorCache
from bot.memory.vectors.index import IndexInfo, VectorSizeError

log = logging.getLogger(__name__)

INDEX_LOCK = 7_277_402      # advisory lock: recording / resetting the embedding model


class PostgresStorage:
    """The storage interface on the PostgreSQL server at `url` (with pgvector). With `vector_cache`, searches go
    through it, fed from `memory_vectors` (postgres/vector_source.py); without it, they run in the server."""
    name = "postgresql"
    row_refusals: tuple[type[Exception], ...] = (psycopg.IntegrityError, psycopg.DataError)

    def __init__(self, url: str, vector_cache: VectorCache | None = None) -> None:
        self.url = url
        self.vector_cache = vector_cache
        self.ann = AnnIndexes()  # the big keys' own HNSW indexes (postgres/ann.py)
        if vector_cache is not None:
            vector_cache.source = PostgresVectorSource(self._server_knn, self._server_similar)

    # -- connections -------------------------------------------------------------
    def open_writer(self) -> PgConnection:
        """A new autocommit connection with the schema migrated; DatabaseError when
        the server has no pgvector or the role may not create Muninn's tables."""
        conn = connect(self.url, self)
        try:
            migrate(conn.pg)
        except psycopg.errors.FeatureNotSupported as exc:
            conn.close()
            raise DatabaseError(f"PostgreSQL at {where(self.url)} has no pgvector extension: install pgvector "
                                "(https://github.com/pgvector/pgvector) or use SQLite (unset MUNINN_DATABASE_URL)") from exc
        except psycopg.errors.UndefinedFile as exc:
            conn.close()
            raise DatabaseError(f"PostgreSQL at {where(self.url)} has no pgvector extension: {exc}") from exc
        except psycopg.errors.InsufficientPrivilege as exc:
            conn.close()
            raise DatabaseError(f"PostgreSQL at {where(self.url)}: not allowed to create Muninn's tables "
                                f"(or the vector extension): {exc}") from exc
        return conn

    def open_reader(self) -> PgConnection:
        """A new autocommit connection; migrating the schema is the writer's job."""
        return connect(self.url, self)

    def close(self, conn: PgConnection) -> None:
        """Close `conn`; one that is already broken is dropped quietly."""
        try:
            conn.close()
        except psycopg.Error:  # already broken
            pass

    def lost(self, conn: PgConnection, error: BaseException) -> bool:
        """The server closed the connection (restart, failover, idle timeout, network): a job
        on it ran in one transaction that the server rolled back, so running it again on a new
        connection is safe. (A COMMIT whose answer was lost is the one ambiguous case; the
        writes are idempotent where it matters: facts are de-duplicated, forgets repeatable.)"""
        return isinstance(error, psycopg.OperationalError) and bool(conn.pg.closed or conn.pg.broken)

    def where(self) -> str:
        """postgresql://host:port/dbname, without the user or password."""
        return f"postgresql://{where(self.url)}"

    def shares_readers(self) -> bool:
        """Always True: every connection sees the commits of the others."""
        return True

    def prepare(self, conn: PgConnection) -> None:
        """Nothing: a vector follows its memory's visibility key by a trigger of migration 10."""

    # -- the vector index ----------------------------------------------------------
    def index_info(self, conn: PgConnection) -> IndexInfo | None:
        """The vector index recorded in `meta`, or None (index_state's one read)."""
        return self.index_state(conn)[0]  # one meta read (a fact write reads it 2-3 times)

    def index_for(self, conn: PgConnection, model: str, dim: int) -> IndexInfo | None:
        """The index for `dim`-dimensional vectors of `model`; the first embedding creates it under
        an advisory lock (another process may have made it meanwhile); None when they do not fit."""
        info = self.index_info(conn)
        if info is None:
            if not vectors.usable_dim(dim):
                log.warning("%s returned %d-dimensional vectors; Muninn indexes 1 to %d", model, dim, vectors.MAX_DIM)
                return None
            with conn.pg.transaction():
                conn.pg.execute("SELECT pg_advisory_xact_lock(%s)", (INDEX_LOCK,))
                info = self.index_info(conn)  # another process may have made it meanwhile
                if info is None:
                    self._create_index(conn, model, dim)
                    info = IndexInfo(model, dim)
        if info.model != model or info.dim != dim:
            return None
        return info

    def _create_index(self, conn: PgConnection, model: str, dim: int) -> None:
        set_meta_value(conn, "embed_model", model)
        set_meta_value(conn, "embed_dim", str(int(dim)))
        # A new index: every process's vector cache starts over (vector_cache: the identity).
        conn.pg.execute("INSERT INTO meta (key, value) VALUES ('vec_epoch', '1') ON CONFLICT (key) "
                        "DO UPDATE SET value = (meta.value::bigint + 1)::text")

    def reset_index(self, conn: PgConnection, model: str, dim: int) -> None:
        """Truncate the vectors and the change log and start an index for
        `model` and `dim`, marking the reindex pending, in one transaction under
        the index lock; the new epoch makes every process's cache start over."""
        with conn.pg.transaction():
            conn.pg.execute("SELECT pg_advisory_xact_lock(%s)", (INDEX_LOCK,))
            # TRUNCATE, not DELETE: no log row per vector; caches start over by the new epoch instead.
            conn.pg.execute("TRUNCATE memory_vectors, vector_changes")
            conn.pg.execute("UPDATE memories SET embedded = 0 WHERE embedded = 1")
            self._create_index(conn, model, dim)
            set_meta_value(conn, vectors.REINDEX_PENDING, "1")

    def index_state(self, conn: PgConnection) -> tuple[IndexInfo | None, bool]:
        """(index_info, reindex_pending) from one read of the `meta` rows (INDEX_STATE_SQL)."""
        row = conn.pg.execute(INDEX_STATE_SQL).fetchone()
        return index_state_of(row[0] if row else None)

    def mark_reindex_done(self, conn: PgConnection) -> None:
        """Delete the reindex-pending row of `meta`, if there is one."""
        conn.pg.execute("DELETE FROM meta WHERE key = %s", (vectors.REINDEX_PENDING,))

    def warm(self, conn: PgConnection, info: IndexInfo, stop: threading.Event) -> int:
        """Load the vector cache's keys (VectorCache.warm) until `stop` is set; 0 without a cache."""
        return self.vector_cache.warm(conn, info, stop) if self.vector_cache is not None else 0

    def neighbours_many(self, conn: PgConnection, info: IndexInfo, items: Sequence[tuple[int, str]],
                        k: int) -> dict[int, list[tuple[int, float]]]:
        """For each (id, vis_key): its k nearest others under that key as (id, cosine); through the vector
        cache outside a transaction, else one server statement per item (recall_sql.neighbours_many)."""
        return recall_sql.neighbours_many(self.vector_cache, conn, info, items, k)

    # -- what the lifecycle's write rules need -------------------------------------------
    def current_index(self, conn: PgConnection, model: str) -> IndexInfo | None:
        """The vector index if it was made with `model`, else None."""
        info = self.index_info(conn)
        return info if info is not None and info.model == model else None

    def similar_to_memory(self, conn: PgConnection, info: IndexInfo, memory_id: int, keys: list[str],
                          k: int) -> list[tuple[int, float]]:
        """The k nearest active memories under `keys` to a stored memory's own vector
        (read from `memory_vectors`), itself left out; [] when it has none."""
        return recall_sql.similar(conn, info, memory_id, keys, k, self.knn)

    def _server_similar(self, conn: PgConnection, info: IndexInfo, memory_id: int, keys: list[str],
                        k: int) -> list[tuple[int, float]]:
        return recall_sql.similar(conn, info, memory_id, keys, k, self._server_knn)

    def change_mark(self, conn: PgConnection) -> str:
        """The server's current snapshot as text: the mark `unchanged_since` compares with (fact_writes.change_mark)."""
        return fact_writes.change_mark(conn)

    def plan_state(self, conn: PgConnection, model: str, owners: Sequence[int] = (),
                   probes: Sequence[tuple[str, list[str]]] = (), same_text_limit: int = 0,
                   taught: Sequence[tuple[int, int]] = (), since: float = 0.0) -> PlanState:
        """What planning a fact write reads, in one round trip (fact_writes.plan_state)."""
        return fact_writes.plan_state(self.vector_cache, conn, model, owners, probes, same_text_limit, taught, since)

    def one_log_read(self, conn: PgConnection) -> ContextManager[None]:
        """VectorCache.one_log_read, or a no-op without a cache."""
        return self.vector_cache.one_log_read() if self.vector_cache is not None else nullcontext()

    def unchanged_since(self, conn: PgConnection, mark: str) -> bool:
        """Whether no vector change was committed that the snapshot `mark` did not see (fact_writes.unchanged_since)."""
        return fact_writes.unchanged_since(conn, mark)

    def lock_keys(self, conn: PgConnection, keys: Sequence[str]) -> None:
        """Advisory locks on the visibility keys, in sorted order, held
        until the caller's transaction ends (fact_writes.lock_keys)."""
        fact_writes.lock_keys(conn, keys)

    def keyword_search(self, conn: PgConnection, words: list[str], keys: list[str], *, all_words: bool,
                       limit: int) -> list[tuple[int, str]]:
        """Active memories under `keys` holding every word (lowest id first) or any word (best
        ts_rank_cd first): [(id, text)]; [] without words or keys (fact_writes.keyword_search)."""
        return fact_writes.keyword_search(conn, words, keys, all_words=all_words, limit=limit)

    def begin_fact_write(self, conn: PgConnection, keys: Sequence[str], model: str, dim: int | None, mark: Any,
                         probes: Sequence[tuple[str, list[str]]], same_text_limit: int, searched: Sequence[int] = ()
                         ) -> tuple[IndexInfo | None, bool, list[list[tuple[int, str]]]]:
        """Storage.begin_fact_write in one round trip, inside the caller's
        transaction (fact_writes.begin_fact_write); RuntimeError outside one."""
        return fact_writes.begin_fact_write(self, conn, keys, model, dim, mark, probes, same_text_limit, searched)

    def reinforce(self, conn: PgConnection, memory_id: int, *, importance: float, sources: list[str],
                  growth: float, now: float, teacher: tuple[int, float, str] | None = None) -> None:
        """Strengthen a memory learned again (Storage.reinforce), in one statement with its teacher's upsert."""
        writes.reinforce(conn, memory_id, importance=importance, sources=sources, growth=growth, now=now,
                         teacher=teacher)

    # -- writes ------------------------------------------------------------------
    def insert(self, conn: PgConnection, memories: Sequence[records.NewMemory], *, base_stability_days: float,
               model: str, vecs: list[list[float]] | None, now: float | None,
               info: IndexInfo | None = None) -> list[int]:
        """Insert memories, each with its vector in the same statement when `vecs` fit the index,
        in one transaction (the caller's, when one is open); returns their ids (writes.insert)."""
        return writes.insert(self, conn, memories, base_stability_days=base_stability_days, model=model, vecs=vecs,
                             now=now, info=info)

    def store_vectors(self, conn: PgConnection, model: str, ids: list[int], vecs: list[list[float]]) -> int:
        """Store the backfill's vectors in one transaction, skipping memories archived or deleted
        meanwhile and vectors of another size; returns len(ids), or 0 when they do not fit the index."""
        return writes.store_vectors(self, conn, model, ids, vecs)

    def delete(self, conn: PgConnection, memory_ids: Sequence[int]) -> int:
        """Hard-delete memories in one transaction, their vectors, links and
        sources going by cascade; returns how many went (writes.delete)."""
        return writes.delete(conn, memory_ids)

    def scrub(self, conn: PgConnection, forgotten: Sequence[str] = SCRUBBED) -> None:
        """Rewrite the tables that held what was forgotten, those small
        enough now, the rest at the next maintenance (postgres/scrub.py)."""
        postgres_scrub.scrub(conn, forgotten)  # a rewrite: VACUUM leaves the bytes in the files
        if self.vector_cache is not None and "memories" in forgotten:  # the vector snapshot files' copies too
            self.vector_cache.scrub_snapshots(conn)

    def finish_scrub(self, conn: PgConnection) -> bool:
        """The rewrites that earlier forgets left for maintenance (postgres/scrub.finish); True if there were any."""
        done = postgres_scrub.finish(conn)
        if done and self.vector_cache is not None:  # the vector snapshot files' copies too
            self.vector_cache.scrub_snapshots(conn)
        return done

    def archive(self, conn: PgConnection, memory_id: int, reason: str, now: float | None = None) -> None:
        """Take a memory out of retrieval and delete its vector, in one transaction (writes.archive)."""
        writes.archive(conn, memory_id, reason, now)

    def restore(self, conn: PgConnection, memory_id: int) -> None:
        """Bring an archived memory back, counted as recalled now; its vector comes with the next backfill."""
        writes.restore(conn, memory_id)

    def touch_and_load(self, conn: PgConnection, recalls: Sequence[tuple[Sequence[int], float]],
                       wanted: Sequence[int], *, growth: float) -> dict[int, records.Memory] | None:
        """One recall's touch and the load of `wanted` in one statement outside a transaction
        (writes.touch_and_load); None when that does not apply: then touch_many, and get_many."""
        return writes.touch_and_load(conn, recalls, wanted, growth=growth)

    def touch_many(self, conn: PgConnection, recalls: Sequence[tuple[Sequence[int], float]], *, growth: float) -> None:
        """Several recalls' touches in one transaction, rows locked in id order (writes.touch_many)."""
        writes.touch_many(conn, recalls, growth=growth)

    def forget_sources(self, conn: PgConnection, message_ids: Sequence[int],
                       learned_before: float | None = None) -> list[int]:
        """Take deleted messages out of the memories learned from them and delete those left
        with no source, in one transaction; returns the deleted ids (writes.forget_sources)."""
        return writes.forget_sources(self, conn, message_ids, learned_before)

    def add_link(self, conn: PgConnection, source_id: int, target_id: int, kind: str, weight: float = 1.0,
                 now: float | None = None) -> bool:
        """Link two memories, keeping the larger weight; False, and no
        link, between two people's personal memories (writes.add_link)."""
        return writes.add_link(conn, source_id, target_id, kind, weight, now)

    # -- reads (the backend-neutral SQL of store.py, through PgConnection) --------------
    def get(self, conn: PgConnection, memory_id: int) -> records.Memory:
        """A memory by id, archived or not, with no scope check; MemoryNotFound when there is none (store.get)."""
        return store.get(conn, memory_id)

    def get_many(self, conn: PgConnection, memory_ids: Sequence[int]) -> dict[int, records.Memory]:
        """Those of `memory_ids` that exist, by id (store.get_many)."""
        return store.get_many(conn, memory_ids)

    def get_visible(self, conn: PgConnection, viewer: Viewer, memory_id: int) -> records.Memory:
        """The memory if it is active and `viewer` may see it; otherwise MemoryNotFound (store.get_visible)."""
        return store.get_visible(conn, viewer, memory_id)

    def list_visible(self, conn: PgConnection, viewer: Viewer, *, scope: str | None, limit: int,
                     offset: int) -> tuple[list[records.Memory], int]:
        """One page of the active memories `viewer` may see, newest
        first, and how many there are in all (store.list_visible)."""
        return store.list_visible(conn, viewer, scope=scope, limit=limit, offset=offset)

    def memories_of(self, conn: PgConnection, user_id: int, scopes: Sequence[str]) -> list[records.Memory]:
        """A person's memories of `scopes`, archived ones included, oldest first (store.memories_of)."""
        return store.memories_of(conn, user_id, scopes)

    def existing_external_ids(self, conn: PgConnection, ids: Sequence[str]) -> set[str]:
        """Which of these external ids are stored already (store.existing_external_ids, as text)."""
        found = store.existing_external_ids(conn, ids)
        return {x.decode() if isinstance(x, bytes) else x for x in found}

    def refresh_statistics(self, conn: PgConnection) -> None:
        """ANALYZE the memories and their vectors now rather than when autovacuum gets to it: the
        keyword step reads its common words' shares from these statistics (keywords.read_estimates),
        and statistics autovacuum took halfway through an import described another table. The
        counts and estimates this process keeps for the database go too."""
        conn.pg.execute("ANALYZE memories")
        conn.pg.execute("ANALYZE memory_vectors")
        keywords.forget_counts(conn)

    def unembedded(self, conn: PgConnection, limit: int) -> list[tuple[int, str]]:
        """Up to `limit` active memories without a vector, as (id, text), lowest id first."""
        return store.unembedded_ids(conn, limit)

    def count_active(self, conn: PgConnection) -> int:
        """How many memories are active (not archived)."""
        row = conn.pg.execute("SELECT count(*) FROM memories WHERE " + ACTIVE).fetchone()
        return int(row[0]) if row else 0

    def stats(self, conn: PgConnection) -> dict:
        """The counts `muninn stats` shows, one statement each, and the index's model and dimension."""
        def value(sql: str) -> int:
            row = conn.pg.execute(sql.encode()).fetchone()
            return int(row[0]) if row else 0
        info = self.index_info(conn)
        return {
            "memories": value("SELECT count(*) FROM memories"),
            "active": value("SELECT count(*) FROM memories WHERE " + ACTIVE),
            "archived": value("SELECT count(*) FROM memories WHERE archived_at IS NOT NULL"),
            "embedded": value("SELECT count(*) FROM memories WHERE embedded = 1"),
            "missing_vectors": value("SELECT count(*) FROM memories WHERE embedded = 0 AND " + ACTIVE),
            "links": value("SELECT count(*) FROM memory_links"),
            "by_scope": dict(conn.pg.execute("SELECT scope, count(*) FROM memories WHERE " + ACTIVE
                                             + " GROUP BY scope").fetchall()),
            "links_by_kind": dict(conn.pg.execute("SELECT kind, count(*) FROM memory_links GROUP BY kind").fetchall()),
            "embedding_model": info.model if info else None,
            "embedding_dim": info.dim if info else None,
        }

    # -- retrieval ---------------------------------------------------------------------
    def visible_keys(self, conn: PgConnection, viewer: Viewer) -> list[str]:
        """The visibility keys `viewer` may read, global first (scope.visible_keys: the same SQL as on SQLite)."""
        return visible_keys(conn, viewer)    # THE scope rule, same SQL

    def searched_words(self, conn: PgConnection, words: list[str]) -> list[str]:
        """The query's words without the very common ones
        (keywords.searched_words: SQLite's rule, with this database's counts)."""
        return keywords.searched_words(conn, words)  # SQLite's common-word rule, counts from GIN

    def fts_candidates(self, conn: PgConnection, query: str, keys: list[str], limit: int,
                       as_of: float | None) -> list[Candidate]:
        """The keyword path through the `text_search` tsvector (keywords.fts_candidates)."""
        return keywords.fts_candidates(conn, query, keys, limit, as_of)

    def keyword_step(self, conn: PgConnection, query: str, keys: list[str], limit: int,
                     as_of: float | None) -> tuple[list[Candidate], tuple[IndexInfo | None, bool]]:
        """The keyword hits and the index state, read in the same statement
        (keywords.keyword_step); the state is read on its own when no statement ran."""
        hits, state = keywords.keyword_step(conn, query, keys, limit, as_of)  # the state read in its statement
        return hits, state if state is not None else self.index_state(conn)

    def vector_candidates(self, conn: PgConnection, info: IndexInfo, vector: list[float], keys: list[str],
                          limit: int, as_of: float | None) -> list[Candidate]:
        """The vector path: `knn`'s hits as candidates, ranked from 1."""
        return [Candidate(memory_id, vector_rank=rank, distance=distance)
                for rank, (memory_id, distance) in enumerate(self.knn(conn, info, vector, keys, limit, as_of), start=1)]

    def knn(self, conn: PgConnection, info: IndexInfo, vector: Sequence[float], keys: list[str], k: int,
            as_of: float | None = None) -> list[tuple[int, float]]:
        """The k nearest visible vectors: [(memory_id, L2 distance)], nearest first; through the
        vector cache when the engine has one (the keys it does not hold: in the server)."""
        if len(vector) != info.dim:
            raise VectorSizeError(f"query embedding has {len(vector)} dimensions, the index has {info.dim}")
        if not keys or k <= 0:
            return []
        if self.vector_cache is not None:
            return self.vector_cache.knn(conn, info, vector, keys, k, as_of)
        return self._server_knn(conn, info, vector, keys, k, as_of)

    def read_beside(self, submit: Callable[..., Any] | None) -> None:
        """Where a search's parts may run beside it: `submit(fn, *args)` runs fn(conn, *args) on
        another read connection (the engine's readers); None: on the searching connection only."""
        self.ann.beside = submit

    def _server_knn(self, conn: PgConnection, info: IndexInfo, vector: Sequence[float], keys: list[str], k: int,
                    as_of: float | None = None) -> list[tuple[int, float]]:
        return self.ann.search(conn, info, vector, keys, k, as_of, recall_sql.server_knn)

    def spread_to_neighbours(self, conn: PgConnection, ranked: list[Candidate], keys: list[str], share: float,
                             as_of: float | None) -> list[Candidate]:
        """The neighbour loan with PostgreSQL's own statement (recall_sql.spread_to_neighbours)."""
        return recall_sql.spread_to_neighbours(conn, ranked, keys, share, as_of)

    def final_order(self, conn: PgConnection, candidates: list[Candidate], now: float,
                    **options: Any) -> list[Candidate]:
        """The final ranking (ranking.final_order; `options`: its keywords)."""
        return ranking.final_order(conn, candidates, now, **options)

    def graph_neighbours(self, conn: PgConnection, seeds: list[Candidate], keys: list[str], limit: int,
                         as_of: float | None, admit: Callable[[Candidate], bool] | None = None) -> list[Candidate]:
        """The 1-hop walk of the link graph (retrieval.graph_neighbours, the portable SQL)."""
        return retrieval.graph_neighbours(conn, seeds, keys, limit, as_of, admit)

    def measure_similarity(self, conn: PgConnection, vector: Sequence[float], chosen: list[Candidate],
                           info: IndexInfo | None) -> None:
        """Cosines from the vector cache where it holds the vectors,
        the others from the server (recall_sql.measure_similarity)."""
        recall_sql.measure_similarity(self.vector_cache, conn, vector, chosen, info)

    # -- privacy -------------------------------------------------------------------
    def pause(self, conn: PgConnection, user_id: int) -> bool:
        """Pause `user_id`'s memory in one INSERT; False when it already was (the first pause stays)."""
        return conn.pg.execute("INSERT INTO memory_pauses (user_id, paused_at) VALUES (%s, %s) ON CONFLICT DO NOTHING",
                               (user_id, time.time())).rowcount > 0

    def resume(self, conn: PgConnection, user_id: int) -> bool:
        """End a pause (privacy.resume); False when there was none."""
        return privacy.resume(conn, user_id)    # portable SQL: privacy.py

    def paused_users(self, conn: PgConnection) -> set[int]:
        """The ids of everyone whose memory is paused."""
        return privacy.paused_users(conn)

    def take_pause_notice(self, conn: PgConnection, user_id: int) -> bool:
        """True once per pause (privacy.take_pause_notice)."""
        return privacy.take_pause_notice(conn, user_id)

    def personal_from_messages(self, conn: PgConnection, owner_id: int,
                               message_ids: Sequence[int]) -> list[records.Memory]:
        """The owner's active personal memories learned from any of these messages."""
        return privacy.personal_from_messages(conn, owner_id, message_ids)

    def own_memory(self, conn: PgConnection, owner_id: int, memory_id: int) -> records.Memory:
        """A memory this person owns, archived or not; MemoryNotFound otherwise (privacy.own_memory)."""
        return privacy.own_memory(conn, owner_id, memory_id)

    def forget_personal(self, conn: PgConnection, owner_id: int, memory_ids: Sequence[int]) -> int:
        """Delete those of `memory_ids` that are the owner's personal
        memories (scrubbed when any went); returns how many."""
        return privacy.forget_personal(conn, owner_id, memory_ids)

    def last_message_of(self, conn: PgConnection, channel_id: int, author_id: int,
                        before: int | None) -> int | None:
        """The id of the author's latest undeleted message in the channel's history other than `before`, or None."""
        row = conn.pg.execute(
            "SELECT id FROM messages WHERE channel_id = %s AND author_id = %s AND role = 'user' AND deleted_at IS NULL "
            "AND id IS DISTINCT FROM %s::bigint ORDER BY created_at DESC, id DESC LIMIT 1",
            (channel_id, author_id, before)).fetchone()
        return int(row[0]) if row else None

    def drop_own_message(self, conn: PgConnection, author_id: int, message_id: int) -> bool:
        """Take one of the author's messages out of the history, then scrub; False when there was none."""
        return privacy.drop_own_message(conn, author_id, message_id)

    # -- several processes on one database (postgres/leases.py) -------------------------
    def take_lease(self, conn: PgConnection, name: str, holder: str, seconds: float) -> bool:
        """Take or renew the lease under an advisory lock (leases.take_lease)."""
        return leases.take_lease(conn, name, holder, seconds)

    def release_lease(self, conn: PgConnection, name: str, holder: str) -> bool:
        """Give the lease up if `holder` has it (leases.release_lease)."""
        return leases.release_lease(conn, name, holder)

    def lease_holder(self, conn: PgConnection, name: str) -> str | None:
        """Who holds the lease now, or None (leases.lease_holder)."""
        return leases.lease_holder(conn, name)

    def last_run(self, conn: PgConnection, job: str) -> float | None:
        """When `job` last finished, or None (leases.last_run)."""
        return leases.last_run(conn, job)

    def record_run(self, conn: PgConnection, job: str, at: float) -> None:
        """Record that `job` finished at `at` (leases.record_run)."""
        leases.record_run(conn, job, at)
