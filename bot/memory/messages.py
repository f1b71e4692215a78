"""The channel history, as the conversation layer uses it.

Named methods over the SQL of `sql/history.py`, run on the engine's
threads (`engine.messages`); nothing above the memory layer runs SQL or sees a connection.
"""
from __future__ import annotations

from typing import Callable, Sequence

from bot.memory.connection import Connection
from bot.memory.jobs import Jobs
from bot.memory.sql import forgetting, history
from bot.memory.sql.forgetting import Forgotten
from bot.memory.sql.history import Edit, Edited, HistoryMessage, Linked
from bot.memory.sql.history import storable as storable_text
from bot.memory.storage import storage_of

__all__ = ["Edit", "Edited", "Forgotten", "HistoryMessage", "Linked", "Messages", "storable_text"]


class Messages:
    """`engine.messages`: record, read, edit and delete the history."""

    def __init__(self, jobs: Jobs) -> None:
        self._jobs = jobs

    async def record(self, row: dict, *, keep: int | None = None) -> int:
        """Store one message (idempotent for a re-delivered Discord message) and, with `keep`,
        prune its channel to the newest `keep` messages in the same job; returns its id."""
        return await self._jobs.write(_record_and_prune, row, keep, what="record a message")

    async def recent(self, channel_id: int, limit: int, *, before: HistoryMessage | None = None) -> list[HistoryMessage]:
        """The last `limit` messages of a channel, oldest first (history.recent)."""
        return await self._jobs.read(history.recent, channel_id, limit, before=before)

    async def edit(self, message_id: int, content: str, edited_at: float | None, context: int, *,
                   on_change: Callable[[], None] | None = None) -> Edited:
        """Record an edit and take back what the old words alone taught, in one transaction
        (history.edit_and_take_back). `on_change` runs on the database thread right after a change
        of words, before any job queued behind this one (a fact write of the old words sees it)."""
        return await self._jobs.write(_edit, message_id, content, edited_at, context, on_change, what="record an edit")

    async def delete(self, message_ids: Sequence[int], deleted_at: float | None = None) -> int:
        """Mark messages deleted and take back what they alone taught, in one transaction."""
        return await self._jobs.write(history.delete_and_take_back, list(message_ids), deleted_at,
                                      what=f"mark {len(message_ids)} deleted messages")

    async def in_channel(self, channel_id: int, message_id: int) -> Linked | None:
        """A message of that channel's history, with what it answers and whether it was deleted;
        None when the history holds no such message in that channel."""
        return await self._jobs.read(history.in_channel, channel_id, message_id)

    async def is_own(self, message_id: int) -> bool:
        """Whether the message is one of Muninn's replies."""
        return await self._jobs.read(history.is_assistant_message, message_id)

    async def drop(self, message_ids: Sequence[int]) -> None:
        """Delete rows outright (a forgotten person's message that arrived meanwhile) and scrub
        the history's files."""
        await self._jobs.write(_drop_and_scrub, list(message_ids), what="drop the messages of a forgotten person")

    async def forget_person(self, user_id: int) -> Forgotten:
        """Delete a person's personal memories, the room memories only they taught, other people's
        memories that mention them, their messages in the history and Muninn's replies that may
        repeat their words, and leave the room memories others taught too to those, in one
        transaction (sql/forgetting.py); then
        scrub the database files."""
        return await self._jobs.write(_forget_person, user_id, what=f"forget everything about user {user_id}")

    async def of_person(self, user_id: int) -> list[HistoryMessage]:
        """A person's messages in the history, Muninn's replies to them and their DM conversations,
        oldest first: what `forget_person` erases of the history, for their data export."""
        return await self._jobs.read(history.of_person, user_id)


def _record_and_prune(conn: Connection, row: dict, keep: int | None) -> int:
    message_id = history.record(conn, **row)
    if keep is not None:
        history.prune(conn, row["channel_id"], keep)
    return message_id


def _edit(conn: Connection, message_id: int, content: str, edited_at: float | None, context: int,
          on_change: Callable[[], None] | None) -> Edited:
    edit = history.edit_and_take_back(conn, message_id, content, edited_at, context)
    if edit.kind is not Edit.SAME_WORDS and on_change is not None:
        on_change()
    return edit


def _drop_and_scrub(conn: Connection, message_ids: list[int]) -> None:
    history.remove(conn, message_ids)
    storage_of(conn).scrub(conn, ("messages",))


def _forget_person(conn: Connection, user_id: int) -> Forgotten:
    forgotten = forgetting.forget_person(conn, user_id)
    storage_of(conn).scrub(conn)  # after the commit: the checkpoint (SQLite) or VACUUM (PostgreSQL) cannot run inside one
    return forgotten
