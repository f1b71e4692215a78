"""Forgotten text out of PostgreSQL's files (privacy: /memory forget-all, forgetting in plain
words, "don't remember this", `muninn chat`'s forget).

A DELETE leaves the row in its page as a dead tuple; VACUUM makes the space reusable but does
not zero it: the page is compacted around the hole and the bytes stay readable in the
relation file, as do the words' lexemes in the GIN index over `text_search` (GIN keeps its
keys) and long text in the TOAST table. tests/test_postgres_scrub.py reads the files back:
after DELETE + VACUUM + CHECKPOINT the text was still there. Only a rewrite leaves it out:
VACUUM FULL copies the live rows into new files (table, TOAST and every index) and drops the
old ones. It holds an exclusive lock on the table while it runs, in proportion to its size.

So a forget rewrites only what held the words, at once: `memories` (text, its tsvector and
GIN index: 46 ms at 2,000 memories, 101 ms at 8,000) or `messages`. The vectors (derived
from the text, not the text) are rewritten by the next maintenance run instead (`finish`):
that rewrite rebuilds the HNSW index (2.0 s at 2,000 memories, 6.9 s at 8,000, growing with
the table), too slow to hold every forget and every recall behind. Until then the forgotten
memory's vector is deleted and never searched, but its bytes may stay in the table's free
space (pgvector's VACUUM zeroes them in the HNSW index itself; the test checks both).
What stays out of reach, as on any PostgreSQL: the WAL until it is recycled, WAL archives,
backups and replicas; the operator's retention rules apply to those.
"""
from __future__ import annotations

import logging
from typing import Sequence

import psycopg

from bot.memory.postgres.connection import PgConnection
from bot.memory.storage import clear_pending, mark_pending, pending_token

log = logging.getLogger(__name__)

# what was forgotten -> the tables rewritten at once
REWRITES = {"memories": ("memories",), "messages": ("messages",)}
VECTORS_PENDING = "scrub.vectors_pending"  # meta key: forgotten vectors await the next maintenance
# VACUUM FULL waits for an exclusive lock, and every reader then queues behind it: a forget
# must not stall all recalls behind one long transaction. Past this wait the rewrite is left
# to the next maintenance run (storage.mark_pending).
LOCK_WAIT = "2s"


def scrub(conn: PgConnection, forgotten: Sequence[str]) -> None:
    """Rewrite the tables that held what was forgotten (outside any transaction)."""
    if not _rewrite(conn, [table for what in forgotten for table in REWRITES[what]]):
        mark_pending(conn)  # locked out: the next maintenance run rewrites them
    if "memories" in forgotten:
        conn.pg.execute("VACUUM memory_vectors")  # the space is reusable now; the bytes go in `finish`
        mark_pending(conn, VECTORS_PENDING)


def finish(conn: PgConnection) -> bool:
    """At maintenance: rewrite what forgets left (storage.mark_pending: plain forgets, deleted
    messages, rewrites that were locked out: the words' tables and the vectors), and the vectors
    after any forget since the last time. A mark is cleared only after its rewrite; True if
    there was anything."""
    words, vectors = pending_token(conn), pending_token(conn, VECTORS_PENDING)
    tables = (["memories", "messages"] if words else []) + (["memory_vectors"] if words or vectors else [])
    if not tables or not _rewrite(conn, tables):
        return False
    if words:
        clear_pending(conn, words)
    if vectors:
        clear_pending(conn, vectors, VECTORS_PENDING)
    return True


def _rewrite(conn: PgConnection, tables: Sequence[str]) -> bool:
    """VACUUM FULL each table (our own constant names); False if one could not get its lock in time."""
    conn.pg.execute(f"SET lock_timeout = '{LOCK_WAIT}'".encode())
    try:
        for table in dict.fromkeys(tables):
            conn.pg.execute(f"VACUUM FULL {table}".encode())
        return True
    except psycopg.errors.LockNotAvailable:
        log.warning("scrub of %s waited over %s for its lock; the next maintenance run does it", ", ".join(tables),
                    LOCK_WAIT)
        return False
    finally:
        conn.pg.execute(b"RESET lock_timeout")
