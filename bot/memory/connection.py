"""The connection type the portable code of the memory layer runs its SQL on, whatever the backend.

SQLite's is an `apsw.Connection`; PostgreSQL's a `PgConnection` (postgres/connection.py) that runs
the same `?`-parameter SQL. Code that needs more than this (SQLite's savepoints, PostgreSQL's
row locks) lives in that backend's folder.
"""
from __future__ import annotations

from typing import Any, Protocol


class Connection(Protocol):
    """What both backends' connections offer the portable SQL (`bot/memory/sql/`)."""

    def execute(self, sql: str, params: Any = ..., /) -> Any:
        """Run one statement with `?` parameters; the result iterates over rows."""

    def changes(self) -> int:
        """Rows changed by the last statement."""

    def get_autocommit(self) -> bool:
        """True outside a transaction."""
