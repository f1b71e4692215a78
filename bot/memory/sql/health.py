"""What `muninn doctor` reads the same way on both backends."""
from __future__ import annotations

from bot.memory.connection import Connection
from bot.memory.scope import ACTIVE
from bot.memory.sql.queries import query_value


def unembedded_count(conn: Connection) -> int:
    """Active memories that have no vector yet (the backfill of `muninn maintain` embeds them)."""
    return int(query_value(conn, "SELECT count(*) FROM memories WHERE embedded = 0 AND " + ACTIVE, default=0))


def ping(conn: Connection) -> None:
    """The cheapest statement: whether the database answers at all (/healthz)."""
    query_value(conn, "SELECT 1")
