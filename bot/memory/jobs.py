"""What the memory layer's façades need from the engine: its two ways to run a job on a connection."""
from __future__ import annotations

from typing import Any, Callable, Protocol, TypeVar

T = TypeVar("T")


class Jobs(Protocol):
    """The engine's job runners (bot/memory/engine.py), seen by the modules that group its named methods."""

    async def read(self, job: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a read-only `job(conn, *args, **kwargs)` on a read connection."""

    async def write(self, job: Callable[..., T], *args: Any, what: str = ..., **kwargs: Any) -> T:
        """Run `job(conn, *args, **kwargs)`, one transaction, on the writer (retried while busy)."""
