"""The vector index: a sqlite-vec vec0 table holding the embeddings of active memories.

Layout, chosen so that the scope filter runs *inside* the KNN (a user with few
memories still gets their k nearest, and nobody else's):
  bucket     partition key = crc32(vis_key) % buckets: a scoped search reads only the
             few partitions holding the viewer's keys, not the whole table, while a
             fixed number of partitions keeps the preallocated chunks small;
  vis_key    metadata column filtered with `IN` (vec0 applies `=`/`IN` inside the KNN;
             an OR across different columns would silently return wrong rows);
  created_at metadata column for `--as-of` queries.
Vectors are L2-normalised before storage, so L2 distance orders like cosine and
cosine = 1 - d^2 / 2. The table is created when the first embedding reveals the model's
dimension; the model and dimension are recorded in `meta`.
"""
from __future__ import annotations

import logging
import math
import struct
import zlib
from dataclasses import dataclass
from typing import Iterable, Sequence

import apsw

from bot.logs import Throttle
from bot.memory.db import get_meta, query_value, set_meta

log = logging.getLogger(__name__)
_warnings = Throttle()

DEFAULT_BUCKETS = 256  # chosen by bench/layouts.py (bench/README.md): fast at 100k, <= 1.5x raw disk at 10k
DEFAULT_CHUNK_SIZE = 32
MAX_DIM = 8192
REINDEX_PENDING = "reindex_pending"


class VectorSizeError(ValueError):
    """An embedding does not have the dimension of the index."""


@dataclass(frozen=True)
class IndexInfo:
    model: str
    dim: int
    buckets: int


def normalise(vector: Sequence[float]) -> list[float]:
    norm = math.hypot(*vector)  # no overflow for huge components, unlike sqrt(sum(x * x))
    if not math.isfinite(norm) or norm == 0.0:
        raise VectorSizeError("embedding is zero or not finite")
    return [x / norm for x in vector]


def pack(vector: Sequence[float]) -> bytes:
    return struct.pack(f"{len(vector)}f", *normalise(vector))


def cosine_from_distance(distance: float) -> float:
    return 1.0 - distance * distance / 2.0


def bucket_of(key: str, buckets: int) -> int:
    return zlib.crc32(key.encode()) % buckets


def index_info(conn: apsw.Connection) -> IndexInfo | None:
    model = get_meta(conn, "embed_model")
    if model is None or not table_exists(conn):
        return None
    return IndexInfo(model, int(get_meta(conn, "embed_dim") or 0), int(get_meta(conn, "vec_buckets") or 0))


def current_index(conn: apsw.Connection, model: str) -> IndexInfo | None:
    """The vector index if it was made with `model` (else None: a reindex is pending)."""
    info = index_info(conn)
    return info if info is not None and info.model == model else None


def index_for(conn: apsw.Connection, model: str, dim: int) -> IndexInfo | None:
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


def table_exists(conn: apsw.Connection) -> bool:
    return query_value(conn, "SELECT count(*) FROM sqlite_master WHERE name = 'vec_memories'") == 1


def create_index(conn: apsw.Connection, model: str, dim: int, *, buckets: int = DEFAULT_BUCKETS,
                 chunk_size: int = DEFAULT_CHUNK_SIZE) -> IndexInfo:
    """Create the vec0 table for this model's dimension (call inside a transaction)."""
    if not usable_dim(dim):
        raise VectorSizeError(f"embedding dimension {dim} is not usable")
    conn.execute(
        f"CREATE VIRTUAL TABLE vec_memories USING vec0("
        f"memory_id INTEGER PRIMARY KEY, bucket INTEGER PARTITION KEY, vis_key TEXT, created_at FLOAT, "
        f"embedding FLOAT[{dim}], chunk_size={chunk_size})")
    index_partitions(conn)
    set_meta(conn, "embed_model", model)
    set_meta(conn, "embed_dim", str(dim))
    set_meta(conn, "vec_buckets", str(buckets))
    return IndexInfo(model, dim, buckets)


def usable_dim(dim: int) -> bool:
    return 1 <= dim <= MAX_DIM


def mark_reindex_pending(conn: apsw.Connection) -> None:
    set_meta(conn, REINDEX_PENDING, "1")


def reindex_pending(conn: apsw.Connection) -> bool:
    return get_meta(conn, REINDEX_PENDING) is not None


def mark_reindex_done(conn: apsw.Connection) -> None:
    """Every active memory has its vector again (called when the backfill finds none missing)."""
    if reindex_pending(conn):
        conn.execute("DELETE FROM meta WHERE key = ?", (REINDEX_PENDING,))


def index_partitions(conn: apsw.Connection) -> None:
    """Index the partition column of vec0's chunk table. sqlite-vec 0.1.9 finds a partition's
    chunks by scanning that whole table, once per partition searched; with the index a
    scoped KNN at 100k memories took 2.9 ms instead of 5.0 (bench/README.md). The index
    lives and dies with the shadow table; skipped if a future sqlite-vec names it otherwise."""
    columns = {row[1] for row in conn.execute("PRAGMA table_info(vec_memories_chunks)")}
    if "partition00" in columns:
        conn.execute("CREATE INDEX IF NOT EXISTS vec_memories_chunks_partition ON vec_memories_chunks (partition00)")


def drop_index(conn: apsw.Connection) -> None:
    """Forget every vector (before a re-index with another model); call inside a transaction."""
    conn.execute("DROP TABLE IF EXISTS vec_memories")
    conn.execute("DELETE FROM meta WHERE key IN ('embed_model', 'embed_dim', 'vec_buckets')")
    conn.execute("UPDATE memories SET embedded = 0 WHERE embedded = 1")


def put(conn: apsw.Connection, info: IndexInfo, memory_id: int, vis_key: str, created_at: float,
        vector: Sequence[float]) -> None:
    """Store or replace one memory's vector (vec0 has no upsert: delete + insert)."""
    if len(vector) != info.dim:
        raise VectorSizeError(f"embedding has {len(vector)} dimensions, the index has {info.dim}")
    conn.execute("DELETE FROM vec_memories WHERE memory_id = ?", (memory_id,))
    conn.execute(
        "INSERT INTO vec_memories(memory_id, bucket, vis_key, created_at, embedding) VALUES (?, ?, ?, ?, ?)",
        (memory_id, bucket_of(vis_key, info.buckets), vis_key, float(created_at), pack(vector)))
    conn.execute("UPDATE memories SET embedded = 1 WHERE id = ?", (memory_id,))


def remove(conn: apsw.Connection, memory_ids: Iterable[int]) -> None:
    if not table_exists(conn):
        return
    for memory_id in memory_ids:
        conn.execute("DELETE FROM vec_memories WHERE memory_id = ?", (memory_id,))


def knn(conn: apsw.Connection, info: IndexInfo, query: Sequence[float], keys: list[str], k: int,
        as_of: float | None = None) -> list[tuple[int, float]]:
    """The k nearest vectors among those whose vis_key is in `keys`: [(memory_id, distance)]."""
    if len(query) != info.dim:
        raise VectorSizeError(f"query embedding has {len(query)} dimensions, the index has {info.dim}")
    buckets = sorted({bucket_of(key, info.buckets) for key in keys})
    sql = (
        "WITH knn AS MATERIALIZED ("
        " SELECT memory_id, distance FROM vec_memories"
        " WHERE embedding MATCH ? AND k = ?"
        f" AND bucket IN ({','.join('?' * len(buckets))})"
        f" AND vis_key IN ({','.join('?' * len(keys))})"
        + (" AND created_at <= ?" if as_of is not None else "") +
        ") SELECT memory_id, distance FROM knn ORDER BY distance LIMIT ?")
    params: list = [pack(query), k, *buckets, *keys]
    if as_of is not None:
        params.append(float(as_of))
    params.append(k)
    return [(row[0], row[1]) for row in conn.execute(sql, params)]


def similar_to_memory(conn: apsw.Connection, info: IndexInfo, memory_id: int, keys: list[str],
                      k: int) -> list[tuple[int, float]]:
    """Nearest neighbours of a stored memory's own vector, itself excluded."""
    blob = query_value(conn, "SELECT embedding FROM vec_memories WHERE memory_id = ?", (memory_id,))
    if blob is None:
        return []
    query = list(struct.unpack(f"{info.dim}f", blob))
    return [(mid, d) for mid, d in knn(conn, info, query, keys, k + 1) if mid != memory_id][:k]
