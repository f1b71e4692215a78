"""A memory's vector stays under its memory's visibility key (SQLite).

The vector search is scoped by the vector's own copy of the key (vec0's partition key), not
by the memory's, so a memory whose scope or vis_key changed (an operator's UPDATE, a repair, a
later feature) would still be found by the old key's viewers through the vector path: a
personal memory made from a global one stayed visible to everyone. vec0 cannot UPDATE a
partition key, so the trigger takes the vector out in the same transaction (and marks the
memory unembedded: the backfill embeds it again, under the new key), and logs the change for
the vector caches. PostgreSQL moves the vector instead (its migration 10).

The trigger names vec_memories, which exists only once there are vectors (vectors.py creates
it with the model's dimension), so it is made with that table, and at start for older files.
"""
from __future__ import annotations

from bot.memory.connection import Connection

FOLLOW_TRIGGER = """
CREATE TRIGGER IF NOT EXISTS vec_memories_follow_key AFTER UPDATE OF vis_key ON memories
WHEN OLD.vis_key IS NOT NEW.vis_key BEGIN
    DELETE FROM vec_memories WHERE memory_id = NEW.id;
    UPDATE memories SET embedded = 0 WHERE id = NEW.id AND embedded = 1;
    INSERT INTO vector_changes (memory_id) VALUES (NEW.id);
END
"""


def follow_keys(conn: Connection) -> None:
    """Create the trigger (idempotent); vec_memories must exist."""
    conn.execute(FOLLOW_TRIGGER)
