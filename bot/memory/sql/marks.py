"""Work left for maintenance in the `meta` table: words deleted without a scrub, history rows
edited or deleted. A mark is a token; clearing an older token leaves a newer mark standing."""
from __future__ import annotations

import uuid
from typing import Sequence

from bot.memory.connection import Connection

SCRUB_PENDING = "scrub.pending"  # meta key: words deleted without a scrub wait for the next maintenance
# meta key: only the history's words wait (an edited or deleted message that taught nothing): a
# backend that rewrites tables (PostgreSQL) rewrites `messages` alone, not every big table.
MESSAGES_PENDING = "scrub.messages_pending"


def mark_pending(conn: Connection, key: str = SCRUB_PENDING) -> None:
    """Leave work for maintenance: a forget that did not scrub (one `/memory forget`, a deleted
    Discord message: a scrub rewrites indexes, too slow for every click) leaves the words for
    `finish_scrub`. Call it inside the transaction that deleted them, so both or neither land.
    Each mark is a new token: `clear_pending` of an older one leaves it standing."""
    conn.execute("INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                 (key, uuid.uuid4().hex))


def pending_token(conn: Connection, key: str = SCRUB_PENDING) -> str | None:
    """The token of the mark standing under `key`, or None."""
    rows = conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchall()
    return str(rows[0][0]) if rows else None


def clear_pending(conn: Connection, token: str, key: str = SCRUB_PENDING) -> None:
    """After the work succeeded: a mark made meanwhile (another token) stays for the next run."""
    conn.execute("DELETE FROM meta WHERE key = ? AND value = ?", (key, token))


def pending_marks(conn: Connection, keys: Sequence[str]) -> dict[str, str]:
    """The marks standing now, key -> token (for clear_marks once their work is done)."""
    return {key: token for key in keys if (token := pending_token(conn, key)) is not None}


def clear_marks(conn: Connection, marks: dict[str, str]) -> None:
    """Clear each of these marks (from pending_marks), leaving any made since."""
    for key, token in marks.items():
        clear_pending(conn, token, key)


