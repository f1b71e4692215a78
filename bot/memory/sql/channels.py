"""Per-channel options an admin sets with slash commands (the `channel_settings` table).

Today one option: always answer in this channel, without being mentioned."""
from __future__ import annotations

import time

from bot.memory.connection import Connection
from bot.memory.sql.queries import query_value
from bot.memory.sql.transactions import write_transaction


def set_always_answer(conn: Connection, channel_id: int, guild_id: int | None, enabled: bool,
                      now: float | None = None) -> None:
    """Set the channel's always-answer option (an admin's slash command), in one transaction."""
    with write_transaction(conn):
        conn.execute(
            "INSERT INTO channel_settings (channel_id, guild_id, always_answer, updated_at) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (channel_id) DO UPDATE SET always_answer = excluded.always_answer, "
            "guild_id = excluded.guild_id, updated_at = excluded.updated_at",
            (channel_id, guild_id, int(enabled), time.time() if now is None else now))


def always_answer(conn: Connection, channel_id: int) -> bool | None:
    """The channel's always-answer option, or None when nobody has set it here."""
    value = query_value(conn, "SELECT always_answer FROM channel_settings WHERE channel_id = ?", (channel_id,))
    return None if value is None else bool(value)
