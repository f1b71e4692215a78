"""Messages of a channel reach the history in the order they arrived.

A bot reads a few things before it knows whether to answer a message (is it mentioned, is the
channel opted in, is the author's memory paused), and those reads take longer for some
messages than for others (a database across the network takes a round trip each). So a
message sent just before a mention could be recorded after the mention's answer had read
the channel history, and be missing from its context (seen on PostgreSQL).

The adapter calls `arrived` as a message comes in, before any await, and `settled` when it
is recorded or dropped; an answer first waits, briefly, until the channel's earlier
messages are settled (`earlier_settled`).
"""
from __future__ import annotations

import asyncio

WAIT_S = 2.0  # never hold an answer longer than this for a message still being looked at


class Arrivals:
    """Per channel, the messages that arrived and are not yet recorded or dropped; an
    answer waits for the earlier ones (`earlier_settled`). Used on the event loop only."""
    def __init__(self) -> None:
        self._pending: dict[int, dict[int, asyncio.Event]] = {}  # channel id -> message id -> settled

    def arrived(self, channel_id: int, message_id: int | None) -> None:
        """Note a message as it comes in, before any await (a None id is ignored)."""
        if message_id is not None:
            self._pending.setdefault(channel_id, {}).setdefault(message_id, asyncio.Event())

    def settled(self, channel_id: int, message_id: int | None) -> None:
        """The message was recorded or dropped: wake the answers waiting for it (a None or unknown id is ignored)."""
        pending = self._pending.get(channel_id)
        if pending is None or message_id is None:
            return
        event = pending.pop(message_id, None)
        if event is not None:
            event.set()
        if not pending:
            del self._pending[channel_id]

    async def earlier_settled(self, channel_id: int, message_id: int | None, timeout: float = WAIT_S) -> None:
        """Wait until the channel's messages that arrived before `message_id` (snowflakes grow
        with time) are recorded or dropped, at most `timeout` seconds."""
        if message_id is None:
            return
        earlier = [event for other, event in self._pending.get(channel_id, {}).items()
                   if other < message_id and not event.is_set()]
        if earlier:
            waits = [asyncio.ensure_future(event.wait()) for event in earlier]
            try:
                await asyncio.wait(waits, timeout=timeout)
            finally:
                for wait in waits:
                    wait.cancel()
