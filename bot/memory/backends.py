"""Choosing the storage backend: PostgreSQL when MUNINN_DATABASE_URL is set, else SQLite."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from bot.memory.storage import Storage
from bot.settings import Settings

OFF = ("off", "false", "no", "0")


def storage_for(settings: Settings, vector_cache: Any) -> Storage[Any]:
    """The backend MUNINN_DATABASE_URL selects (PostgreSQL), else SQLite at MUNINN_DB_PATH."""
    if vector_cache is not None:
        vector_cache.snapshot_place = snapshot_place(settings)
    if settings.database_url:
        from bot.memory.postgres.backend import PostgresStorage
        return PostgresStorage(settings.database_url, vector_cache)
    from bot.memory.sqlite.backend import SQLiteStorage
    return SQLiteStorage(settings.db_path, vector_cache)


def snapshot_place(settings: Settings) -> Callable[[str], Path] | None:
    """Where the vector snapshot of the database goes (MUNINN_VECTOR_SNAPSHOT), given the database's
    instance token: on SQLite beside the file (muninn.db.vectors/), on PostgreSQL in the data
    folder (MUNINN_DB_PATH's) under a folder named after the database; a folder given: in it, one
    sub-folder per database. None: off (and for an in-memory SQLite database)."""
    choice = settings.vector_snapshot.strip()
    if choice.lower() in OFF or (not settings.database_url and str(settings.db_path) == ":memory:"):
        return None
    kind = "pg" if settings.database_url else "sqlite"
    if choice.lower() in ("", "auto", "on"):
        if settings.database_url:
            data = settings.db_path.parent
            return lambda instance: data / f"vectors-{kind}-{instance}"
        beside = Path(f"{settings.db_path}.vectors")
        return lambda instance: beside
    root = Path(choice).expanduser().resolve()
    return lambda instance: root / f"{kind}-{instance}"
