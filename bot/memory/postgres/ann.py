"""Approximate vector search on PostgreSQL for the big visibility keys: one partial HNSW index per key.

The vector caches answer most searches (bot/memory/vectors/cache.py); the server searches the keys a
process does not hold (beyond MUNINN_VECTOR_CACHE_MB, or still loading). For a small key its exact
scan (the vis_key index, then a top-N sort) is cheap; for a big one it reads every vector of the
key, far too slow for a recall. So maintenance gives each key of at least MUNINN_VECTOR_INDEX_MIN
vectors an HNSW index of its own, partial (`WHERE vis_key = '<key>'`), made with CREATE INDEX
CONCURRENTLY on a connection of its own (writes go on meanwhile), and drops it once the key has
fallen under half that size. The search sends the key as a literal, so the planner can prove
the partial index covers the query; keys without a valid index keep the exact scan.

Why partial per key and not one index over the table (dropped by migration 9): the one index
took the insert cost of every vector, and searched with a filter on the key it found little of the
exact top results of a small key (the graph's neighbours are mostly other keys' rows). A
partial index holds only its key's rows: every row it finds is visible to the viewer, a write
into a small key pays nothing, and a key's search is as good as HNSW gets on that key alone.

The index holds half-precision vectors (`embedding::halfvec(DIM)`): a smaller graph than float32's,
faster to build and to search, for the same recall, since the candidates it returns are
rescored with their stored float32 vectors (the distances returned are exact). The column is
dimension-free (`vector`), so the predicate also says `vector_dims(embedding) = DIM`: a
vector of another size under that key (a new model, before the reindex) is simply not in it, and
the cast never fails a write. The index names carry the form, the dimension and a hash of the key
(keys are free text, names are not); an index of an older form is dropped like an obsolete one,
and one left INVALID by a cancelled or failed build is dropped and made again by the next run.
"""
from __future__ import annotations

import hashlib
import logging
import threading
import time
import weakref
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from psycopg import sql

from bot.memory.postgres.connection import PgConnection
from bot.memory.postgres.vector_forms import vector_literal
from bot.memory.vectors.index import IndexInfo

log = logging.getLogger(__name__)

PREFIX = "memory_vectors_ann_"
# hnsw.ef_search: the breadth of the graph walk, which sets the recall (and the walk's time);
# a broader walk found little more of the exact top results on real embeddings, for its time.
EF_SEARCH = 200
# Of the walk's best (by half-precision distance) this many more than the k asked are rescored
# with their stored vectors: each is a read of its table row, the costliest part of the search,
# and ranks from half precision are nearly exact, so more kept no more of the true top k.
RESCORE_EXTRA = 20
RESCORE_MIN = 40
MAX_DIM = 4000  # pgvector's HNSW indexes halfvec of at most this many dimensions
M, EF_CONSTRUCTION = 16, 64  # pgvector's defaults: its recall at its build cost
REFRESH_S = 30.0  # how long a process trusts its list of valid indexes (another process builds them)


def index_name(key: str, dim: int) -> str:
    """The index of `key`'s `dim`-dimensional vectors: its name says the dimension, a hash says the key."""
    return f"{PREFIX}h{int(dim)}_{hashlib.sha256(key.encode('utf-8')).hexdigest()[:24]}"


def _predicate(key: str, dim: int) -> sql.Composed:
    return sql.SQL("vis_key = {key} AND vector_dims(embedding) = {dim}").format(
        key=sql.Literal(key), dim=sql.Literal(int(dim)))


def _cast(dim: int) -> sql.Composed:
    return sql.SQL("embedding::halfvec({dim})").format(dim=sql.SQL(str(int(dim))))


@dataclass
class IndexRow:
    """One ANN index in the catalog: its name, whether PostgreSQL may use it, its size on disk."""
    name: str
    valid: bool
    size_bytes: int


def listed(conn: PgConnection) -> list[IndexRow]:
    """Every ANN index on memory_vectors (valid or left invalid by a failed build)."""
    rows = conn.pg.execute(
        "SELECT c.relname, i.indisvalid AND i.indisready, pg_relation_size(c.oid) FROM pg_index i "
        "JOIN pg_class c ON c.oid = i.indexrelid WHERE i.indrelid = 'memory_vectors'::regclass "
        "AND starts_with(c.relname, %s) ORDER BY c.relname", (PREFIX,)).fetchall()
    return [IndexRow(str(name), bool(valid), int(size)) for name, valid, size in rows]


class AnnIndexes:
    """One process's view of which keys have a usable ANN index (refreshed every REFRESH_S, and at
    once after this process built or dropped one), and the search that uses them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._valid: frozenset[str] = frozenset()
        self._read_at = float("-inf")
        self._ef: "weakref.WeakKeyDictionary[Any, int]" = weakref.WeakKeyDictionary()  # session -> its hnsw.ef_search
        # submit(fn, *args): fn(conn, *args) on another read connection (the engine's, recall/beside.py),
        # its Future or None (no reader to spare); None: every part of a search on the caller's connection
        self.beside: Callable[..., Future[Any] | None] | None = None

    def forget(self) -> None:
        """Read the catalog again at the next search (an index was made or dropped)."""
        with self._lock:
            self._read_at = float("-inf")

    def valid_names(self, conn: PgConnection) -> frozenset[str]:
        """The names of the valid ANN indexes, as of at most REFRESH_S ago."""
        now = time.monotonic()
        with self._lock:
            if now - self._read_at < REFRESH_S:
                return self._valid
        names = frozenset(row.name for row in listed(conn) if row.valid)
        with self._lock:
            self._valid, self._read_at = names, now
        return names

    def search(self, conn: PgConnection, info: IndexInfo, vector: Sequence[float], keys: list[str], k: int,
               as_of: float | None, exact: Callable[..., list[tuple[int, float]]]) -> list[tuple[int, float]]:
        """The k nearest under `keys`: each key with a valid index searched through it (the best of
        its graph walk, rescored: exact distances), the others by `exact` (the server's scan) in one statement; merged,
        nearest first. As of a past moment: exact (a time filter would leave few of a graph walk's rows)."""
        if not keys or k <= 0:
            return []
        valid = self.valid_names(conn) if as_of is None else frozenset()
        indexed = [key for key in dict.fromkeys(keys) if index_name(key, info.dim) in valid]
        if not indexed:
            return exact(conn, info, vector, keys, k, as_of)
        rest = [key for key in keys if key not in indexed]
        rescored = max(RESCORE_MIN, k + RESCORE_EXTRA)
        literal = vector_literal(vector)
        # The parts are statements the server answers one at a time per connection: the scan of
        # the keys without an index (cold keys of a few thousand vectors take as long as a walk)
        # and each walk but the last go to other readers when there are, the last walk runs here.
        parts: list[tuple[Callable[..., list[tuple[int, float]]], tuple[Any, ...]]] = []
        if rest:
            parts.append((exact, (info, vector, rest, k, as_of)))
        parts += [(self._walk, (info, key, literal, rescored, k)) for key in indexed[:-1]]
        beside = self.beside if conn.get_autocommit() else None  # an open transaction sees its own writes
        started = [(beside(fn, *args) if beside is not None else None, fn, args) for fn, args in parts]
        found = self._walk(conn, info, indexed[-1], literal, rescored, k)
        for future, fn, args in started:
            # a part no reader has begun is withdrawn and run here: never wait for a queued job
            found += fn(conn, *args) if future is None or future.cancel() else future.result()
        found.sort(key=lambda pair: (pair[1], pair[0]))
        return found[:k]

    def _walk(self, conn: PgConnection, info: IndexInfo, key: str, literal: str, limit: int,
              k: int) -> list[tuple[int, float]]:
        self._give_ef(conn, max(EF_SEARCH, limit))
        return self._one_key(conn, info, key, literal, limit, k)

    def _give_ef(self, conn: PgConnection, ef: int) -> None:
        """hnsw.ef_search for this session (set once per connection: a SET per search is a round trip).
        Inside a transaction only for it: a rollback would undo a session's SET unseen."""
        if not conn.get_autocommit():
            conn.pg.execute(sql.SQL("SET LOCAL hnsw.ef_search = {ef}").format(ef=sql.Literal(int(ef))))
            return
        with self._lock:
            given = self._ef.get(conn.pg)
        if given != ef:
            conn.pg.execute(sql.SQL("SET hnsw.ef_search = {ef}").format(ef=sql.Literal(int(ef))))
            with self._lock:
                self._ef[conn.pg] = ef

    @staticmethod
    def _one_key(conn: PgConnection, info: IndexInfo, key: str, literal: str, limit: int,
                 k: int) -> list[tuple[int, float]]:
        # The key and the dimension as literals: only then does the planner match the partial
        # index's predicate. Not prepared, so every call is planned with them.
        # The graph's candidates by their half-precision distance, then each one's exact distance.
        query = sql.SQL("SELECT memory_id, embedding <-> %s::vector AS d FROM (SELECT memory_id, embedding "
                        "FROM memory_vectors WHERE {predicate} ORDER BY {cast} <-> %s::halfvec({dim}) LIMIT %s) c "
                        "ORDER BY d, memory_id LIMIT %s").format(
            cast=_cast(info.dim), dim=sql.SQL(str(int(info.dim))), predicate=_predicate(key, info.dim))
        rows = conn.pg.execute(query, (literal, literal, limit, k), prepare=False).fetchall()
        return [(int(mid), float(d)) for mid, d in rows]


@dataclass
class Plan:
    """What a maintenance run does to the ANN indexes: make these, drop those."""
    create: list[tuple[str, str]] = field(default_factory=list)   # (key, index name)
    drop: list[str] = field(default_factory=list)                 # obsolete or invalid indexes
    invalid: list[str] = field(default_factory=list)              # of `drop`: left by a failed build


def plan(conn: PgConnection, info: IndexInfo | None, min_vectors: int,
         held: Callable[[list[tuple[str, int]]], set[str]] | None = None) -> Plan:
    """Keys of at least `min_vectors` vectors without a valid index get one, unless `held` (given
    the keys' sizes) says the vector caches hold them: then the index would only cost writes. An
    index whose key fell below half of that or is held (or that holds another dimension, or any
    when `min_vectors` is 0 or there is no vector index) is dropped, as is an invalid one (to be
    made again)."""
    out = Plan()
    rows = listed(conn)
    keep: dict[str, str] = {}
    if info is not None and 0 < min_vectors and info.dim <= MAX_DIM:
        sizes = conn.pg.execute("SELECT vis_key, count(*) FROM memory_vectors GROUP BY vis_key HAVING count(*) >= %s",
                                (max(1, min_vectors // 2),)).fetchall()
        in_caches = held([(str(key), int(count)) for key, count in sizes]) if held is not None else set()
        # biggest first: the slowest to search without one (and a stopped run has made those)
        for key, count in sorted(sizes, key=lambda row: (-int(row[1]), str(row[0]))):
            if str(key) in in_caches:
                continue
            name = index_name(str(key), info.dim)
            keep[name] = str(key)
            if int(count) >= min_vectors:
                out.create.append((str(key), name))
    present = {row.name: row for row in rows}
    for row in rows:
        if not row.valid:
            out.drop.append(row.name)
            out.invalid.append(row.name)
        elif row.name not in keep:
            out.drop.append(row.name)
    out.create = [(key, name) for key, name in out.create if name not in present or not present[name].valid]
    return out


def carry_out(conn: PgConnection, info: IndexInfo, todo: Plan, build_mb: int = 0,
              stop: threading.Event | None = None) -> tuple[int, int]:
    """Drop and make the indexes of `todo`, CONCURRENTLY (writes go on), on `conn`, an autocommit
    connection of its own; `build_mb`: maintenance_work_mem for the builds (0: the server's).
    A build that fails is dropped and logged: the key keeps the exact scan until the next run.
    Returns (made, dropped)."""
    made = dropped = 0
    for name in todo.drop:
        if name in todo.invalid:
            log.warning("vector index %s was left invalid (a build was cancelled or failed): dropping it to make "
                        "it again", name)
        conn.pg.execute(sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS {}").format(sql.Identifier(name)))
        dropped += 1
    if build_mb > 0:
        conn.pg.execute(sql.SQL("SET maintenance_work_mem = {}").format(sql.Literal(f"{int(build_mb)}MB")))
    for key, name in todo.create:
        if stop is not None and stop.is_set():
            break
        started = time.perf_counter()
        try:
            conn.pg.execute(sql.SQL(
                "CREATE INDEX CONCURRENTLY IF NOT EXISTS {name} ON memory_vectors USING hnsw (({cast}) halfvec_l2_ops) "
                "WITH (m = {m}, ef_construction = {ef}) WHERE {predicate}").format(
                name=sql.Identifier(name), cast=_cast(info.dim), m=sql.Literal(M), ef=sql.Literal(EF_CONSTRUCTION),
                predicate=_predicate(key, info.dim)))
        except Exception as exc:  # left INVALID: drop it, the next run tries again
            if stop is not None and stop.is_set():  # left invalid (a drop could wait as long): the next run drops it
                log.info("stopped building vector index %s (the next maintenance run makes it)", name)
                break
            log.warning("could not make vector index %s (%s); its key is searched exactly until the next "
                        "maintenance run", name, str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)
            _drop_quietly(conn, name)
            continue
        made += 1
        log.info("made vector index %s for a visibility key of many vectors in %.1f s", name,
                 time.perf_counter() - started)
    return made, dropped


def _drop_quietly(conn: PgConnection, name: str) -> None:
    try:
        conn.pg.execute(sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS {}").format(sql.Identifier(name)))
    except Exception as exc:  # the connection is gone: the next run finds the index invalid and drops it
        log.debug("dropping %s failed too: %s", name, exc)


def summary(conn: Any) -> tuple[int, int, int]:
    """(valid indexes, invalid ones, bytes on disk): for `muninn doctor`."""
    rows = listed(conn)
    return (sum(row.valid for row in rows), sum(not row.valid for row in rows), sum(row.size_bytes for row in rows))
