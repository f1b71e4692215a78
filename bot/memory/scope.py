"""The one scope rule: which memories a viewer may see.

Every path that can surface a memory (FTS, KNN, graph links, listings, exports)
filters on `visible_keys(viewer)`; nothing else decides visibility.

Each memory carries a visibility key derived from where it belongs:
  personal, learned in guild G -> "p:<owner>:<G>"   (seen by its owner in G and in DMs)
  personal, learned in private
    channel C of guild G       -> "p:<owner>:<G>:c<C>" (seen by its owner in C and in DMs)
  personal, learned in a DM    -> "p:<owner>:dm"    (seen by its owner in DMs only)
  room of channel C            -> "r:<C>"           (seen by anyone in channel C)
  global                       -> "g"               (seen everywhere)
A personal memory therefore never surfaces somewhere more public than where it was
learned, and never in another guild. Archived memories are excluded by every caller
through `ACTIVE`.
"""
from __future__ import annotations

from dataclasses import dataclass

from bot.memory.connection import Connection

SCOPES = ("personal", "room", "global")
GLOBAL_KEY = "g"
ACTIVE = "archived_at IS NULL"


@dataclass(frozen=True)
class Viewer:
    """Who is asking, and where: a user in a guild channel, or a user in a DM."""
    user_id: int
    channel_id: int | None = None
    guild_id: int | None = None
    dm: bool = False

    def __post_init__(self):
        if self.dm and self.guild_id is not None:
            raise ValueError("a DM has no guild")


def memory_key(scope: str, owner_id: int | None, channel_id: int | None, guild_id: int | None,
               private: bool = False) -> str:
    """`private`: learned in a guild channel (or thread) that not everyone in the guild can read."""
    if scope == "personal":
        if owner_id is None:
            raise ValueError("a personal memory needs an owner user id")
        if guild_id is None:
            return f"p:{owner_id}:dm"
        if private:
            if channel_id is None:
                raise ValueError("a memory learned in a private channel needs the channel id")
            return f"p:{owner_id}:{guild_id}:c{channel_id}"
        return f"p:{owner_id}:{guild_id}"
    if scope == "room":
        if channel_id is None:
            raise ValueError("a room memory needs a channel id")
        return f"r:{channel_id}"
    if scope == "global":
        return GLOBAL_KEY
    raise ValueError(f"unknown scope {scope!r}; use one of {', '.join(SCOPES)}")


def is_private(key: str) -> bool:
    """A personal key of a memory learned in a private guild channel (it names the channel)."""
    return key.startswith("p:") and key.count(":") == 3


def visible_keys(conn: Connection, viewer: Viewer) -> list[str]:
    """The visibility keys this viewer may read, global first."""
    keys = [GLOBAL_KEY]
    if viewer.dm:
        # In a DM the owner sees personal memories learned anywhere (they are alone there).
        return keys + personal_keys(conn, viewer.user_id)
    if viewer.guild_id is not None:
        keys.append(f"p:{viewer.user_id}:{viewer.guild_id}")
        if viewer.channel_id is not None:  # what they said in this very channel, if it is private
            keys.append(f"p:{viewer.user_id}:{viewer.guild_id}:c{viewer.channel_id}")
    if viewer.channel_id is not None:
        keys.append(f"r:{viewer.channel_id}")
    return keys


def personal_keys(conn: Connection, owner_id: int) -> list[str]:
    """The visibility keys of a person's active personal memories, in key order. One index seek
    per key (a loose index scan over memories_owner_keys), not one row per memory: a heavy user
    has thousands of memories under a handful of keys."""
    return [row[0] for row in conn.execute(personal_keys_sql(":owner"), {"owner": owner_id})]


def personal_keys_sql(owner: str) -> str:
    """personal_keys' statement, `owner` the owner id's placeholder (used twice): PostgreSQL's
    fact-write plan runs it inside a statement of its own, the same rule."""
    step = (f"SELECT min(vis_key) FROM memories WHERE owner_id = {owner} AND scope = 'personal' AND "
            "archived_at IS NULL AND vis_key > ")
    return (f"WITH RECURSIVE k(key) AS ({step}'' UNION ALL SELECT ({step}k.key) FROM k WHERE k.key IS NOT NULL) "
            "SELECT key FROM k WHERE key IS NOT NULL")


def key_filter(keys: list[str], column: str = "vis_key") -> tuple[str, tuple[str, ...]]:
    """SQL `column IN (...)` for these keys, with its parameters."""
    return f"{column} IN ({','.join('?' * len(keys))})", tuple(keys)

