"""Small helpers for one-row reads and the `meta` table, on either backend's connection."""
from __future__ import annotations

from typing import Any

from bot.memory.connection import Connection


def query_one(conn: Connection, sql: str, params: Any = ()) -> Any:
    """The first row of `sql`, or None."""
    for row in conn.execute(sql, params):
        return row
    return None


def query_value(conn: Connection, sql: str, params: Any = (), default: Any = None) -> Any:
    """The first column of the first row of `sql`, or `default`."""
    row = query_one(conn, sql, params)
    return default if row is None else row[0]


def get_meta(conn: Connection, key: str, default: str | None = None) -> str | None:
    """A value of the `meta` table (schema marks, watermarks, leases), or `default`."""
    return query_value(conn, "SELECT value FROM meta WHERE key = ?", (key,), default)


def set_meta(conn: Connection, key: str, value: str) -> None:
    """Set a value of the `meta` table (inside the caller's transaction)."""
    conn.execute("INSERT INTO meta(key, value) VALUES(?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                 (key, value))
