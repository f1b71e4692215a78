"""A dependency-free progress bar on stderr (redrawn in place on a terminal, sparse lines otherwise)."""
from __future__ import annotations

import sys
import time


class Progress:
    """A progress bar of `total` steps (None: a plain count) on stderr or `stream`: redrawn in place
    on a terminal, an occasional line otherwise. Used as a context manager, it finishes on exit."""

    def __init__(self, label: str, total: int | None, stream=None, width: int = 30):
        self.label, self.total, self.done = label, total, 0
        self.stream = stream or sys.stderr
        self.width = width
        self.tty = getattr(self.stream, "isatty", lambda: False)()
        self._last_draw = 0.0

    def advance(self, n: int = 1) -> None:
        """Count `n` more steps done (see `update`)."""
        self.update(self.done + n)

    def update(self, done: int) -> None:
        """Set how many steps are done; the bar is redrawn only when its last drawing is old enough."""
        self.done = done
        now = time.monotonic()
        if now - self._last_draw >= (0.1 if self.tty else 2.0):
            self._last_draw = now
            self._draw()

    def _draw(self, end: str = "") -> None:
        if self.total:
            filled = int(self.width * min(self.done, self.total) / self.total)
            bar = "#" * filled + "-" * (self.width - filled)
            text = f"{self.label} [{bar}] {self.done}/{self.total}"
        else:
            text = f"{self.label} {self.done}"
        self.stream.write(("\r" if self.tty else "") + text + (end or ("" if self.tty else "\n")))
        self.stream.flush()

    def finish(self) -> None:
        """Draw the bar as it stands and end its line."""
        self._draw(end="\n")

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.finish()
