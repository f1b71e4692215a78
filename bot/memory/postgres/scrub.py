"""Forgotten text out of PostgreSQL's files (privacy: /memory forget, forget-all, "don't
remember this").

A DELETE leaves the row in its page as a dead tuple; VACUUM makes the space reusable but does
not zero it: the page is compacted around the hole and the bytes stay readable in the
relation file, as do the words' lexemes in the GIN index over `text_search` (and long text
in the TOAST table). Measured in tests/test_postgres_scrub.py: after DELETE + VACUUM +
CHECKPOINT the text is still in the file. Only a rewrite leaves it out: VACUUM FULL copies
the live rows into new files (table, TOAST and every index) and drops the old ones.

A rewrite costs time in proportion to the table, under an exclusive lock, so only the tables
a forget touched are rewritten: the memories (with their vectors, which say what the text
meant) for a forgotten memory, the history for a forgotten message.
What stays out of reach, as on any PostgreSQL: the WAL until it is recycled, WAL archives,
backups and replicas; the operator's retention rules apply to those.
"""
from __future__ import annotations

from typing import Sequence

from bot.memory.postgres.connection import PgConnection

# what was forgotten -> the tables to rewrite
REWRITES = {"memories": ("memories", "memory_vectors"), "messages": ("messages",)}


def scrub(conn: PgConnection, forgotten: Sequence[str]) -> None:
    """Rewrite the tables that held what was forgotten (outside any transaction)."""
    tables = dict.fromkeys(table for what in forgotten for table in REWRITES[what])
    for table in tables:
        conn.pg.execute(f"VACUUM FULL {table}".encode())  # our own constant names
