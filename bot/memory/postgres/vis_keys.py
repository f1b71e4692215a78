"""A memory's vector stays under its memory's visibility key (PostgreSQL).

The vector search filters on memory_vectors.vis_key, the vector's own copy of the key, so a
memory whose scope or vis_key changed (an operator's UPDATE, a repair, a later feature) was
still found by the old key's viewers through the vector path: a personal memory made from a
global one stayed visible to everyone. A trigger moves the vector to the new key in the same
transaction as the change, and logs it in vector_changes for any vector cache. Made once at
start (the backend's `prepare`), which also puts vectors that drifted before back in step.
"""
from __future__ import annotations

from bot.memory.postgres.connection import PgConnection
from bot.memory.postgres.migrations import MIGRATION_LOCK

TRIGGER = "memory_vectors_follow_key"

FOLLOW = f"""
CREATE OR REPLACE FUNCTION {TRIGGER}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE memory_vectors SET vis_key = NEW.vis_key WHERE memory_id = NEW.id;
    IF FOUND THEN
        INSERT INTO vector_changes (memory_id) VALUES (NEW.id);
    END IF;
    RETURN NULL;
END $$;
CREATE OR REPLACE TRIGGER {TRIGGER} AFTER UPDATE OF vis_key ON memories
    FOR EACH ROW WHEN (OLD.vis_key IS DISTINCT FROM NEW.vis_key) EXECUTE FUNCTION {TRIGGER}();
UPDATE memory_vectors v SET vis_key = m.vis_key FROM memories m WHERE v.memory_id = m.id AND v.vis_key <> m.vis_key;
"""


def has_trigger(conn: PgConnection) -> bool:
    row = conn.pg.execute("SELECT count(*) FROM pg_trigger WHERE tgname = %s AND tgrelid = 'memories'::regclass",
                          (TRIGGER,)).fetchone()
    return bool(row and row[0])


def follow_keys(conn: PgConnection) -> None:
    """Create the trigger unless it is there (one catalog read on later starts)."""
    if has_trigger(conn):
        return
    with conn.pg.transaction():
        conn.pg.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))  # two processes starting at once
        if not has_trigger(conn):
            conn.pg.execute(FOLLOW.encode())  # our own constant SQL
