"""The PostgreSQL backend of the storage interface (bot/memory/storage.py).

Keyword path: the generated `text_search` tsvector (english stems, no accents) with a GIN index over active
memories; the query is built from our own tokens (recall.words.tokens: \\w+ runs, no stop words, at
most 24), each through plainto_tsquery and OR'd, so no user text ever reaches to_tsquery's
syntax; ranked by ts_rank_cd, scoped in the same statement; common words are handled as on
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
"""
from __future__ import annotations

import json
import logging
import struct
import threading
import time
from contextlib import contextmanager, nullcontext
from typing import Any, ContextManager, Iterator, Sequence

import psycopg
from psycopg.adapt import Dumper
from psycopg.pq import Format

from bot.memory import decay, records, scope
from bot.memory.errors import DatabaseError
from bot.memory.postgres import keywords
from bot.memory.postgres import scrub as postgres_scrub
from bot.memory.postgres.connection import PgConnection, connect, translate, where
from bot.memory.postgres.index_state import INDEX_STATE_SQL, index_state_of
from bot.memory.postgres.migrations import migrate
from bot.memory.postgres.vector_source import PostgresVectorSource
from bot.memory.recall import ranking, retrieval
from bot.memory.recall.retrieval import VITALS_COLUMNS, Candidate
from bot.memory.scope import ACTIVE, Viewer, visible_keys
from bot.memory.sql import privacy, removals, store
from bot.memory.storage import SCRUBBED, PlanState
from bot.memory.vectors import index as vectors
from bot.memory.vectors.cache import VectorCache
from bot.memory.vectors.index import IndexInfo, VectorSizeError

log = logging.getLogger(__name__)

INDEX_LOCK = 7_277_402      # advisory lock: recording / resetting the embedding model
LEASE_LOCK = 7_277_403      # advisory lock: taking a lease (read-check-write of one meta row)
FACT_KEY_LOCK = 7_277_404   # advisory locks (this, hash of a vis_key): storing facts under that key


def vector_literal(vector: Sequence[float]) -> str:
    """pgvector's text form of the L2-normalised vector."""
    return "[" + ",".join(repr(float(x)) for x in vectors.normalise(vector)) + "]"


class VectorBinary(bytes):
    """pgvector's binary form of a vector (what `vector_recv` reads), sent as a binary parameter
    of an unnamed type: the statement's `%s::vector` makes it one. It costs a small fraction of the
    CPU of the text form (`vector_literal`: repr of each float, then parsed by the server),
    inside the fact write's lock. The same float4 values are stored."""


class _VectorBinaryDumper(Dumper):
    format = Format.BINARY

    def dump(self, obj: Any) -> bytes:
        return bytes(obj)


psycopg.adapters.register_dumper(VectorBinary, _VectorBinaryDumper)


def vector_binary(vector: Sequence[float]) -> VectorBinary:
    """The L2-normalised vector in pgvector's binary form: dimensions, a zero, float4s (big-endian)."""
    values = vectors.normalise(vector)
    return VectorBinary(struct.pack(f">HH{len(values)}f", len(values), 0, *values))


def _meta(conn: PgConnection, key: str) -> str | None:
    row = conn.pg.execute("SELECT value FROM meta WHERE key = %s", (key,)).fetchone()
    return None if row is None else str(row[0])


def _set_meta(conn: PgConnection, key: str, value: str) -> None:
    conn.pg.execute("INSERT INTO meta (key, value) VALUES (%s, %s) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                    (key, value))


def _lock_in_order(conn: PgConnection, ids: Sequence[int]) -> None:
    """Row locks taken in id order: two processes touching or deleting overlapping sets at once
    then wait for each other instead of deadlocking (one UPDATE ... = ANY locks in scan order)."""
    conn.pg.execute("SELECT id FROM memories WHERE id = ANY(%s) ORDER BY id FOR UPDATE", (sorted(set(ids)),))


# Whether no vector changed since a change mark (a snapshot): no log row of a transaction it did not see.
_UNCHANGED_SINCE = ("SELECT NOT EXISTS (SELECT 1 FROM vector_changes WHERE xid >= pg_snapshot_xmin(%s::pg_snapshot) "
                    "AND NOT pg_visible_in_snapshot(xid, %s::pg_snapshot))")


# Whether the k nearest under some keys, searched at a mark, still hold: no vector logged since
# (as _UNCHANGED_SINCE) of a memory now under those keys (stored, re-embedded or moved in) or among
# the ids that search found (removed or moved out); a removed memory the search did not return
# changes nothing. (When it was checked globally, four writers of their own keys re-searched each
# other's facts under the key's lock: 3 more round trips there - the log, the changed rows, their vectors.)
_UNCHANGED_UNDER = ("SELECT NOT EXISTS (SELECT 1 FROM vector_changes c LEFT JOIN memories m ON m.id = c.memory_id "
                    "WHERE c.xid >= pg_snapshot_xmin(%s::pg_snapshot) AND NOT pg_visible_in_snapshot(c.xid, %s::pg_snapshot) "
                    "AND (m.vis_key = ANY(%s::text[]) OR c.memory_id = ANY(%s::bigint[])))")


def _keyword_statement(words: list[str], keys: list[str], *, all_words: bool, limit: int) -> tuple[str, list[Any]]:
    """keyword_search's statement and parameters (the fact write's duplicate and update checks)."""
    match = (" && " if all_words else " || ").join(["plainto_tsquery('muninn', %s)"] * len(words))
    order = "m.id" if all_words else f"ts_rank_cd(m.text_search, {match}) DESC, m.id DESC"
    # As keywords.fts_candidates: the match written out (from a CTE the planner cannot see the
    # words) and never prepared (one generic plan for every key and word): that made the any-word
    # statement faster, most of all in its tail; all-words the same.
    return (f"SELECT m.id, m.text FROM memories m WHERE m.archived_at IS NULL AND m.vis_key = ANY(%s) "
            f"AND m.text_search @@ ({match}) ORDER BY {order} LIMIT %s",
            [keys, *words, *([] if all_words else words), limit])


# One person's personal keys, in key order (scope.personal_keys' statement; parameters: the owner, twice).
_PERSONAL_KEYS = f"ARRAY({scope.personal_keys_sql('%s')})"

# A recall's touch of its memories (parameters: now, growth, decay.MAX_STABILITY_DAYS).
_TOUCH_SET = ("access_count = access_count + 1, last_accessed = greatest(%s, coalesce(last_accessed, 0)), "
              "stability = least(stability * %s, %s)")
_INSERT_MEMORY = ("INSERT INTO memories (text, scope, owner_id, channel_id, guild_id, vis_key, importance, "
                  "stability, created_at, updated_at, source_message_ids, external_id, embedded) "
                  "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)")


@contextmanager
def _atomic(conn: PgConnection) -> Iterator[None]:
    """One transaction for the block: its own when none is open; inside the caller's, the
    caller's (no savepoint: two round trips each, and a failure fails the caller's transaction,
    which rolls back whole; nobody catches a failed insert halfway and carries on)."""
    if conn.pg.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS:
        yield
        return
    with conn.pg.transaction():
        yield


class PostgresStorage:
    name = "postgresql"
    row_refusals: tuple[type[Exception], ...] = (psycopg.IntegrityError, psycopg.DataError)

    def __init__(self, url: str, vector_cache: VectorCache | None = None) -> None:
        self.url = url
        self.vector_cache = vector_cache
        if vector_cache is not None:
            vector_cache.source = PostgresVectorSource(self._server_knn, self._server_similar)

    # -- connections -------------------------------------------------------------
    def open_writer(self) -> PgConnection:
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
        return connect(self.url, self)

    def close(self, conn: PgConnection) -> None:
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
        return f"postgresql://{where(self.url)}"

    def shares_readers(self) -> bool:
        return True

    def prepare(self, conn: PgConnection) -> None:
        """Nothing: a vector follows its memory's visibility key by a trigger of migration 10."""

    # -- the vector index ----------------------------------------------------------
    def index_info(self, conn: PgConnection) -> IndexInfo | None:
        return self.index_state(conn)[0]  # one meta read (a fact write reads it 2-3 times)

    def index_for(self, conn: PgConnection, model: str, dim: int) -> IndexInfo | None:
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
        _set_meta(conn, "embed_model", model)
        _set_meta(conn, "embed_dim", str(int(dim)))
        # A new index: every process's vector cache starts over (vector_cache: the identity).
        conn.pg.execute("INSERT INTO meta (key, value) VALUES ('vec_epoch', '1') ON CONFLICT (key) "
                        "DO UPDATE SET value = (meta.value::bigint + 1)::text")

    def reset_index(self, conn: PgConnection, model: str, dim: int) -> None:
        with conn.pg.transaction():
            conn.pg.execute("SELECT pg_advisory_xact_lock(%s)", (INDEX_LOCK,))
            # TRUNCATE, not DELETE: no log row per vector; caches start over by the new epoch instead.
            conn.pg.execute("TRUNCATE memory_vectors, vector_changes")
            conn.pg.execute("UPDATE memories SET embedded = 0 WHERE embedded = 1")
            self._create_index(conn, model, dim)
            _set_meta(conn, vectors.REINDEX_PENDING, "1")

    def index_state(self, conn: PgConnection) -> tuple[IndexInfo | None, bool]:
        row = conn.pg.execute(INDEX_STATE_SQL).fetchone()
        return index_state_of(row[0] if row else None)

    def mark_reindex_done(self, conn: PgConnection) -> None:
        conn.pg.execute("DELETE FROM meta WHERE key = %s", (vectors.REINDEX_PENDING,))

    def warm(self, conn: PgConnection, info: IndexInfo, stop: threading.Event) -> int:
        return self.vector_cache.warm(conn, info, stop) if self.vector_cache is not None else 0

    def neighbours_many(self, conn: PgConnection, info: IndexInfo, items: Sequence[tuple[int, str]],
                        k: int) -> dict[int, list[tuple[int, float]]]:
        if self.vector_cache is not None and conn.get_autocommit():
            found = self.vector_cache.neighbours(conn, info, items, k)
            return {mid: [(other, vectors.cosine_from_distance(d)) for other, d in near] for mid, near in found.items()}
        out: dict[int, list[tuple[int, float]]] = {}
        for memory_id, key in items:
            rows = conn.pg.execute(
                "SELECT o.memory_id, o.embedding <-> s.embedding AS d FROM memory_vectors s "
                "JOIN memory_vectors o ON o.vis_key = s.vis_key AND o.memory_id != s.memory_id "
                "WHERE s.memory_id = %s AND o.vis_key = %s ORDER BY d, o.memory_id LIMIT %s",
                (memory_id, key, k)).fetchall()
            out[memory_id] = [(int(other), vectors.cosine_from_distance(float(d))) for other, d in rows]
        return out

    # -- what the lifecycle's write rules need -------------------------------------------
    def current_index(self, conn: PgConnection, model: str) -> IndexInfo | None:
        info = self.index_info(conn)
        return info if info is not None and info.model == model else None

    def similar_to_memory(self, conn: PgConnection, info: IndexInfo, memory_id: int, keys: list[str],
                          k: int) -> list[tuple[int, float]]:
        return self._similar(conn, info, memory_id, keys, k, self.knn)

    def _server_similar(self, conn: PgConnection, info: IndexInfo, memory_id: int, keys: list[str],
                        k: int) -> list[tuple[int, float]]:
        return self._similar(conn, info, memory_id, keys, k, self._server_knn)

    def _similar(self, conn: PgConnection, info: IndexInfo, memory_id: int, keys: list[str], k: int,
                 search: Any) -> list[tuple[int, float]]:
        row = conn.pg.execute("SELECT embedding::text FROM memory_vectors WHERE memory_id = %s", (memory_id,)).fetchone()
        if row is None:
            return []
        own = [float(x) for x in str(row[0]).strip("[]").split(",")]
        return [(mid, d) for mid, d in search(conn, info, own, keys, k + 1) if mid != memory_id][:k]

    def change_mark(self, conn: PgConnection) -> str:
        # A snapshot, not max(seq): a seq is numbered at insert, so a transaction holding a low
        # one can commit after a higher one was seen (a duplicate search would miss its fact).
        row = conn.pg.execute("SELECT pg_current_snapshot()::text").fetchone()
        assert row is not None
        return str(row[0])

    def plan_state(self, conn: PgConnection, model: str, owners: Sequence[int] = (),
                   probes: Sequence[tuple[str, list[str]]] = (), same_text_limit: int = 0) -> PlanState:
        """One round trip: the snapshot, the index, each owner's personal keys (scope.personal_keys'
        loose index scan, an array per owner), each probe's exact-text check (keyword_search's
        statement, its rows as JSON) and, in a one_log_read block, the vector cache's read of the
        change log (the rows it needs: vector_source.poll_beside): these were a round trip each
        per fact. Never prepared (as keyword_search: one generic plan for every key and word
        would not do)."""
        people = list(dict.fromkeys(owners))
        columns = [f"({INDEX_STATE_SQL})", *(_PERSONAL_KEYS for _ in people)]
        params: list[Any] = [owner for owner in people for _ in range(2)]
        probed = [bool(words) for _, words in probes]
        for vis_key, words in probes:
            if words:
                query, more = _keyword_statement(words, [vis_key], all_words=True, limit=same_text_limit)
                columns.append(f"(SELECT json_agg(json_build_array(s.id, s.text) ORDER BY s.id)::text FROM ({query}) s)")
                params += more
        cache = self.vector_cache
        ahead = (cache.read_ahead(conn)
                 if cache is not None and isinstance(cache.source, PostgresVectorSource) else None)
        if cache is not None and ahead is not None:
            polled, row = cache.source.poll_beside(conn, ahead[0], columns, params)  # type: ignore[attr-defined]
            mark = polled[2][0]  # the statement's snapshot: the plan's mark and the cache's are one
            stored, _ = index_state_of(row[0])
            if stored is not None:
                cache.take_read_ahead(conn, stored, ahead, polled)
        else:
            found = conn.pg.execute(f"SELECT pg_current_snapshot()::text, {', '.join(columns)}".encode(), params,
                                    prepare=False).fetchone()
            assert found is not None
            mark, row = str(found[0]), tuple(found[1:])
            stored, _ = index_state_of(row[0])
        hits = iter(row[1 + len(people):])
        same_words = [[(int(mid), str(text)) for mid, text in json.loads(next(hits) or "[]")] if was_probed else []
                      for was_probed in probed]
        return PlanState(mark, stored if stored is not None and stored.model == model else None,
                         {owner: [str(key) for key in keys] for owner, keys in zip(people, row[1:], strict=False)},
                         same_words)

    def one_log_read(self, conn: PgConnection) -> ContextManager[None]:
        return self.vector_cache.one_log_read() if self.vector_cache is not None else nullcontext()

    def unchanged_since(self, conn: PgConnection, mark: str) -> bool:
        row = conn.pg.execute(_UNCHANGED_SINCE, (mark, mark)).fetchone()
        return bool(row and row[0])

    def lock_keys(self, conn: PgConnection, keys: Sequence[str]) -> None:
        """Transaction-scoped advisory locks per visibility key, taken in sorted order (no
        deadlock between two writers): PostgreSQL runs writers side by side, so without them two
        processes storing the same fact would both find no duplicate and both insert it."""
        for key in sorted(set(keys)):
            conn.pg.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (FACT_KEY_LOCK, key))

    def keyword_search(self, conn: PgConnection, words: list[str], keys: list[str], *, all_words: bool,
                       limit: int) -> list[tuple[int, str]]:
        if not words or not keys:
            return []
        query, params = _keyword_statement(words, keys, all_words=all_words, limit=limit)
        rows = conn.pg.execute(query.encode(), params, prepare=False).fetchall()
        return [(int(r[0]), str(r[1])) for r in rows]

    def begin_fact_write(self, conn: PgConnection, keys: Sequence[str], model: str, dim: int | None, mark: Any,
                         probes: Sequence[tuple[str, list[str]]], same_text_limit: int, searched: Sequence[int] = ()
                         ) -> tuple[IndexInfo | None, bool, list[list[tuple[int, str]]]]:
        """One round trip: the statements go as one simple query (client-side binding, so no
        statement is prepared), run by the server in order, each with its own snapshot (READ
        COMMITTED): the checks after the locks see every fact committed by the lock's last holder.
        Before, the locks, two index reads, the change check and each duplicate check were a
        round trip each, all but the first with the key's lock held. The index is read after the
        locks: a writer that waited across a reset_index sees the new model and size."""
        if not conn.pg.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS:
            raise RuntimeError("begin_fact_write runs inside a write transaction")
        parts: list[str] = []
        params: list[Any] = []
        for key in sorted(set(keys)):  # sorted: two writers never wait for each other crosswise
            parts.append("SELECT pg_advisory_xact_lock(%s, hashtext(%s))")
            params += [FACT_KEY_LOCK, key]
        parts.append(INDEX_STATE_SQL)
        if mark is not None:
            parts.append(_UNCHANGED_UNDER)
            params += [mark, mark, sorted(set(keys)), sorted(set(searched))]
        probed = [bool(words) for _, words in probes]
        for vis_key, words in probes:
            if words:
                query, more = _keyword_statement(words, [vis_key], all_words=True, limit=same_text_limit)
                parts.append(query)
                params += more
        cursor = psycopg.ClientCursor(conn.pg)
        cursor.execute(";\n".join(parts).encode(), params)
        for _ in sorted(set(keys)):  # the locks' results, then the index's
            cursor.nextset()
        state = cursor.fetchone()
        stored, _ = index_state_of(state[0] if state else None)
        unchanged = False
        if mark is not None:
            cursor.nextset()
            row = cursor.fetchone()
            unchanged = bool(row and row[0])
        hits: list[list[tuple[int, str]]] = []
        for was_probed in probed:
            if was_probed:
                cursor.nextset()
                hits.append([(int(r[0]), str(r[1])) for r in cursor.fetchall()])
            else:
                hits.append([])
        info: IndexInfo | None = None
        if dim is not None:
            if stored is None:  # the first embedding ever: index_for creates the index (its own lock)
                info = self.index_for(conn, model, dim)
            elif stored == IndexInfo(model, dim):
                info = stored
        return info, unchanged, hits

    def reinforce(self, conn: PgConnection, memory_id: int, *, importance: float, sources: list[str],
                  growth: float, now: float) -> None:
        conn.pg.execute(
            "UPDATE memories SET stability = least(stability * %s, %s), importance = greatest(importance, %s), "
            "source_message_ids = %s, last_accessed = greatest(%s, coalesce(last_accessed, 0)), updated_at = %s "
            "WHERE id = %s",
            (growth, decay.MAX_STABILITY_DAYS, importance, json.dumps(sources), now, now, memory_id))

    # -- writes ------------------------------------------------------------------
    def _put_vector(self, conn: PgConnection, info: IndexInfo, memory_id: int, vis_key: str, created_at: float,
                    vector: Sequence[float]) -> None:
        """Store the vector (logged by trigger) and mark its memory embedded (a new memory's
        vector goes in with it: `insert`)."""
        if len(vector) != info.dim:
            raise VectorSizeError(f"embedding has {len(vector)} dimensions, the index has {info.dim}")
        conn.pg.execute(
            "INSERT INTO memory_vectors (memory_id, vis_key, created_at, embedding) VALUES (%s, %s, %s, %s::vector) "
            "ON CONFLICT (memory_id) DO UPDATE SET vis_key = excluded.vis_key, created_at = excluded.created_at, "
            "embedding = excluded.embedding", (memory_id, vis_key, float(created_at), vector_binary(vector)))
        conn.pg.execute("UPDATE memories SET embedded = 1 WHERE id = %s", (memory_id,))

    def insert(self, conn: PgConnection, memories: Sequence[records.NewMemory], *, base_stability_days: float,
               model: str, vecs: list[list[float]] | None, now: float | None,
               info: IndexInfo | None = None) -> list[int]:
        now = time.time() if now is None else now
        if info is None or not vecs or info.model != model or info.dim != len(vecs[0]):
            info = self.index_for(conn, model, len(vecs[0])) if vecs else None
        ids: list[int] = []
        with _atomic(conn):
            for index, memory in enumerate(memories):
                created = memory.created_at if memory.created_at is not None else now
                vector = vecs[index] if vecs and info is not None else None
                if vector is not None and info is not None and len(vector) != info.dim:
                    raise VectorSizeError(f"embedding has {len(vector)} dimensions, the index has {info.dim}")
                # `embedded` set here, not by a later UPDATE: that one wrote a second row version
                # (a new entry in every index, the GIN one included) and computed the tsvector again.
                # The memory and its vector in one statement: one round trip (the foreign key is
                # checked at the statement's end, when the memory row is there).
                values = (memory.text, memory.scope, memory.owner_id, memory.channel_id, memory.guild_id,
                          memory.vis_key, memory.importance,
                          decay.initial_stability(memory.importance, base_stability_days), created, now,
                          json.dumps([str(s) for s in memory.source_message_ids]), memory.external_id,
                          int(vector is not None))
                if vector is None:
                    row = conn.pg.execute(_INSERT_MEMORY + " RETURNING id", values).fetchone()
                else:
                    row = conn.pg.execute(
                        f"WITH m AS ({_INSERT_MEMORY} RETURNING id, vis_key, created_at) "
                        "INSERT INTO memory_vectors (memory_id, vis_key, created_at, embedding) "
                        "SELECT id, vis_key, created_at, %s::vector FROM m RETURNING memory_id",
                        (*values, vector_binary(vector))).fetchone()
                assert row is not None
                ids.append(int(row[0]))
        return ids

    def store_vectors(self, conn: PgConnection, model: str, ids: list[int], vecs: list[list[float]]) -> int:
        info = self.index_for(conn, model, len(vecs[0]))
        if info is None:
            return 0
        with conn.pg.transaction():
            for memory_id, vector in zip(ids, vecs, strict=True):
                row = conn.pg.execute("SELECT vis_key, created_at FROM memories WHERE id = %s AND " + ACTIVE
                                      + " FOR UPDATE", (memory_id,)).fetchone()
                if row is not None and len(vector) == info.dim:  # archived or deleted meanwhile: nothing to index
                    self._put_vector(conn, info, memory_id, row[0], row[1], vector)
        return len(ids)

    def delete(self, conn: PgConnection, memory_ids: Sequence[int]) -> int:
        ids = list(memory_ids)
        if not ids:
            return 0
        with conn.pg.transaction():  # vectors (logged by trigger), links and source rows go by ON DELETE CASCADE
            _lock_in_order(conn, ids)
            removed = conn.pg.execute("DELETE FROM memories WHERE id = ANY(%s)", (ids,)).rowcount
        self._count_removed(conn, removed)
        return removed

    def _count_removed(self, conn: PgConnection, removed: int) -> None:
        """After the commit of the outermost transaction: this process's word counts go (a word
        counted as common may not be any more; before the commit a recall would count the removed
        rows again), and other processes' through the counter (removals.py), in a statement of its
        own (inside the transaction every removal of every process would wait for the one meta
        row until that commit: a fact write's supersede, a maintenance batch's archives)."""
        if removed <= 0:
            return

        def count_removed() -> None:
            keywords.forget_counts(conn, removed)
            removals.seen_own(keywords._database(conn), removals.add(conn, removed), removed)
        conn.after_commit(count_removed)

    def scrub(self, conn: PgConnection, forgotten: Sequence[str] = SCRUBBED) -> None:
        postgres_scrub.scrub(conn, forgotten)  # a rewrite: VACUUM leaves the bytes in the files

    def finish_scrub(self, conn: PgConnection) -> bool:
        return postgres_scrub.finish(conn)

    def archive(self, conn: PgConnection, memory_id: int, reason: str, now: float | None = None) -> None:
        with conn.pg.transaction():
            archived = conn.pg.execute(
                "UPDATE memories SET archived_at = %s, archive_reason = %s, embedded = 0, updated_at = %s "
                "WHERE id = %s AND " + ACTIVE, (time.time() if now is None else now, reason, time.time(), memory_id)
            ).rowcount
            conn.pg.execute("DELETE FROM memory_vectors WHERE memory_id = %s", (memory_id,))  # logged by trigger
        self._count_removed(conn, max(archived, 0))

    def restore(self, conn: PgConnection, memory_id: int) -> None:
        now = time.time()
        conn.pg.execute("UPDATE memories SET archived_at = NULL, archive_reason = NULL, last_accessed = %s, "
                        "updated_at = %s WHERE id = %s", (now, now, memory_id))

    def touch_and_load(self, conn: PgConnection, recalls: Sequence[tuple[Sequence[int], float]],
                       wanted: Sequence[int], *, growth: float) -> dict[int, records.Memory] | None:
        """One recall's touch (touch_many's UPDATE) and the load of `wanted`, in one statement
        outside a transaction, its rows locked in id order by its subquery (BEGIN, the lock, the
        UPDATE and COMMIT were four round trips on every recall's path): the touched rows as the
        UPDATE leaves them (RETURNING), the others read beside it. None when it is not one
        recall's touch outside a transaction: touch_many, then get_many."""
        if len(recalls) != 1 or not conn.get_autocommit():
            return None
        ids, now = recalls[0]
        touched = sorted(set(ids))
        columns = translate(records.COLUMNS)
        rows = conn.pg.execute(
            (f"WITH touched AS (UPDATE memories SET {_TOUCH_SET} "
             f"WHERE id IN (SELECT id FROM memories WHERE id = ANY(%s) AND {ACTIVE} ORDER BY id FOR UPDATE) "
             f"RETURNING {columns}) "
             f"SELECT * FROM touched UNION ALL SELECT {columns} FROM memories WHERE id = ANY(%s) "
             "AND NOT id = ANY(%s)").encode(),
            (now, growth, decay.MAX_STABILITY_DAYS, touched, list(wanted), touched)).fetchall()
        return {int(row[0]): records.Memory.from_row(row) for row in rows}

    def touch_many(self, conn: PgConnection, recalls: Sequence[tuple[Sequence[int], float]], *, growth: float) -> None:
        """Several recalls' touches in one transaction (bot/memory/recall/touches.py; one recall's alone
        is touch_and_load's), each the same UPDATE with its own time, in order: each memory ends
        as if each had been its own."""
        with conn.pg.transaction():
            _lock_in_order(conn, sorted({memory_id for ids, _ in recalls for memory_id in ids}))
            for ids, now in recalls:
                conn.pg.execute(f"UPDATE memories SET {_TOUCH_SET} WHERE id = ANY(%s) AND {ACTIVE}",
                                (now, growth, decay.MAX_STABILITY_DAYS, sorted(set(ids))))

    def forget_sources(self, conn: PgConnection, message_ids: Sequence[int],
                       learned_before: float | None = None) -> list[int]:
        wanted = [str(m) for m in message_ids]
        if not wanted:
            return []
        with conn.pg.transaction():
            rows = conn.pg.execute(
                "SELECT m.id, m.source_message_ids FROM memories m WHERE m.id IN "
                "(SELECT memory_id FROM memory_sources WHERE message_id = ANY(%s)) "
                "AND (%s::float8 IS NULL OR m.created_at < %s) ORDER BY m.id FOR UPDATE",
                (wanted, learned_before, learned_before)).fetchall()
            emptied: list[int] = []
            for memory_id, sources in rows:
                left = [s for s in records._id_list(sources) if str(s) not in wanted]
                if left:
                    conn.pg.execute("UPDATE memories SET source_message_ids = %s WHERE id = %s",
                                    (json.dumps(left), memory_id))
                else:
                    emptied.append(int(memory_id))
            self.delete(conn, emptied)
        return emptied

    def add_link(self, conn: PgConnection, source_id: int, target_id: int, kind: str, weight: float = 1.0,
                 now: float | None = None) -> bool:
        if kind not in records.LINK_KINDS:
            raise ValueError(f"unknown link kind {kind!r}")
        row = conn.pg.execute("SELECT count(*) FROM memories a, memories b WHERE a.id = %s AND b.id = %s AND "
                              "a.scope = 'personal' AND b.scope = 'personal' AND a.owner_id != b.owner_id",
                              (source_id, target_id)).fetchone()
        if row and row[0]:
            return False
        conn.pg.execute(
            "INSERT INTO memory_links (source_id, target_id, kind, weight, created_at) VALUES (%s, %s, %s, %s, %s) "
            "ON CONFLICT (source_id, target_id, kind) DO UPDATE SET weight = greatest(memory_links.weight, excluded.weight)",
            (source_id, target_id, kind, weight, time.time() if now is None else now))
        return True

    # -- reads (the backend-neutral SQL of store.py, through PgConnection) --------------
    def get(self, conn: PgConnection, memory_id: int) -> records.Memory:
        return store.get(conn, memory_id)

    def get_many(self, conn: PgConnection, memory_ids: Sequence[int]) -> dict[int, records.Memory]:
        return store.get_many(conn, memory_ids)

    def get_visible(self, conn: PgConnection, viewer: Viewer, memory_id: int) -> records.Memory:
        return store.get_visible(conn, viewer, memory_id)

    def list_visible(self, conn: PgConnection, viewer: Viewer, *, scope: str | None, limit: int,
                     offset: int) -> tuple[list[records.Memory], int]:
        return store.list_visible(conn, viewer, scope=scope, limit=limit, offset=offset)

    def memories_of(self, conn: PgConnection, user_id: int, scopes: Sequence[str]) -> list[records.Memory]:
        return store.memories_of(conn, user_id, scopes)

    def existing_external_ids(self, conn: PgConnection, ids: Sequence[str]) -> set[str]:
        found = store.existing_external_ids(conn, ids)
        return {x.decode() if isinstance(x, bytes) else x for x in found}

    def unembedded(self, conn: PgConnection, limit: int) -> list[tuple[int, str]]:
        return store.unembedded_ids(conn, limit)

    def count_active(self, conn: PgConnection) -> int:
        row = conn.pg.execute("SELECT count(*) FROM memories WHERE " + ACTIVE).fetchone()
        return int(row[0]) if row else 0

    def stats(self, conn: PgConnection) -> dict:
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
        return visible_keys(conn, viewer)    # THE scope rule, same SQL

    def searched_words(self, conn: PgConnection, words: list[str]) -> list[str]:
        return keywords.searched_words(conn, words)  # SQLite's common-word rule, counts from GIN

    def fts_candidates(self, conn: PgConnection, query: str, keys: list[str], limit: int,
                       as_of: float | None) -> list[Candidate]:
        return keywords.fts_candidates(conn, query, keys, limit, as_of)

    def keyword_step(self, conn: PgConnection, query: str, keys: list[str], limit: int,
                     as_of: float | None) -> tuple[list[Candidate], tuple[IndexInfo | None, bool]]:
        hits, state = keywords.keyword_step(conn, query, keys, limit, as_of)  # the state read in its statement
        return hits, state if state is not None else self.index_state(conn)

    def vector_candidates(self, conn: PgConnection, info: IndexInfo, vector: list[float], keys: list[str],
                          limit: int, as_of: float | None) -> list[Candidate]:
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

    def _server_knn(self, conn: PgConnection, info: IndexInfo, vector: Sequence[float], keys: list[str], k: int,
                    as_of: float | None = None) -> list[tuple[int, float]]:
        """The search in the server: an exact scan of the visible vectors (the vis_key index, then
        a top-N sort); what the vector cache does not hold (migration 9)."""
        if not keys or k <= 0:
            return []
        since = " AND created_at <= %s" if as_of is not None else ""
        extra = [as_of] if as_of is not None else []
        rows = conn.pg.execute(
            f"SELECT memory_id, embedding <-> %s::vector AS d FROM memory_vectors WHERE vis_key = ANY(%s){since} "
            "ORDER BY d, memory_id LIMIT %s".encode(), [vector_literal(vector), keys, *extra, k]).fetchall()
        return [(int(mid), float(d)) for mid, d in rows]

    def spread_to_neighbours(self, conn: PgConnection, ranked: list[Candidate], keys: list[str], share: float,
                             as_of: float | None) -> list[Candidate]:
        """retrieval.spread_to_neighbours with PostgreSQL's own statement: for each hit, its
        `reach` nearest active memories on either side under its key, one ordered walk of the
        (vis_key, id) index each (a LATERAL array), of which only those that are candidates
        themselves are returned: only they can be lent to (retrieval.lend_to_neighbours). Their
        times are tested here, from the candidates' decay rows that the same statement reads for
        final_order. (The recursive walk took one max()/min() seek per step and read the time of
        every neighbour found, several times this statement's work; the portable one joins the walk
        to `memories`, which PostgreSQL ran as a hash over every memory.)"""
        reach = retrieval.NEIGHBOUR_REACH
        if share <= 0 or not ranked or reach <= 0:
            return ranked
        by_id = {c.memory_id: c for c in ranked}
        side = ("SELECT h.id AS hit, n.other, n.places FROM memories h CROSS JOIN LATERAL unnest(ARRAY(SELECT p.id "
                "FROM memories p WHERE p.vis_key = h.vis_key AND p.id {op} h.id AND p.archived_at IS NULL "
                "ORDER BY p.id {order} LIMIT %(reach)s)) WITH ORDINALITY n(other, places) "
                "WHERE h.id = ANY(%(ids)s) AND h.vis_key = ANY(%(keys)s)")
        rows = conn.pg.execute(
            ("SELECT hit, other, places::int, NULL::float8, NULL::float8, NULL::float8, NULL::float8 FROM ("
             f"{side.format(op='<', order='DESC')} UNION ALL {side.format(op='>', order='ASC')}) x "
             "WHERE x.other = ANY(%(ids)s) "
             # the candidates' decay rows (Candidate.vitals: final_order reads none again) and their times here
             f"UNION ALL SELECT id, NULL, NULL, {VITALS_COLUMNS} "
             "FROM memories WHERE id = ANY(%(ids)s)").encode(),
            {"ids": list(by_id), "keys": keys, "reach": reach}).fetchall()
        created: dict[int, float] = {}
        for hit, other, _, last_seen, stability, importance, created_at in rows:
            if other is None:  # a decay row: for final_order next (Candidate.vitals) and the times here
                by_id[int(hit)].vitals = (last_seen, stability, importance, created_at)
                created[int(hit)] = float(created_at)
        walked = [(int(h), int(o), int(p)) for h, o, p, *_ in rows if o is not None
                  and abs(created[o] - created[h]) <= retrieval.NEIGHBOUR_WINDOW_S
                  and (as_of is None or created[o] <= as_of)]
        return retrieval.lend_to_neighbours(by_id, walked, share)

    def final_order(self, conn: PgConnection, candidates: list[Candidate], now: float,
                    **options: Any) -> list[Candidate]:
        return ranking.final_order(conn, candidates, now, **options)

    def graph_neighbours(self, conn: PgConnection, seeds: list[Candidate], keys: list[str], limit: int,
                         as_of: float | None) -> list[Candidate]:
        return retrieval.graph_neighbours(conn, seeds, keys, limit, as_of)

    def measure_similarity(self, conn: PgConnection, vector: Sequence[float], chosen: list[Candidate],
                           info: IndexInfo | None) -> None:
        unknown = {c.memory_id: c for c in chosen if c.cosine is None}
        if not unknown or info is None or len(vector) != info.dim:
            return
        if self.vector_cache is not None:  # the recall's search has just loaded the viewer's keys
            # on a read connection right after the recall's own search: its sync still holds
            cosines = self.vector_cache.cosines(conn, info, vector, list(unknown),
                                                synced=conn.get_autocommit())
            for memory_id, cosine in cosines.items():
                unknown.pop(memory_id).similarity = cosine
            if not unknown:
                return
        rows = conn.pg.execute("SELECT memory_id, embedding <-> %s::vector FROM memory_vectors WHERE memory_id = ANY(%s)",
                               (vector_literal(vector), list(unknown))).fetchall()
        for memory_id, distance in rows:
            unknown[int(memory_id)].similarity = vectors.cosine_from_distance(float(distance))

    # -- privacy -------------------------------------------------------------------
    def pause(self, conn: PgConnection, user_id: int) -> bool:
        return conn.pg.execute("INSERT INTO memory_pauses (user_id, paused_at) VALUES (%s, %s) ON CONFLICT DO NOTHING",
                               (user_id, time.time())).rowcount > 0

    def resume(self, conn: PgConnection, user_id: int) -> bool:
        return privacy.resume(conn, user_id)    # portable SQL: privacy.py

    def paused_users(self, conn: PgConnection) -> set[int]:
        return privacy.paused_users(conn)

    def take_pause_notice(self, conn: PgConnection, user_id: int) -> bool:
        return privacy.take_pause_notice(conn, user_id)

    def personal_from_messages(self, conn: PgConnection, owner_id: int,
                               message_ids: Sequence[int]) -> list[records.Memory]:
        return privacy.personal_from_messages(conn, owner_id, message_ids)

    def own_memory(self, conn: PgConnection, owner_id: int, memory_id: int) -> records.Memory:
        return privacy.own_memory(conn, owner_id, memory_id)

    def forget_personal(self, conn: PgConnection, owner_id: int, memory_ids: Sequence[int]) -> int:
        return privacy.forget_personal(conn, owner_id, memory_ids)

    def last_message_of(self, conn: PgConnection, channel_id: int, author_id: int,
                        before: int | None) -> int | None:
        row = conn.pg.execute(
            "SELECT id FROM messages WHERE channel_id = %s AND author_id = %s AND role = 'user' AND deleted_at IS NULL "
            "AND id IS DISTINCT FROM %s::bigint ORDER BY created_at DESC, id DESC LIMIT 1",
            (channel_id, author_id, before)).fetchone()
        return int(row[0]) if row else None

    def drop_own_message(self, conn: PgConnection, author_id: int, message_id: int) -> bool:
        return privacy.drop_own_message(conn, author_id, message_id)

    # -- several processes on one database -------------------------------------------
    def take_lease(self, conn: PgConnection, name: str, holder: str, seconds: float) -> bool:
        now = time.time()
        with conn.pg.transaction():
            conn.pg.execute("SELECT pg_advisory_xact_lock(%s)", (LEASE_LOCK,))
            raw = _meta(conn, f"lease.{name}")
            if raw is not None:
                lease = json.loads(raw)
                if lease.get("holder") != holder and float(lease.get("expires", 0)) >= now:
                    return False
            _set_meta(conn, f"lease.{name}", json.dumps({"holder": holder, "expires": now + seconds}))
        return True

    def release_lease(self, conn: PgConnection, name: str, holder: str) -> bool:
        return conn.pg.execute("DELETE FROM meta WHERE key = %s AND (value::jsonb ->> 'holder') = %s",
                               (f"lease.{name}", holder)).rowcount == 1

    def lease_holder(self, conn: PgConnection, name: str) -> str | None:
        raw = _meta(conn, f"lease.{name}")
        if raw is None:
            return None
        lease = json.loads(raw)
        return lease["holder"] if lease["expires"] >= time.time() else None

    def last_run(self, conn: PgConnection, job: str) -> float | None:
        raw = _meta(conn, f"{job}.last_run")
        return float(raw) if raw is not None else None

    def record_run(self, conn: PgConnection, job: str, at: float) -> None:
        _set_meta(conn, f"{job}.last_run", repr(at))
