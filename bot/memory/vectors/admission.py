"""Which cold keys the vector cache loads: on a source that says so, only a key met again soon."""
from __future__ import annotations

import time
from collections import OrderedDict

# The most keys remembered as missed once: the oldest are forgotten first (a key met once long
# ago is as good as never met).
REMEMBERED_MAX = 10_000


class SecondHit:
    """Admits a cold key to the cache on its second miss within `window_s` seconds, not its first.

    With the budget full, every load evicts other keys: a key met once and loaded (seconds of the
    loader's reading and converting beside the recalls) pushed out keys met again soon after, which
    were read back in turn. A key met only once is searched in the store instead, as it is while
    any load runs. `window_s` 0: every key is admitted on its first miss. Not thread-safe: the
    cache calls it under its lock."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._missed: OrderedDict[str, float] = OrderedDict()  # key -> when it was last missed, oldest first

    def admit(self, key: str, now: float | None = None) -> bool:
        """Whether a miss of cold `key` now loads it: a miss within `window_s` of the last one."""
        if self.window_s <= 0:
            return True
        now = time.monotonic() if now is None else now
        last = self._missed.pop(key, None)
        if last is not None and now - last <= self.window_s:
            return True
        self._missed[key] = now
        while len(self._missed) > REMEMBERED_MAX:
            self._missed.popitem(last=False)
        return False

    def clear(self) -> None:
        """Forget every miss (the cache started over)."""
        self._missed.clear()
