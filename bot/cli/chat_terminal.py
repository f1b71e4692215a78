"""The screen of `muninn chat` on a terminal: an input line that is never overwritten, and
everything else (replies, notices, log lines) printed above it.

prompt_toolkit draws the input line (editing, history with the arrow keys) and keeps it while
lines are printed above: what the person is typing survives a log line arriving. Between the
printed lines and the input line sits one status line: Muninn thinking (with the seconds it has
been at it), then its reply as it is written; the finished reply is printed above like the rest.
Ctrl-D on an empty line ends the input; Ctrl-C sets `interrupted` (the chat leaves).
"""
from __future__ import annotations

import asyncio
import shutil
import sys
import time
from contextlib import asynccontextmanager
from typing import AsyncIterator, TextIO

from prompt_toolkit import PromptSession
from prompt_toolkit.formatted_text import FormattedText
from prompt_toolkit.history import InMemoryHistory
from prompt_toolkit.patch_stdout import StdoutProxy

from bot.conversation.outlets import Sent

PROMPT = "you> "
REPLY = "muninn> "
SPINNER = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"


class TerminalConsole:
    """`muninn chat`'s console on a terminal (use it as an async context manager): `line` prints
    above the input line, `read` returns the next line typed (None once input ended)."""

    interactive = True

    def __init__(self) -> None:
        # The history lives as long as the chat: what was typed is not written to a file that a
        # forget could not reach.
        self.session: PromptSession[str] = PromptSession(history=InMemoryHistory(), erase_when_done=True)
        self.lines: asyncio.Queue[str | None] = asyncio.Queue()
        self.interrupted = asyncio.Event()
        self.status = ""               # the reply written so far
        self.is_thinking = False       # no words of the reply yet
        self.since = 0.0               # when Muninn started thinking
        self.ended = False
        self._proxy: StdoutProxy | None = None
        self._saved: tuple[TextIO, TextIO] | None = None
        self._input: asyncio.Task | None = None

    async def __aenter__(self) -> "TerminalConsole":
        # Short pauses between writes: a finished reply appears above as its status line goes.
        self._proxy = StdoutProxy(sleep_between_writes=0.02, raw=True)
        self._saved = (sys.stdout, sys.stderr)
        sys.stdout = sys.stderr = self._proxy  # what others print goes above too
        self._input = asyncio.get_running_loop().create_task(self._read_input())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._input is not None and not self._input.done():
            if self.session.app.is_running:
                self.session.app.exit(exception=EOFError())
            self._input.cancel()
            await asyncio.gather(self._input, return_exceptions=True)
        if self._proxy is not None:
            self._proxy.close()
        if self._saved is not None:
            sys.stdout, sys.stderr = self._saved

    async def _read_input(self) -> None:
        while True:
            try:
                text = await self.session.prompt_async(self._message)
            except EOFError:                  # Ctrl-D on an empty line
                self.lines.put_nowait(None)
                return
            except KeyboardInterrupt:         # Ctrl-C: raw mode turns it into a key, not a signal
                self.interrupted.set()
                self.lines.put_nowait(None)
                return
            self.line(PROMPT + text)          # the input line was erased: keep what was said in view
            self.lines.put_nowait(text)

    def _message(self) -> FormattedText:
        """The status line (if any) and the prompt, drawn above what is being typed."""
        if self.is_thinking:
            seconds = time.monotonic() - self.since
            spin = SPINNER[int(seconds * 4) % len(SPINNER)]
            shown = f"muninn is thinking {spin}" + (f" {seconds:.0f} s" if seconds >= 2 else "")
            return FormattedText([("fg:ansibrightblack", shown), ("", "\n" + PROMPT)])
        if not self.status:
            return FormattedText([("", PROMPT)])
        return FormattedText([("", REPLY + self.status), ("", "\n" + PROMPT)])

    def _redraw(self) -> None:
        if self.session.app.is_running:
            self.session.app.invalidate()

    def line(self, text: str) -> None:
        """Print `text` above the input line (what is typed there stays)."""
        out = self._proxy or sys.stdout
        out.write(text + "\n")
        out.flush()

    async def read(self) -> str | None:
        """The next line typed; None once input ended (Ctrl-D, Ctrl-C), and None again after that."""
        if self.ended:
            return None
        text = await self.lines.get()
        self.ended = text is None
        return text

    @asynccontextmanager
    async def thinking(self) -> AsyncIterator[None]:
        """Show that Muninn is thinking until the first words of its reply (or until the block ends)."""
        self.is_thinking, self.since = True, time.monotonic()
        ticking = asyncio.get_running_loop().create_task(self._tick())
        try:
            yield
        finally:
            self.is_thinking = False
            ticking.cancel()
            self._redraw()

    async def _tick(self) -> None:
        """Redraw the spinner while Muninn thinks (and only then: an idle screen gets no output)."""
        while self.is_thinking:
            self._redraw()
            await asyncio.sleep(0.25)

    def stream(self) -> "StatusReplyStream":
        """The reply shown on the status line while it is written."""
        return StatusReplyStream(self)


class StatusReplyStream:
    """A reply written on the status line, then printed above the input line once it is final."""

    def __init__(self, console: TerminalConsole):
        self.console = console

    async def update(self, text: str) -> None:
        """Show the reply so far on the status line (its end, when it would not fit on the screen)."""
        size = shutil.get_terminal_size()
        fits = max(80, size.columns * max(1, size.lines - 3) - len(REPLY) - 1)
        text = text.replace("\n", " ")
        self.console.status = text if len(text) <= fits else "…" + text[-fits:]
        self.console.is_thinking = False
        self.console._redraw()

    async def finish(self, text: str) -> list[Sent]:
        """Print the final reply above the input line (the status line goes); one Sent without an id."""
        self.console.line(REPLY + text)
        self.console.status = ""
        self.console._redraw()
        return [Sent(None, time.time())]
