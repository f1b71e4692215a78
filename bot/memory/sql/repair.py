"""Stored values that make no sense, found and fixed (`muninn doctor`, `muninn doctor --fix`).

Reading never crashes on them (records.iso clamps and marks them), but they still do harm:
a created_at before 2000 or in the future sorts and decays wrongly, and a last_accessed in
the future (a touch at a far-future `as_of`, or an old import) pins a memory so that it
never fades. Validation keeps new ones out; this finds those already in a file.

One rule table for both backends: each rule has its SQLite condition and fix, and its
PostgreSQL ones (typed columns, so no "not a number" but NaN and ±Infinity; NaN sorts above
every number there; the history of source ids is kept a JSON list by a trigger).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from bot.memory import decay
from bot.memory.connection import Connection
from bot.memory.sql.transactions import write_transaction
from bot.memory.sqlite import vec0 as vectors
from bot.memory.storage import storage_of
from bot.validate import EARLIEST, FUTURE_SLACK_S


@dataclass(frozen=True)
class Rule:
    """One kind of bad stored value that `muninn doctor` reports (and `--fix`
    clamps): what is wrong, and the condition and fix in each dialect."""
    what: str
    where: str      # SQLite: SQL condition on memories, with :now, :earliest and :latest
    fix: str        # SQLite: SQL SET clause, with the same parameters
    pg_where: str   # PostgreSQL: the same condition
    pg_fix: str     # PostgreSQL: the same fix

    def condition(self, postgres: bool) -> str:
        """The SQL condition for the connection's dialect."""
        return self.pg_where if postgres else self.where

    def change(self, postgres: bool) -> str:
        """The SQL SET clause for the connection's dialect."""
        return self.pg_fix if postgres else self.fix


MAX_STABILITY = decay.MAX_STABILITY_DAYS


RULES = (
    Rule("created_at before 2000, in the future or not a number",
         "typeof(created_at) NOT IN ('integer', 'real') OR created_at < :earliest OR created_at > :latest",
         "created_at = CASE WHEN typeof(created_at) IN ('integer', 'real') AND created_at > :latest THEN :now "
         "ELSE max(:earliest, min(coalesce(updated_at, :now), :now)) END",
         "created_at < :earliest OR created_at > :latest",
         "created_at = CASE WHEN created_at > :latest AND created_at != 'NaN' THEN :now "
         "ELSE greatest(:earliest, least(coalesce(updated_at, :now), :now)) END"),
    Rule("updated_at not a number or in the future",
         "typeof(updated_at) NOT IN ('integer', 'real') OR updated_at > :latest",
         "updated_at = :now",
         "updated_at > :latest",
         "updated_at = :now"),
    Rule("last_accessed in the future (pins the memory so it never fades) or not a number",
         "last_accessed IS NOT NULL AND (typeof(last_accessed) NOT IN ('integer', 'real') "
         "OR last_accessed > :latest OR last_accessed < 0)",
         "last_accessed = CASE WHEN typeof(last_accessed) IN ('integer', 'real') AND last_accessed > :latest "
         "THEN :now ELSE NULL END",
         "last_accessed > :latest OR last_accessed < 0",
         "last_accessed = CASE WHEN last_accessed > :latest AND last_accessed != 'NaN' THEN :now ELSE NULL END"),
    Rule("stability not a positive number of days",
         f"typeof(stability) NOT IN ('integer', 'real') OR stability <= 0 OR stability > {MAX_STABILITY}",
         f"stability = CASE WHEN typeof(stability) IN ('integer', 'real') AND stability > "
         f"{MAX_STABILITY} THEN {MAX_STABILITY} ELSE 1.0 END",
         f"stability <= 0 OR stability > {MAX_STABILITY}",
         f"stability = CASE WHEN stability > {MAX_STABILITY} AND stability != 'NaN' THEN {MAX_STABILITY} ELSE 1.0 END"),
    Rule("source_message_ids not a JSON list",
         "json_valid(source_message_ids) = 0 OR json_type(source_message_ids) != 'array'",
         "source_message_ids = '[]'",
         "source_message_ids IS NOT JSON ARRAY",
         "source_message_ids = '[]'"),
)


def _params(now: float) -> dict[str, float]:
    return {"now": now, "earliest": EARLIEST, "latest": now + FUTURE_SLACK_S}


BAD_UTF8 = "text that is not valid UTF-8 (shown with U+FFFD)"


def invalid_utf8_ids(conn: Connection) -> list[int]:
    """Memories whose text is not valid UTF-8 (SQLite does not check; another program may write it)."""
    ids = []
    for memory_id, raw in conn.execute("SELECT id, CAST(text AS BLOB) FROM memories ORDER BY id"):
        try:
            if isinstance(raw, bytes):
                raw.decode("utf-8")
        except UnicodeDecodeError:
            ids.append(memory_id)
    return ids


def _on_postgres(conn: Connection) -> bool:
    return storage_of(conn).name == "postgresql"


def find_bad_rows(conn: Connection, now: float | None = None) -> dict[str, list[int]]:
    """{what is wrong: [memory ids]} (only the rules with findings)."""
    params = _params(time.time() if now is None else now)
    postgres = _on_postgres(conn)
    found = {}
    for rule in RULES:
        ids = [row[0] for row in conn.execute(
            f"SELECT id FROM memories WHERE {rule.condition(postgres)} ORDER BY id", params)]
        if ids:
            found[rule.what] = ids
    broken = [] if postgres else invalid_utf8_ids(conn)  # PostgreSQL refuses text that is not UTF-8
    if broken:
        found[BAD_UTF8] = broken
    return found


def fix_bad_rows(conn: Connection, now: float | None = None) -> int:
    """Clamp every value `find_bad_rows` reports, in one transaction; returns the values changed."""
    params = _params(time.time() if now is None else now)
    postgres = _on_postgres(conn)
    changed = 0
    with write_transaction(conn):
        moved = [row[0] for row in conn.execute(f"SELECT id FROM memories WHERE {RULES[0].condition(postgres)}", params)]
        for rule in RULES:
            conn.execute(f"UPDATE memories SET {rule.change(postgres)} WHERE {rule.condition(postgres)}", params)
            changed += conn.changes()
        if postgres:  # the vector keeps its own created_at (for --as-of): keep it in step
            if moved:
                conn.execute("UPDATE memory_vectors v SET created_at = m.created_at FROM memories m "
                             "WHERE v.memory_id = m.id AND m.id = ANY(?)", (moved,))
            return changed
        for broken in invalid_utf8_ids(conn):  # the update trigger re-indexes it in FTS (old row out by its old bytes)
            raw = conn.execute("SELECT CAST(text AS BLOB) FROM memories WHERE id = ?", (broken,)).fetchall()[0][0]
            if isinstance(raw, bytes):
                conn.execute("UPDATE memories SET text = ? WHERE id = ?", (raw.decode("utf-8", "replace"), broken))
                changed += 1
        if moved and vectors.table_exists(conn):  # vec0 keeps its own created_at (for --as-of): keep it in step
            rows = conn.execute(
                f"SELECT id, created_at FROM memories WHERE embedded = 1 AND id IN ({','.join('?' * len(moved))})",
                moved).fetchall()
            for row in rows:
                conn.execute("UPDATE vec_memories SET created_at = ? WHERE memory_id = ?", (row[1], row[0]))
    return changed
