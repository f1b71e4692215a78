"""What the vector cache reads from SQLite for a key it holds partially (vectors/partial.py):
the key's sign codes, packed chunk by chunk, and a few vectors read back under their key."""
from __future__ import annotations

from typing import Sequence, cast

import apsw
import numpy as np

from bot.memory.connection import Connection
from bot.memory.scope import ACTIVE
from bot.memory.sqlite import vec0
from bot.memory.vectors import codes as vector_codes
from bot.memory.vectors.index import IndexInfo

PACK_ROWS = 4096  # vectors gathered before packing their codes (a chunk holds a handful)


def key_codes(conn: Connection, info: IndexInfo, key: str) -> tuple[np.ndarray, np.ndarray]:
    """(ids, (words, n) sign codes) of one key's active vectors, read chunk by chunk: the key's
    float32 vectors are never all in memory at once (for a key too big for the cache, a gigabyte)."""
    # Two statements, no transaction, as vec0.load_key: what changes between them is put right by
    # the next sync (its change is newer than the cache's mark).
    active = np.fromiter((row[0] for row in conn.execute(
        f"SELECT id FROM memories WHERE vis_key = ? AND embedded = 1 AND {ACTIVE}", (key,))), dtype=np.int64)
    active.sort()
    ids = np.empty(len(active), dtype=np.int64)
    codes = vector_codes.empty(info.dim, len(active))
    block = np.empty((PACK_ROWS, info.dim), dtype=np.float32)
    filled = pending = 0

    def flush() -> None:
        codes[:, filled - pending:filled] = vector_codes.pack(block[:pending])

    for chunk_ids, valid, vectors in vec0.key_chunks(conn, info, key):
        at = np.minimum(np.searchsorted(active, chunk_ids), max(0, len(active) - 1))
        keep = valid & (active[at] == chunk_ids) if len(active) else valid & False
        for row in np.flatnonzero(keep).tolist():
            if filled == len(ids):  # more vectors than active memories: stored since the count, next sync's
                break
            ids[filled] = chunk_ids[row]
            block[pending] = vectors[row]
            filled += 1
            pending += 1
            if pending == PACK_ROWS:
                flush()
                pending = 0
    if pending:
        flush()
    return ids[:filled], codes[:, :filled]


def read_key_vectors(conn: Connection, info: IndexInfo, key: str, ids: Sequence[int]) -> dict[int, np.ndarray]:
    """The stored vectors of those of `ids` that vec0 holds under `key` now: one forgotten, archived
    or moved since the cache last looked has none there, whatever the cache still holds."""
    if not ids or not vec0.has_chunk_tables(conn):
        return {}
    places: list[tuple[int, int, int]] = []
    wanted = list(dict.fromkeys(int(memory_id) for memory_id in ids))
    for start in range(0, len(wanted), vec0.READ_BATCH):
        batch = wanted[start:start + vec0.READ_BATCH]
        places += conn.execute(
            "SELECT r.chunk_id, r.chunk_offset, r.rowid FROM vec_memories_rowids r "
            "JOIN vec_memories_chunks c ON c.chunk_id = r.chunk_id "
            f"WHERE r.rowid IN ({','.join('?' * len(batch))}) AND c.partition00 = ?", (*batch, key)).fetchall()
    return read_at(conn, info, places)


def read_at(conn: Connection, info: IndexInfo, places: list[tuple[int, int, int]]) -> dict[int, np.ndarray]:
    """The vectors at (chunk id, offset in it, memory id) `places`, each read alone from its chunk's blob."""
    size = info.dim * 4
    buffer = bytearray(len(places) * size)  # every vector read into one buffer: one allocation
    rows = np.frombuffer(buffer, dtype=np.float32).reshape(len(places), info.dim)
    out: dict[int, np.ndarray] = {}
    sqlite = cast(apsw.Connection, conn)
    blob = None
    try:
        # A chunk's slots are never reused (a replaced vector gets a new one): a write committed
        # since the statement that found them can at most leave a stale vector here for a memory it removed
        # or replaced, as a search made just before that write would have seen it.
        for row, (chunk_id, offset, memory_id) in enumerate(sorted(places)):
            try:
                if blob is None:
                    blob = sqlite.blob_open("main", "vec_memories_vector_chunks00", "vectors", chunk_id, False)
                else:
                    blob.reopen(chunk_id)
            except apsw.Error:  # the chunk is gone (the index was re-created since): no vector there
                if blob is not None:
                    blob.close()
                blob = None
                continue
            blob.seek(offset * size)
            blob.read_into(buffer, row * size, size)
            out[int(memory_id)] = rows[row]
    finally:
        if blob is not None:
            blob.close()
    return out


class SQLitePartialSource(vec0.SQLiteVectorSource):
    """SQLite's source for a cache that may hold keys partially."""

    def key_codes(self, conn: Connection, info: IndexInfo, key: str) -> tuple[np.ndarray, np.ndarray]:
        """(ids, codes) of one key's active vectors."""
        return key_codes(conn, info, key)

    def read_key_vectors(self, conn: Connection, info: IndexInfo, key: str,
                         ids: Sequence[int]) -> dict[int, np.ndarray]:
        """The stored vectors of those of `ids` still under `key`."""
        return read_key_vectors(conn, info, key, ids)
