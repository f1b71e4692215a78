"""How many memories have left the database (deleted or archived), counted in the meta table
across processes, so that each process knows when its cached word counts are stale.

The keyword path caches how many memories hold a word (fts.py, postgres/keywords.py:
`forget_counts`, `slack_left`). A process forgets them when it removes memories itself; but
when another process does (a second bot process on one PostgreSQL, `muninn maintain` beside
the bot on one SQLite file), this one kept counting the removed memories for up to
keywords.COUNT_TTL_S: a word whose only memories went would still look common, or rare but present.
So every removal adds its number to the meta row `removed_memories`, and the keyword plan
reads it: a value other than the one last seen forgets that many memories' counts
(`forget_counts(conn, delta)`: the common words' counts stay within FORGET_SLACK).

PostgreSQL adds after the commit of the outermost transaction holding the removal
(`PgConnection.after_commit`; nothing on a rollback), in a statement of its own: inside it
every removal in every process would wait for the one meta row until the others commit. A
process that reads the new value therefore sees the removal, and counts made before it are
forgotten. The keyword step reads the row in its own statement (with the index state: no
round trip of its own), so its counts are checked when the step's result arrives, for the
next recall. SQLite (one writer) adds inside the removal's transaction and the keyword plan
reads it at its start, before any count.
"""
from __future__ import annotations

import threading
from typing import Any, Callable

KEY = "removed_memories"

_lock = threading.Lock()
_seen: dict[str, int] = {}  # per database: the value last read

# SQLite and PostgreSQL alike (`?` placeholders: PgConnection translates them).
_ADD = ("INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE "
        "SET value = CAST(CAST(meta.value AS BIGINT) + CAST(excluded.value AS BIGINT) AS TEXT) RETURNING value")


def add(conn: Any, removed: int) -> int | None:
    """Count `removed` more memories gone (nothing when 0); the new value."""
    if removed <= 0:
        return None
    rows = conn.execute(_ADD, (KEY, str(int(removed)))).fetchall()
    return int(rows[0][0]) if rows else None


def read(conn: Any) -> int | None:
    """The counter's value now (None: no memory removed yet)."""
    rows = conn.execute("SELECT value FROM meta WHERE key = ?", (KEY,)).fetchall()
    return int(rows[0][0]) if rows else None


def observe(database: str, value: Any, forget: Callable[[int | None], None]) -> None:
    """The counter of `database` read as `value` (None or missing: nothing removed yet): when it
    moved since the last read, `forget(how many left)`; at the first read, `forget(None)` (counts
    may have been made before it, and a removal may have landed between)."""
    current = int(value) if value is not None else 0
    with _lock:
        last = _seen.get(database)
        if last == current:
            return
        _seen[database] = current
    forget(None if last is None or current < last else current - last)


def seen_own(database: str, added: int | None, removed: int) -> None:
    """This process added `removed` and the counter became `added`: when it had seen the value
    just before, move on to the new one (its own forget_counts has run already), so the next
    read does not forget the same memories' counts a second time."""
    if added is None:
        return
    with _lock:
        if _seen.get(database) == added - removed:
            _seen[database] = added
