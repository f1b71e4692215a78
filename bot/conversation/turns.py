"""One turn at a time per channel, in arrival order; channels do not wait for each other."""
from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from typing import AsyncIterator


class ChannelTurns:
    """One turn at a time per channel, in arrival order; channels do not wait for each other."""

    def __init__(self) -> None:
        self._locks: dict[int, asyncio.Lock] = {}
        self._waiting: dict[int, int] = {}

    def waiting(self, channel_id: int) -> int:
        """How many turns of this channel are taken or waited for."""
        return self._waiting.get(channel_id, 0)

    @asynccontextmanager
    async def turn(self, channel_id: int) -> AsyncIterator[None]:
        """Hold this channel's turn for the block, after those who asked before."""
        lock = self._locks.setdefault(channel_id, asyncio.Lock())
        self._waiting[channel_id] = self._waiting.get(channel_id, 0) + 1
        try:
            async with lock:
                yield
        finally:
            self._waiting[channel_id] -= 1
            if not self._waiting[channel_id]:  # forget idle channels
                del self._waiting[channel_id]
                del self._locks[channel_id]
