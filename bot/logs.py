"""Rate-limited logging: one line per problem per minute, not one per message."""
from __future__ import annotations

import time


class Throttle:
    """`ready(key)` is true at most once every `every` seconds for each key."""

    def __init__(self) -> None:
        self._last: dict[str, float] = {}

    def ready(self, key: str, every: float = 60.0) -> bool:
        """True, and the wait for `key` starts again, when it was
        last ready `every` seconds ago or more (or never)."""
        now = time.monotonic()
        if now - self._last.get(key, -every) >= every:
            self._last[key] = now
            return True
        return False
