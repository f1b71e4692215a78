"""The vector index's state as PostgreSQL's meta rows hold it, read by one statement in every
place that needs it (the keyword step, fact writes' planning and start, PostgresStorage.index_state).
The row carries the removals counter too (removals.py): the keyword step checks its word counts
against it without a round trip of its own."""
from __future__ import annotations

import json

from bot.memory.sql import removals
from bot.memory.vectors import index as vectors
from bot.memory.vectors.index import IndexInfo

# The meta rows of the index, as one JSON object (NULL without any): a subquery or a statement.
INDEX_STATE_SQL = ("SELECT json_object_agg(key, value)::text FROM meta "
                   f"WHERE key IN ('embed_model', 'embed_dim', '{vectors.REINDEX_PENDING}', '{removals.KEY}')")


def index_state_of(values: dict[str, str] | str | None) -> tuple[IndexInfo | None, bool]:
    """(the index, whether a re-index is pending) from INDEX_STATE_SQL's meta rows (or its JSON)."""
    if not isinstance(values, dict):
        values = json.loads(values) if values else {}
    model = values.get("embed_model")
    info = None if model is None else IndexInfo(model, int(values.get("embed_dim") or 0))
    return info, values.get(vectors.REINDEX_PENDING) == "1"
