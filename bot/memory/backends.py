"""Choosing the storage backend: PostgreSQL when MUNINN_DATABASE_URL is set, else SQLite."""
from __future__ import annotations

from typing import Any

from bot.memory.storage import Storage
from bot.settings import Settings


def storage_for(settings: Settings, vector_cache: Any) -> Storage[Any]:
    """The backend MUNINN_DATABASE_URL selects (PostgreSQL), else SQLite at MUNINN_DB_PATH."""
    if settings.database_url:
        from bot.memory.postgres.backend import PostgresStorage
        return PostgresStorage(settings.database_url, vector_cache)
    from bot.memory.sqlite.backend import SQLiteStorage
    return SQLiteStorage(settings.db_path, vector_cache)
