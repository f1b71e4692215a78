"""Forgotten text out of PostgreSQL's files (privacy: /memory forget-all, forgetting in plain
words, "don't remember this", `muninn chat`'s forget).

A DELETE leaves the row in its page as a dead tuple; VACUUM makes the space reusable but does
not zero it: the page is compacted around the hole and the bytes stay readable in the
relation file, as do the words' lexemes in the GIN index over `text_search` (GIN keeps its
keys) and long text in the TOAST table. tests/memory/postgres/test_scrub.py reads the files back:
after DELETE + VACUUM + CHECKPOINT the text was still there. Only a rewrite leaves it out:
VACUUM FULL copies the live rows into new files (table, TOAST and every index) and drops the
old ones. It holds an exclusive lock on the table while it runs, in proportion to its size.

So a forget rewrites only what held the words, at once while that is quick: `memories`
(text, its tsvector and GIN index: quick while the table is small, seconds once it is
big) or `messages`. A table past REWRITE_AT_ONCE_BYTES is
left to the next maintenance run (`finish`), as a single forget's words are: its rewrite
would hold every recall behind its lock for seconds. The vectors (derived from the text, not
the text) are always rewritten by the next maintenance run (a 768-dimensional vector is 3 kB:
the largest table). Until then the forgotten rows are deleted and never searched or shown,
but their bytes may stay in the tables' free space.
Each rewrite also samples the table's statistics afresh (ANALYZE): the pg_statistic catalog
keeps sample values of each column (whole message texts among them) for the planner, and
autovacuum gathers them as the tables change.
What stays out of reach, as on any PostgreSQL: the WAL until it is recycled, WAL archives,
backups and replicas, and the catalog's replaced statistics rows until PostgreSQL reuses their
space; the operator's retention rules apply to those.
"""
from __future__ import annotations

import logging
from typing import Sequence

import psycopg
from psycopg import sql

from bot.memory.postgres.connection import PgConnection
from bot.memory.sql.marks import MESSAGES_PENDING, SCRUB_PENDING, clear_marks, mark_pending, pending_marks

log = logging.getLogger(__name__)

SCRUBBABLE = ("memories", "messages")  # what a forget names: the tables rewritten (our own names)
VECTORS_PENDING = "scrub.vectors_pending"  # meta key: forgotten vectors await the next maintenance
# VACUUM FULL waits for an exclusive lock, and every reader then queues behind it: a forget
# must not stall all recalls behind one long transaction. Past this wait the rewrite is left
# to the next maintenance run (marks.mark_pending).
LOCK_WAIT = "2s"
# A rewrite at once holds the table's exclusive lock only briefly at this size (the time grows
# with the table and its indexes); bigger tables wait for maintenance.
REWRITE_AT_ONCE_BYTES = 2 << 20


def scrub(conn: PgConnection, forgotten: Sequence[str]) -> None:
    """Rewrite the tables that held what was forgotten (outside any transaction) when they are
    small; the others (and any locked out) are left to the next maintenance run."""
    tables = [table for table in SCRUBBABLE if table in forgotten]
    small = [table for table in tables if _size(conn, table) <= REWRITE_AT_ONCE_BYTES]
    # The small ones at once even beside a big one: a forget-all's `messages` (the person's own
    # words) must not wait for maintenance because `memories` is big.
    rewrote = _rewrite(conn, small) if small else True
    if len(small) < len(tables) or not rewrote:  # too big to rewrite now, or locked out: maintenance does
        mark_pending(conn, MESSAGES_PENDING if tables == ["messages"] else SCRUB_PENDING)  # only what held them
    if "memories" in forgotten:  # the vectors' bytes go in `finish` (a plain VACUUM here removed none and
        mark_pending(conn, VECTORS_PENDING)  # held the writer long on a big table)


def finish(conn: PgConnection) -> bool:
    """At maintenance: rewrite what forgets left (marks.mark_pending: plain forgets and
    rewrites that were locked out: the words' tables and the vectors; MESSAGES_PENDING: edited
    and deleted messages, the history alone), and the vectors after any forget since the last
    time. A mark is cleared only after its rewrite; True if there was anything."""
    marks = pending_marks(conn, (SCRUB_PENDING, MESSAGES_PENDING, VECTORS_PENDING))
    words, history, vectors = (key in marks for key in (SCRUB_PENDING, MESSAGES_PENDING, VECTORS_PENDING))
    # An edited or deleted message that taught nothing left its words in `messages` only: the
    # big tables (memories: seconds on a big one, under a lock every recall waits behind) stay.
    tables = (["memories", "messages"] if words else ["messages"] if history else []) \
        + (["memory_vectors"] if words or vectors else [])
    if not tables or not _rewrite(conn, tables):
        return False
    clear_marks(conn, marks)  # only after the rewrite: a mark made meanwhile stays
    return True


def _size(conn: PgConnection, table: str) -> int:
    """Bytes of the table with its TOAST table and indexes (what VACUUM FULL rewrites)."""
    row = conn.pg.execute("SELECT pg_total_relation_size(%s::regclass)", (table,)).fetchone()
    return int(row[0]) if row else 0


def _statistics_of_empty(conn: PgConnection, table: str) -> None:
    """ANALYZE leaves the statistics of a table it finds empty as they were (the last person's
    forget-all): its columns' are cleared where the server can (PostgreSQL 18 and later), its
    statistics objects' (the keyword path's word statistics) made again, empty."""
    found = conn.pg.execute(f"SELECT EXISTS (SELECT 1 FROM {table})".encode()).fetchone()
    if found is None or found[0]:
        return
    clear = conn.pg.execute("SELECT to_regprocedure('pg_clear_attribute_stats(text, text, text, boolean)') "
                            "IS NOT NULL").fetchone()
    if clear is not None and clear[0]:
        conn.pg.execute("SELECT pg_clear_attribute_stats(current_schema()::text, %s, attname::text, false) "
                        "FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped",
                        (table, table))
    for name, definition, target in conn.pg.execute(
            "SELECT stxname, pg_get_statisticsobjdef(oid), stxstattarget FROM pg_statistic_ext "
            "WHERE stxrelid = %s::regclass", (table,)).fetchall():
        with conn.pg.transaction():  # never without it: the keyword path's estimates read it
            conn.pg.execute(sql.SQL("DROP STATISTICS {}").format(sql.Identifier(name)))
            conn.pg.execute(str(definition).encode())
            if target is not None and int(target) >= 0:
                conn.pg.execute(sql.SQL("ALTER STATISTICS {} SET STATISTICS {}").format(
                    sql.Identifier(name), sql.Literal(int(target))))


def _rewrite(conn: PgConnection, tables: Sequence[str]) -> bool:
    """VACUUM FULL each table (our own constant names); False if one could not get its lock in time."""
    conn.pg.execute(f"SET lock_timeout = '{LOCK_WAIT}'".encode())
    try:
        for table in dict.fromkeys(tables):
            # ANALYZE too: the planner's statistics keep sample values of the table's columns
            # (whole message texts, a memory's words) in the pg_statistic catalog, which a rewrite
            # leaves as they were; these are now sampled from what is left.
            conn.pg.execute(f"VACUUM (FULL, ANALYZE) {table}".encode())
            _statistics_of_empty(conn, table)
        return True
    except psycopg.errors.LockNotAvailable:
        log.warning("scrub of %s waited over %s for its lock; the next maintenance run does it", ", ".join(tables),
                    LOCK_WAIT)
        return False
    finally:
        conn.pg.execute(b"RESET lock_timeout")
