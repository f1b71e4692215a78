"""`muninn chat` with piped input or output: whole lines in, whole lines out, for scripts.

Input is read on a daemon thread, so Ctrl-C (a signal here) ends the program at once: nothing
waits for a blocked read. No prompt, no status line, replies printed whole.
"""
from __future__ import annotations

import asyncio
import threading
from typing import AsyncContextManager, TextIO

from bot.conversation.outlets import no_typing


class PipedConsole:
    """`muninn chat`'s console when stdin or stdout is not a terminal (an async context manager)."""

    interactive = False

    def __init__(self, stdin: TextIO, stdout: TextIO):
        self.stdin, self.out = stdin, stdout
        self.queue: asyncio.Queue[str | None] = asyncio.Queue()
        self.interrupted = asyncio.Event()   # never set: Ctrl-C is a signal when input is piped
        self.ended = False

    async def __aenter__(self) -> "PipedConsole":
        loop = asyncio.get_running_loop()

        def read() -> None:
            while True:
                try:
                    line = self.stdin.readline()
                except (OSError, ValueError):  # closed underneath us
                    line = ""
                loop.call_soon_threadsafe(self.queue.put_nowait, line.rstrip("\n") if line else None)
                if not line:
                    return
        threading.Thread(target=read, name="muninn-chat-input", daemon=True).start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    def line(self, text: str) -> None:
        """Print one line."""
        self.out.write(text + "\n")
        self.out.flush()

    async def read(self) -> str | None:
        """The next line of input; None once input has ended (or stdin was closed), and None again
        on every later call (the reader thread sends its None once: a question that took it must
        not leave the conversation waiting for a line that never comes)."""
        if self.ended:
            return None
        line = await self.queue.get()
        self.ended = line is None
        return line

    def thinking(self) -> AsyncContextManager:
        """Nothing to show while Muninn thinks: scripts read whole replies."""
        return no_typing()

    def stream(self) -> None:
        """Replies are printed whole."""
        return None
