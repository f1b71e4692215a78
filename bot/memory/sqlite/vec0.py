"""The vector index: a sqlite-vec vec0 table holding the embeddings of active memories.

Layout, chosen so that a search reads exactly the vectors the viewer may see:
  vis_key    partition key: one partition per visibility key, so a scoped KNN visits only
             the viewer's own partitions (the old layout hashed keys into 256 buckets, and a
             key sharing a bucket with a busy channel paid for all of that channel's vectors);
  created_at metadata column for `--as-of` queries.
Small chunks (DEFAULT_CHUNK_SIZE) keep the per-key preallocation cheap with thousands of keys.

vec0 is the store of record. Searches go through `vector_cache.VectorCache` (numpy over
each key's vectors, kept in step through the `vector_changes` log that `put`/`remove` append
to) when the connection has one; `knn_vec0` is the exact fallback and the reference.
Vectors are L2-normalised before storage, so L2 distance orders like cosine and
cosine = 1 - d^2 / 2. The table is created when the first embedding reveals the model's
dimension; the model and dimension are recorded in `meta`.
"""
from __future__ import annotations

import logging
import struct
import weakref
from typing import TYPE_CHECKING, Iterable, Iterator, Sequence

import numpy as np

from bot.logs import Throttle
from bot.memory.connection import Connection
from bot.memory.scope import ACTIVE
from bot.memory.sql.queries import get_meta, query_value, set_meta
from bot.memory.sql.transactions import write_transaction
from bot.memory.sqlite import vector_keys
from bot.memory.vectors.index import MAX_DIM, REINDEX_PENDING, IndexInfo, VectorSizeError, pack, usable_dim

if TYPE_CHECKING:
    from bot.memory.vectors.cache import VectorCache

log = logging.getLogger(__name__)
_warnings = Throttle()

READ_BATCH = 500  # ids per statement in read_vectors (SQLite's bound parameters stay well under its limit)
DEFAULT_CHUNK_SIZE = 8  # with thousands of small keys, bigger chunks leave many slots empty
LAYOUT = "key"           # meta vec_layout; databases without it have the old bucketed table


def index_info(conn: Connection) -> IndexInfo | None:
    """The vector index (model, dimension) as recorded in meta; None without a vec0 table or a recorded model."""
    model = get_meta(conn, "embed_model")
    if model is None or not table_exists(conn):
        return None
    return IndexInfo(model, int(get_meta(conn, "embed_dim") or 0))


def current_index(conn: Connection, model: str) -> IndexInfo | None:
    """The vector index if it was made with `model` (else None: a reindex is pending)."""
    info = index_info(conn)
    return info if info is not None and info.model == model else None


def index_for(conn: Connection, model: str, dim: int) -> IndexInfo | None:
    """The index that `dim`-dimensional vectors of `model` belong in, created on the first
    embedding ever. None when they do not fit (another model, another size): the memory is
    stored without a vector and the backfill embeds it after `muninn reindex`."""
    info = index_info(conn)
    if info is None:
        if not usable_dim(dim):  # store the memories without vectors rather than not at all
            if _warnings.ready("dim"):
                log.warning("%s returned %d-dimensional vectors; Muninn indexes 1 to %d: choose another "
                            "OLLAMA_EMBED_MODEL", model, dim, MAX_DIM)
            return None
        return create_index(conn, model, dim)
    if info.model != model:
        return None
    if info.dim != dim:
        if _warnings.ready("dim"):
            log.warning("%s returned %d-dimensional vectors but the index holds %d: run `muninn reindex`",
                        model, dim, info.dim)
        return None
    return info


def table_exists(conn: Connection) -> bool:
    """Whether the vec0 table exists (it is created with the first embedding)."""
    return query_value(conn, "SELECT count(*) FROM sqlite_master WHERE name = 'vec_memories'") == 1


def _create_table(conn: Connection, dim: int, chunk_size: int) -> None:
    conn.execute(
        f"CREATE VIRTUAL TABLE vec_memories USING vec0("
        f"memory_id INTEGER PRIMARY KEY, vis_key TEXT PARTITION KEY, created_at FLOAT, "
        f"embedding FLOAT[{dim}], chunk_size={chunk_size})")
    index_partitions(conn)
    vector_keys.follow_keys(conn)  # the vector leaves with its memory's old visibility key
    set_meta(conn, "vec_layout", LAYOUT)
    # A new table: every cache made from the old one must start over.
    set_meta(conn, "vec_epoch", str(int(get_meta(conn, "vec_epoch") or 0) + 1))
    conn.execute("DELETE FROM vector_changes")


def create_index(conn: Connection, model: str, dim: int, *,
                 chunk_size: int = DEFAULT_CHUNK_SIZE) -> IndexInfo:
    """Create the vec0 table for this model's dimension (call inside a transaction)."""
    if not usable_dim(dim):
        raise VectorSizeError(f"embedding dimension {dim} is not usable")
    _create_table(conn, dim, chunk_size)
    set_meta(conn, "embed_model", model)
    set_meta(conn, "embed_dim", str(dim))
    return IndexInfo(model, dim)


def needs_upgrade(conn: Connection) -> bool:
    """The table still has the bucketed layout of databases made before per-key partitions."""
    return table_exists(conn) and get_meta(conn, "vec_layout") != LAYOUT


def upgrade_layout(conn: Connection, *, chunk_size: int = DEFAULT_CHUNK_SIZE) -> int:
    """Move every vector of an old bucketed table into the per-key layout, in one transaction
    (vec0 tables cannot be renamed: the rows go through a plain temporary table). Returns
    how many vectors moved. Idempotent: a database already upgraded is left alone."""
    if not needs_upgrade(conn):
        return 0
    dim = int(get_meta(conn, "embed_dim") or 0)
    with write_transaction(conn):
        conn.execute("CREATE TEMP TABLE vec_upgrade (memory_id INTEGER PRIMARY KEY, vis_key TEXT, "
                     "created_at FLOAT, embedding BLOB)")
        conn.execute("INSERT INTO vec_upgrade SELECT v.memory_id, m.vis_key, m.created_at, v.embedding "
                     "FROM vec_memories v JOIN memories m ON m.id = v.memory_id")
        conn.execute("DROP TABLE vec_memories")
        conn.execute("DELETE FROM meta WHERE key = 'vec_buckets'")
        _create_table(conn, dim, chunk_size)
        conn.execute("INSERT INTO vec_memories(memory_id, vis_key, created_at, embedding) "
                     "SELECT memory_id, vis_key, created_at, embedding FROM vec_upgrade ORDER BY vis_key, memory_id")
        moved = query_value(conn, "SELECT count(*) FROM vec_upgrade")
        conn.execute("UPDATE memories SET embedded = 0 WHERE embedded = 1 AND id NOT IN "
                     "(SELECT memory_id FROM vec_upgrade)")
        conn.execute("DROP TABLE temp.vec_upgrade")
    return int(moved)


def mark_reindex_pending(conn: Connection) -> None:
    """Note that the vectors were dropped for a new model (recall says "partial" until the backfill is done)."""
    set_meta(conn, REINDEX_PENDING, "1")


def reindex_pending(conn: Connection) -> bool:
    """Whether a reindex is unfinished."""
    return get_meta(conn, REINDEX_PENDING) is not None


def index_state(conn: Connection) -> tuple[IndexInfo | None, bool]:
    """(index_info, reindex_pending) in one statement: every recall asks (four statements were
    four hand-overs of the GIL on a read connection)."""
    model, tables, dim, pending = conn.execute(
        "SELECT (SELECT value FROM meta WHERE key = 'embed_model'), "
        "(SELECT count(*) FROM sqlite_master WHERE name = 'vec_memories'), "
        "(SELECT value FROM meta WHERE key = 'embed_dim'), (SELECT value FROM meta WHERE key = ?)",
        (REINDEX_PENDING,)).fetchall()[0]
    info = IndexInfo(str(model), int(dim or 0)) if model is not None and tables == 1 else None
    return info, pending is not None


def mark_reindex_done(conn: Connection) -> None:
    """Every active memory has its vector again (called when the backfill finds none missing)."""
    if reindex_pending(conn):
        conn.execute("DELETE FROM meta WHERE key = ?", (REINDEX_PENDING,))


def index_partitions(conn: Connection) -> None:
    """Index the partition column of vec0's chunk table. sqlite-vec 0.1.9 finds a partition's
    chunks by scanning that whole table, once per partition searched; the cache also loads a
    key's vectors through it (vector_cache.load_key). The index lives and dies with the shadow
    table; skipped if a future sqlite-vec names it otherwise."""
    columns = {row[1] for row in conn.execute("PRAGMA table_info(vec_memories_chunks)")}
    if "partition00" in columns:
        conn.execute("CREATE INDEX IF NOT EXISTS vec_memories_chunks_partition ON vec_memories_chunks (partition00)")


def drop_index(conn: Connection) -> None:
    """Forget every vector (before a re-index with another model); call inside a transaction."""
    conn.execute("DROP TABLE IF EXISTS vec_memories")
    conn.execute("DROP TRIGGER IF EXISTS vec_memories_follow_key")  # names the table: back with the next one
    conn.execute("DELETE FROM meta WHERE key IN ('embed_model', 'embed_dim', 'vec_buckets', 'vec_layout')")
    conn.execute("UPDATE memories SET embedded = 0 WHERE embedded = 1")
    conn.execute("DELETE FROM vector_changes")


def put(conn: Connection, info: IndexInfo, memory_id: int, vis_key: str, created_at: float,
        vector: Sequence[float]) -> None:
    """Store or replace one memory's vector (vec0 has no upsert: delete + insert)."""
    if len(vector) != info.dim:
        raise VectorSizeError(f"embedding has {len(vector)} dimensions, the index has {info.dim}")
    conn.execute("DELETE FROM vec_memories WHERE memory_id = ?", (memory_id,))
    conn.execute(
        "INSERT INTO vec_memories(memory_id, vis_key, created_at, embedding) VALUES (?, ?, ?, ?)",
        (memory_id, vis_key, float(created_at), pack(vector)))
    conn.execute("UPDATE memories SET embedded = 1 WHERE id = ?", (memory_id,))
    conn.execute("INSERT INTO vector_changes(memory_id) VALUES (?)", (memory_id,))


def remove(conn: Connection, memory_ids: Iterable[int]) -> None:
    """Delete these memories' vectors and log each one removed for the vector caches (no table: nothing to do)."""
    if not table_exists(conn):
        return
    for memory_id in memory_ids:
        conn.execute("DELETE FROM vec_memories WHERE memory_id = ?", (memory_id,))
        if conn.changes():
            conn.execute("INSERT INTO vector_changes(memory_id) VALUES (?)", (memory_id,))


# -- search --------------------------------------------------------------------

_caches: "weakref.WeakKeyDictionary[Connection, VectorCache]" = weakref.WeakKeyDictionary()


def attach_cache(conn: Connection, cache: "VectorCache") -> None:
    """Searches on `conn` go through `cache` (shared by the engine's connections); a cache without
    a source reads vec0 (SQLiteVectorSource)."""
    if not cache.has_source():
        cache.source = SQLiteVectorSource()
    _caches[conn] = cache


def cache_of(conn: Connection) -> "VectorCache | None":
    """The vector cache searches on `conn` go through, or None."""
    return _caches.get(conn)


def knn(conn: Connection, info: IndexInfo, query: Sequence[float], keys: list[str], k: int,
        as_of: float | None = None) -> list[tuple[int, float]]:
    """The k nearest vectors among those whose vis_key is in `keys`: [(memory_id, distance)],
    nearest first."""
    if len(query) != info.dim:
        raise VectorSizeError(f"query embedding has {len(query)} dimensions, the index has {info.dim}")
    if not keys or k <= 0:
        return []
    cache = cache_of(conn)
    if cache is not None:
        return cache.knn(conn, info, query, keys, k, as_of)
    return knn_vec0(conn, info, query, keys, k, as_of)


def cosines(conn: Connection, info: IndexInfo, query: Sequence[float], ids: Sequence[int], *,
            synced: bool = False) -> dict[int, float]:
    """Cosine to `query` of each stored vector among `ids` (ids without a vector are left out):
    from the cache when it holds them, else one vec0 point lookup each (vec0 answers
    `memory_id = ?` by rowid but `IN (...)` with a scan, far slower than one lookup per id;
    the distance is computed in C). `synced`: VectorCache.cosines'."""
    if len(query) != info.dim:
        raise VectorSizeError(f"query embedding has {len(query)} dimensions, the index has {info.dim}")
    cache = cache_of(conn)
    out = cache.cosines(conn, info, query, ids, synced=synced) if cache is not None else {}
    missing = [memory_id for memory_id in ids if memory_id not in out]
    if missing:
        packed = pack(query)
        for memory_id in missing:
            distance = query_value(conn, "SELECT vec_distance_cosine(embedding, ?) FROM vec_memories "
                                         "WHERE memory_id = ?", (packed, memory_id))
            if distance is not None:
                out[memory_id] = 1.0 - distance
    return out


def knn_vec0(conn: Connection, info: IndexInfo, query: Sequence[float], keys: list[str], k: int,
             as_of: float | None = None) -> list[tuple[int, float]]:
    """The same search inside sqlite-vec: one KNN per partition (vec0 runs `IN` on a partition
    key that way and concatenates unsorted), sorted outside."""
    sql = (
        "WITH knn AS MATERIALIZED ("
        " SELECT memory_id, distance FROM vec_memories"
        " WHERE embedding MATCH ? AND k = ?"
        f" AND vis_key IN ({','.join('?' * len(keys))})"
        + (" AND created_at <= ?" if as_of is not None else "") +
        ") SELECT memory_id, distance FROM knn ORDER BY distance, memory_id LIMIT ?")
    params: list = [pack(query), k, *keys]
    if as_of is not None:
        params.append(float(as_of))
    params.append(k)
    return [(row[0], row[1]) for row in conn.execute(sql, params)]


def has_chunk_tables(conn: Connection) -> bool:
    """vec0's shadow tables have the layout of sqlite-vec 0.1.x (checked once per connection)."""
    known = _chunk_tables.get(conn)
    if known is None:
        columns = {row[1] for row in conn.execute("PRAGMA table_info(vec_memories_chunks)")}
        known = {"partition00", "validity", "rowids", "size"} <= columns and query_value(
            conn, "SELECT count(*) FROM sqlite_master WHERE name IN ('vec_memories_vector_chunks00', "
                  "'vec_memories_rowids')") == 2
        if known:  # a missing table may be created later; a present one keeps its layout
            _chunk_tables[conn] = known
    return known


_chunk_tables: "weakref.WeakKeyDictionary[Connection, bool]" = weakref.WeakKeyDictionary()


def vector_bytes(conn: Connection, info: IndexInfo, memory_id: int) -> bytes | None:
    """One stored vector (float32 bytes): through the chunk tables when their layout is known,
    as reading vec0's own column is slow, row by row."""
    if has_chunk_tables(conn):
        for offset, blob in conn.execute(
                "SELECT r.chunk_offset, v.vectors FROM vec_memories_rowids r CROSS JOIN vec_memories_vector_chunks00 v "
                "ON v.rowid = +r.chunk_id WHERE r.rowid = ?", (memory_id,)):  # `+`: use the untyped column's index
            size = info.dim * 4
            return bytes(blob[offset * size:(offset + 1) * size])
        return None
    return query_value(conn, "SELECT embedding FROM vec_memories WHERE memory_id = ?", (memory_id,))


def vector_of(conn: Connection, info: IndexInfo, memory_id: int) -> list[float] | None:
    """One stored vector as floats, or None."""
    blob = vector_bytes(conn, info, memory_id)
    return None if blob is None else list(struct.unpack(f"{info.dim}f", blob))


def similar_to_memory(conn: Connection, info: IndexInfo, memory_id: int, keys: list[str],
                      k: int) -> list[tuple[int, float]]:
    """Nearest neighbours of a stored memory's own vector, itself excluded."""
    query = vector_of(conn, info, memory_id)
    if query is None:
        return []
    return [(mid, d) for mid, d in knn(conn, info, query, keys, k + 1) if mid != memory_id][:k]


def change_mark(conn: Connection) -> int:
    """The latest vector change this connection can see: equal marks mean no vector was stored
    or removed in between, so a search made at the first still holds."""
    return int(query_value(conn, "SELECT coalesce(max(seq), 0) FROM vector_changes") or 0)


def neighbours_many(conn: Connection, info: IndexInfo, items: Sequence[tuple[int, str]],
                    k: int) -> dict[int, list[tuple[int, float]]]:
    """For each (memory id, its vis_key): its k nearest others under that key, nearest first.
    Batched through the cache (one matrix product per key) outside write transactions."""
    cache = cache_of(conn)
    if cache is not None and conn.get_autocommit():
        return cache.neighbours(conn, info, items, k)
    return {memory_id: similar_to_memory(conn, info, memory_id, [key], k) for memory_id, key in items}


def prune_changes(conn: Connection, keep: int = 100_000) -> int:
    """Drop all but the last `keep` entries of the change log (a cache further behind reloads)."""
    with write_transaction(conn):
        last = query_value(conn, "SELECT coalesce(max(seq), 0) FROM vector_changes")
        conn.execute("DELETE FROM vector_changes WHERE seq <= ?", (last - keep,))
        pruned = conn.changes()
    return pruned


# -- what the vector cache reads from SQLite (its VectorSource) ---------------------

def key_size_at_least(conn: Connection, key: str, cap: int) -> int:
    """How many vectors `key` holds, counted up to `cap` (+1) only."""
    return int(query_value(conn, "SELECT count(*) FROM (SELECT 1 FROM memories WHERE vis_key = ? AND embedded = 1 "
                                 f"AND {ACTIVE} LIMIT ?)", (key, cap + 1)))


def load_key(conn: Connection, info: IndexInfo, key: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """All vectors of one key: (ids, created_at, matrix). Through vec0's
    chunk tables (one row per chunk of vectors) when their layout is the known one: reading
    vectors one by one out of vec0 is far slower. Each chunk's rows go straight into arrays
    sized for the key's memories: gathering them first and joining them after held the key's
    vectors three times over at once (for the busiest key of a big bot, gigabytes)."""
    # Two statements, no transaction: a vector stored or removed between them is missing or
    # dropped here and put right by the next sync (its change is newer than the cache's mark).
    created_of = dict(conn.execute(
        f"SELECT id, created_at FROM memories WHERE vis_key = ? AND embedded = 1 AND {ACTIVE}", (key,)))
    # a memory has one vector, so no more rows than memories are kept
    ids = np.empty(len(created_of), dtype=np.int64)
    created = np.empty(len(created_of), dtype=np.float64)
    matrix = np.empty((len(created_of), info.dim), dtype=np.float32)
    filled = 0
    for chunk_ids, valid, vectors in key_chunks(conn, info, key):
        keep = valid & np.fromiter((mid in created_of for mid in chunk_ids.tolist()), dtype=bool,
                                   count=len(chunk_ids))
        end = filled + int(keep.sum())
        ids[filled:end] = chunk_ids[keep]
        np.compress(keep, vectors, axis=0, out=matrix[filled:end])
        filled = end
    created[:filled] = [created_of[mid] for mid in ids[:filled].tolist()]
    return ids[:filled], created[:filled], matrix[:filled]


def key_chunks(conn: Connection, info: IndexInfo,
                key: str) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(ids, which are live, vectors) of each of a key's vec0 chunks, views of the read blobs."""
    if has_chunk_tables(conn):
        # The chunk table's `rowid` column has no type: `+` drops chunk_id's affinity so that the
        # lookup uses its index (without it, SQLite scanned every chunk once per chunk).
        for size, validity, rowids, blob in conn.execute(
                "SELECT c.size, c.validity, c.rowids, v.vectors FROM vec_memories_chunks c "
                "CROSS JOIN vec_memories_vector_chunks00 v ON v.rowid = +c.chunk_id WHERE c.partition00 = ?", (key,)):
            valid = np.unpackbits(np.frombuffer(validity, dtype=np.uint8), bitorder="little")[:size].astype(bool)
            yield (np.frombuffer(rowids, dtype=np.int64)[:size], valid,
                   np.frombuffer(blob, dtype=np.float32).reshape(-1, info.dim)[:size])
    else:  # pragma: no cover - a future sqlite-vec with other shadow tables
        for memory_id, blob in conn.execute("SELECT memory_id, embedding FROM vec_memories WHERE vis_key = ?", (key,)):
            yield (np.array([memory_id], dtype=np.int64), np.ones(1, dtype=bool),
                   np.frombuffer(blob, dtype=np.float32).reshape(1, info.dim))


def read_vector(conn: Connection, info: IndexInfo, memory_id: int) -> np.ndarray | None:
    """One stored vector as a float32 array (a copy), or None."""
    vector = vector_bytes(conn, info, memory_id)
    return None if vector is None else np.frombuffer(vector, dtype=np.float32).copy()


def read_vectors(conn: Connection, info: IndexInfo, ids: Sequence[int]) -> dict[int, np.ndarray]:
    """The stored vectors of those of `ids` that have one, as float32 arrays; through the chunk tables when their
    layout is known: each vector's own bytes cut out of its chunk, all in one row (both aggregates read the same
    rows in one order; the bytes pass as they are, the file being UTF-8), as every row and every blob call hands
    the GIL over, a wait with recalls on other threads; else one lookup each."""
    if not has_chunk_tables(conn):  # pragma: no cover - a future sqlite-vec with other shadow tables
        found = {memory_id: read_vector(conn, info, memory_id) for memory_id in ids}
        return {memory_id: vector for memory_id, vector in found.items() if vector is not None}
    wanted, size = list(dict.fromkeys(int(memory_id) for memory_id in ids)), info.dim * 4
    out: dict[int, np.ndarray] = {}
    for start in range(0, len(wanted), READ_BATCH):
        batch = wanted[start:start + READ_BATCH]
        (found_ids, packed), = conn.execute(
            "SELECT group_concat(r.rowid, ' '), CAST(group_concat(substr(v.vectors, r.chunk_offset * ? + 1, ?), '') "
            "AS BLOB) FROM vec_memories_rowids r JOIN vec_memories_vector_chunks00 v ON v.rowid = +r.chunk_id "
            f"WHERE r.rowid IN ({','.join('?' * len(batch))})", (size, size, *batch)).fetchall()
        rows = np.frombuffer(packed or b"", dtype=np.float32).reshape(-1, info.dim)
        out.update(zip(map(int, (found_ids or "").split()), rows, strict=True))
    return out


class SQLiteVectorSource:
    """The cache's reads on SQLite: vec0's chunk tables, and the log by `seq` (one writer at a
    time, so seq order is commit order and a rollback reuses its numbers)."""

    def poll(self, conn: Connection, mark: int | None) -> tuple[str | None, list[int], int, bool, None]:
        """The cache's poll: vec_epoch, the ids changed since `mark` (in seq order), the new mark, and
        whether the log still holds every change since `mark`. The changes themselves are not read here."""
        epoch = get_meta(conn, "vec_epoch")
        if mark is None:
            return epoch, [], int(query_value(conn, "SELECT coalesce(max(seq), 0) FROM vector_changes")), True, None
        rows: list[tuple[int, int]] = [(int(seq), int(mid)) for seq, mid in conn.execute(
            "SELECT seq, memory_id FROM vector_changes WHERE seq > ? ORDER BY seq", (mark,))]
        if not rows:
            return epoch, [], mark, True, None
        return epoch, [memory_id for _, memory_id in rows], rows[-1][0], rows[0][0] == mark + 1, None

    def changed_between(self, conn: Connection, older: int, newer: int) -> set[int]:
        """Ids changed after `older` and up to `newer`."""
        return {int(mid) for (mid,) in conn.execute(
            "SELECT memory_id FROM vector_changes WHERE seq > ? AND seq <= ?", (older, newer))}

    # module functions looked up at call time (tests replace them)
    def key_size_at_least(self, conn: Connection, key: str, cap: int) -> int:
        """How many vectors `key` holds, counted up to `cap` (+1) only."""
        return key_size_at_least(conn, key, cap)

    def load_key(self, conn: Connection, info: IndexInfo, key: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """All vectors of one key: (ids, created_at, matrix)."""
        return load_key(conn, info, key)

    def read_vectors(self, conn: Connection, info: IndexInfo, ids: Sequence[int]) -> dict[int, np.ndarray]:
        """The stored vectors of those of `ids` that have one."""
        return read_vectors(conn, info, ids)

    def search(self, conn: Connection, info: IndexInfo, query: list[float], keys: list[str], k: int,
               as_of: float | None) -> list[tuple[int, float]]:
        """The exact search inside sqlite-vec (knn_vec0): [(id, L2 distance)], nearest first."""
        return knn_vec0(conn, info, query, keys, k, as_of)

    def similar_to_memory(self, conn: Connection, info: IndexInfo, memory_id: int, keys: list[str],
                          k: int) -> list[tuple[int, float]]:
        """Nearest neighbours of a stored memory's own vector, itself excluded."""
        return similar_to_memory(conn, info, memory_id, keys, k)
