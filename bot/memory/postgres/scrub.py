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

from typing import Sequence

from bot.memory.postgres.connection import PgConnection
from bot.memory.storage import take_scrub_pending

# what was forgotten -> the tables rewritten at once
REWRITES = {"memories": ("memories",), "messages": ("messages",)}
VECTORS_PENDING = "scrub.vectors_pending"  # meta key: forgotten vectors await the next maintenance


def scrub(conn: PgConnection, forgotten: Sequence[str]) -> None:
    """Rewrite the tables that held what was forgotten (outside any transaction)."""
    tables = dict.fromkeys(table for what in forgotten for table in REWRITES[what])
    for table in tables:
        conn.pg.execute(f"VACUUM FULL {table}".encode())  # our own constant names
    if "memories" in forgotten:
        conn.pg.execute("VACUUM memory_vectors")  # the space is reusable now; the bytes go in `finish`
        conn.pg.execute("INSERT INTO meta (key, value) VALUES (%s, '1') ON CONFLICT (key) DO NOTHING",
                        (VECTORS_PENDING,))


def finish(conn: PgConnection) -> bool:
    """Scrub what plain forgets left (storage.take_scrub_pending), then rewrite the vectors if
    a forget left some behind since the last time; True if there was anything."""
    left_words = take_scrub_pending(conn)
    if left_words:
        scrub(conn, ("memories",))
    # The mark goes first: a forget committed while the rewrite waits for its lock sets it again.
    if conn.pg.execute("DELETE FROM meta WHERE key = %s", (VECTORS_PENDING,)).rowcount == 0:
        return left_words
    conn.pg.execute("VACUUM FULL memory_vectors")
    return True
