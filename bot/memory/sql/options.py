"""Settings that server admins and channel managers change from Discord (portable SQL, both backends).

A server's settings are rows of `guild_settings` (guild id, key, value); a channel's or a thread's
are rows of `channel_options` (channel id, its guild, key, value). A key with no row is not set
there: the place inherits it (bot/conversation/overrides.py says from where). Values are text;
what each key may hold is checked above this layer, before it is written.
"""
from __future__ import annotations

import time
from typing import Sequence

from bot.memory.connection import Connection
from bot.memory.sql.transactions import write_transaction


def guild_options(conn: Connection, guild_id: int) -> dict[str, str]:
    """Every setting stored for a server, by key."""
    return {str(key): str(value) for key, value in conn.execute(
        "SELECT key, value FROM guild_settings WHERE guild_id = ?", (guild_id,))}


def channel_options(conn: Connection, channel_ids: Sequence[int]) -> dict[int, dict[str, str]]:
    """Every setting stored for each of the channels (or threads), by channel id, then key."""
    found: dict[int, dict[str, str]] = {int(cid): {} for cid in channel_ids}
    if not found:
        return found
    marks = ", ".join("?" for _ in found)
    for channel_id, key, value in conn.execute(
            f"SELECT channel_id, key, value FROM channel_options WHERE channel_id IN ({marks})", tuple(found)):
        found[int(channel_id)][str(key)] = str(value)
    return found


def set_channel_option(conn: Connection, channel_id: int, guild_id: int | None, key: str, value: str,
                       now: float | None = None) -> None:
    """Set one setting of a channel or thread, in one transaction."""
    with write_transaction(conn):
        conn.execute(
            "INSERT INTO channel_options (channel_id, guild_id, key, value, updated_at) VALUES (?, ?, ?, ?, ?) "
            "ON CONFLICT (channel_id, key) DO UPDATE SET value = excluded.value, guild_id = excluded.guild_id, "
            "updated_at = excluded.updated_at",
            (channel_id, guild_id, key, value, time.time() if now is None else now))


def clear_channel_option(conn: Connection, channel_id: int, key: str) -> bool:
    """Remove one setting of a channel or thread (it inherits again); False when it was not set."""
    with write_transaction(conn):
        conn.execute("DELETE FROM channel_options WHERE channel_id = ? AND key = ?", (channel_id, key))
        return conn.changes() > 0


def clear_guild_option(conn: Connection, guild_id: int, key: str) -> bool:
    """Remove one setting of a server (it falls back to the operator's .env); False when it was not set."""
    with write_transaction(conn):
        conn.execute("DELETE FROM guild_settings WHERE guild_id = ? AND key = ?", (guild_id, key))
        return conn.changes() > 0
