"""The memory layer: the only code that touches the database.

`engine.Engine` is its face. Below it, one storage interface (`storage.Storage`) with a wing per
backend: `sqlite/` (the default) and `postgres/`; portable SQL both run in `sql/`, recall's
portable steps in `recall/`, the shared in-memory vector search in `vectors/`, and the one
scope rule in `scope.py`.
"""
from bot.memory.sqlite.backend import SQLITE
from bot.memory.storage import register_default

# connections that do not name their backend are SQLite's (storage.storage_of)
register_default(SQLITE)
