"""What the vector cache (bot/memory/vectors/cache.py) reads from PostgreSQL: the same cache and
scoring as on SQLite, fed from `memory_vectors` and the `vector_changes` log.

The log is read by transaction, not by `seq` (migration 8): PostgreSQL numbers a row when it
is inserted, so a transaction holding seq 10 may commit after one holding seq 11, and a
rollback leaves a gap. A cache's mark is therefore the snapshot its last read was made in
(`pg_current_snapshot()`, taken in the same statement as the rows it read): the changes it has
not applied are exactly the log rows whose transaction that snapshot did not see. Every
transaction it did not see has an id at or above the snapshot's xmin, so the read is a range
of the `xid` index. A rolled-back transaction's rows never become visible: no trace.
Pruning (a DELETE on the log) records the newest pruned transaction in meta
(`vec_pruned_xid`, by a trigger); a cache whose snapshot may not have seen it starts over.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from psycopg import sql

from bot.memory.postgres.connection import PgConnection
from bot.memory.vectors.index import IndexInfo
from bot.memory.vectors.source import Changed

Mark = tuple[str, str | None]  # (snapshot as text, vec_pruned_xid seen with it)

_POLL_FRESH = sql.SQL(
    "SELECT pg_current_snapshot()::text, (SELECT value FROM meta WHERE key = 'vec_epoch'), "
    "(SELECT value FROM meta WHERE key = 'vec_pruned_xid')")
# Since a mark: a first row with the header (snapshot, epoch, pruned xid, whether the log is
# complete), then one row per changed memory with its key, time and vector as memory_vectors
# holds them in the same snapshot (none: removed). The cache applied them with two more round
# trips (their memories' rows, then their vectors): each fact write paid three. Vectors only
# when few changed (WITH_VECTORS_MAX): more are read for the cached keys alone, as before.
WITH_VECTORS_MAX = 256
_META = "(SELECT value FROM meta WHERE key = 'vec_pruned_xid')"


def _poll_since(columns: Sequence[str]) -> str:
    """The read since a mark (parameters: mark, mark, pruned, mark, the columns', WITH_VECTORS_MAX);
    `columns`: more of the caller's, after the header's own (storage.plan_state's: one round trip
    for both, in one snapshot)."""
    extra = "".join(f", {column}" for column in columns)
    return ("WITH changed AS MATERIALIZED (SELECT DISTINCT memory_id FROM vector_changes WHERE "
            "xid >= pg_snapshot_xmin(%s::pg_snapshot) AND NOT pg_visible_in_snapshot(xid, %s::pg_snapshot)) "
            f"SELECT pg_current_snapshot()::text, (SELECT value FROM meta WHERE key = 'vec_epoch'), {_META}, "
            f"coalesce(%s::xid8 IS NOT DISTINCT FROM {_META}::xid8 OR {_META}::xid8 < pg_snapshot_xmin(%s::pg_snapshot), "
            f"true), NULL::bigint, NULL::text, NULL::float8, NULL::bytea{extra} "
            "UNION ALL SELECT NULL, NULL, NULL, NULL, c.memory_id, v.vis_key, v.created_at, "
            "CASE WHEN (SELECT count(*) FROM changed) <= %s THEN vector_send(v.embedding) END"
            + ", NULL" * len(columns) + " FROM changed c LEFT JOIN memory_vectors v ON v.memory_id = c.memory_id")


_POLL_SINCE = _poll_since([]).encode()


LOAD_ROWS = 4096  # rows a key's load fetches at a time


def _vectors(rows: list[tuple[Any, ...]], dim: int) -> np.ndarray:
    """pgvector's binary form (vector_send: int16 dim, int16 unused, dim float4 big-endian) of
    each row's last column, as one float32 matrix."""
    if not rows:
        return np.zeros((0, dim), dtype=np.float32)
    raw = np.frombuffer(b"".join(bytes(row[-1]) for row in rows), dtype=np.uint8).reshape(len(rows), 4 + 4 * dim)
    return np.ascontiguousarray(raw[:, 4:]).view(">f4").astype(np.float32)


class PostgresVectorSource:
    """The vector cache's storage reads on PostgreSQL (vector_cache.VectorSource)."""

    # A cold key of more vectors than this is loaded in the background, and searched in the
    # server meanwhile (keys.INLINE_LOAD_MAX, the cache's own bound, is far higher). A load
    # brings every vector over the connection and converts it, many times the cost of the
    # server's own scan of them: a recall that loaded a heavy user's key waited far longer
    # than the scan would have taken (docs/performance.md).
    inline_load_max = 256
    # Such a key is loaded only when met again within this many seconds (admission.SecondHit):
    # with the budget full, loads of keys met once evicted keys met again soon, which were
    # read back in turn, and each load contended with the recalls beside it.
    admit_window_s = 300.0

    def __init__(self, server_knn: Any, server_similar: Any) -> None:
        self._server_knn = server_knn          # the backend's exact/HNSW search in the server
        self._server_similar = server_similar

    def poll(self, conn: PgConnection, mark: Mark | None) -> tuple[str | None, list[int], Mark, bool, Changed | None]:
        """One round trip: (vec_epoch, ids changed since `mark`, the new mark, whether the log
        still holds every change `mark` did not see, the changed memories' keys and vectors)."""
        if mark is None:
            row = conn.pg.execute(_POLL_FRESH).fetchone()
            assert row is not None
            return row[1], [], (str(row[0]), row[2]), True, None
        return self.poll_beside(conn, mark, [], [])[0]

    def poll_beside(self, conn: PgConnection, mark: Mark, columns: Sequence[str], params: Sequence[Any]
                    ) -> tuple[tuple[str | None, list[int], Mark, bool, Changed], tuple[Any, ...]]:
        """`poll(mark)` and the caller's `columns` (with their `params`) in one statement: (the
        poll, the columns' values). Their statements are planned for their values (not prepared)."""
        with conn.pg.cursor(binary=True) as cursor:
            rows = cursor.execute(_poll_since(columns).encode() if columns else _POLL_SINCE,
                                  [mark[0], mark[0], mark[1], mark[0], *params, WITH_VECTORS_MAX],
                                  prepare=False if columns else None).fetchall()
        header = next(row for row in rows if row[4] is None)
        states: Changed = {}
        for row in rows:
            if row[4] is not None:
                vector = _vectors([(row[7],)], (len(row[7]) - 4) // 4)[0] if row[7] is not None else None
                states[int(row[4])] = (str(row[5]), float(row[6]), vector) if row[5] is not None else None
        return (header[1], list(states), (str(header[0]), header[2]), bool(header[3]), states), tuple(header[8:])

    def changed_between(self, conn: PgConnection, older: Mark, newer: Mark) -> set[int]:
        """Ids whose change `newer` saw and `older` did not."""
        rows = conn.pg.execute(
            "SELECT DISTINCT memory_id FROM vector_changes WHERE xid >= pg_snapshot_xmin(%(old)s::pg_snapshot) "
            "AND pg_visible_in_snapshot(xid, %(new)s::pg_snapshot) AND NOT pg_visible_in_snapshot(xid, %(old)s::pg_snapshot)",
            {"old": older[0], "new": newer[0]}).fetchall()
        return {int(row[0]) for row in rows}

    def key_size_at_least(self, conn: PgConnection, key: str, cap: int) -> int:
        """How many vectors `key` holds in `memory_vectors`, counted up to `cap` (+1) only."""
        row = conn.pg.execute("SELECT count(*) FROM (SELECT 1 FROM memory_vectors WHERE vis_key = %s LIMIT %s) v",
                              (key, cap + 1)).fetchone()
        return int(row[0]) if row else 0

    def load_key(self, conn: PgConnection, info: IndexInfo, key: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """A key's rows, fetched LOAD_ROWS at a time into arrays sized by their count (one
        snapshot for both), vectors in binary (text would cost far more to parse).
        `memory_vectors` holds exactly the active memories' vectors (archiving and deleting
        remove the row). Fetched all at once, the key's vectors were held several times over (the
        driver's result, Python's rows, their joined bytes, each conversion): gigabytes for the
        busiest key of a big bot."""
        where = "FROM memory_vectors WHERE vis_key = %s AND vector_dims(embedding) = %s"
        with conn.pg.transaction():
            conn.pg.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            counted = conn.pg.execute(f"SELECT count(*) {where}".encode(), (key, info.dim)).fetchone()
            count = int(counted[0]) if counted else 0
            ids = np.empty(count, dtype=np.int64)
            created = np.empty(count, dtype=np.float64)
            matrix = np.empty((count, info.dim), dtype=np.float32)
            filled = 0
            with conn.pg.cursor(name="muninn_load_key", binary=True) as cursor:
                cursor.execute(f"SELECT memory_id, created_at, vector_send(embedding) {where}".encode(), (key, info.dim))
                while rows := cursor.fetchmany(LOAD_ROWS):
                    end = filled + len(rows)
                    ids[filled:end] = [row[0] for row in rows]
                    created[filled:end] = [row[1] for row in rows]
                    matrix[filled:end] = _vectors(rows, info.dim)
                    filled = end
        return ids[:filled], created[:filled], matrix[:filled]

    def read_vectors(self, conn: PgConnection, info: IndexInfo, ids: Sequence[int]) -> dict[int, np.ndarray]:
        """The stored vectors of those of `ids` that have one of the index's dimension."""
        if not ids:
            return {}
        with conn.pg.cursor(binary=True) as cursor:
            rows = cursor.execute("SELECT memory_id, vector_send(embedding) FROM memory_vectors "
                                  "WHERE memory_id = ANY(%s) AND vector_dims(embedding) = %s",
                                  (list(ids), info.dim)).fetchall()
        return {int(row[0]): vector for row, vector in zip(rows, _vectors(rows, info.dim), strict=True)}

    def search(self, conn: PgConnection, info: IndexInfo, query: list[float], keys: list[str], k: int,
               as_of: float | None) -> list[tuple[int, float]]:
        """The server's own search (the backend's exact/HNSW KNN): [(id, L2 distance)], nearest first."""
        return self._server_knn(conn, info, query, keys, k, as_of)

    def similar_to_memory(self, conn: PgConnection, info: IndexInfo, memory_id: int, keys: list[str],
                          k: int) -> list[tuple[int, float]]:
        """Nearest neighbours of a stored memory's own vector, searched in the server."""
        return self._server_similar(conn, info, memory_id, keys, k)
