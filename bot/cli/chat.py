"""`muninn chat`: talk to Muninn in a terminal, through the same pipeline as on Discord.

You are one local user in one local room (guild 0, channel 0), so what Muninn learns
here stays here: it is stored as your personal memories of that room. Lines starting with
a command word are handled locally (`/help` lists them), never sent to the model.

On a terminal the reply appears as Ollama writes it (MUNINN_STREAM_REPLIES), piped output gets
whole lines. Input is read on a daemon thread, so Ctrl-C ends the program at once (nothing waits for a
blocked read); Ctrl-D or /quit first saves the facts waiting for extraction, for at most
MUNINN_SHUTDOWN_SECONDS, and says so. On a terminal, log lines are printed above the prompt
(WARNING and up, unless -v) and, with --log-file, all of them go to that file.
"""
from __future__ import annotations

import asyncio
import getpass
import inspect
import logging
import sys
import threading
import time
from pathlib import Path
from typing import TextIO

from bot import redact
from bot.conversation.outlets import ForgetOffer, Sent, no_typing
from bot.conversation.pipeline import Incoming, Pipeline
from bot.memory.engine import Engine
from bot.memory.records import MemoryNotFound
from bot.memory.scope import Viewer
from bot.settings import Settings

LOCAL_USER_ID = 1
LOCAL_CHANNEL_ID = 0
LOCAL_GUILD_ID = 0
PROMPT = "you> "
QUIT = {"/quit", "/exit", "/q"}
HELP = """Local commands (never sent to the model):
  /memories        what Muninn remembers that you can see here
  /search TEXT     what Muninn would recall for TEXT, and why (counts as no recall)
  /forget ID       forget one of your memories
  /pause, /resume  stop or restart Muninn remembering what you say
  /help            this list
  /quit            leave (Ctrl-D too; Ctrl-C leaves at once)
You can also say "forget that I live in Oslo": Muninn shows what matches and asks first."""
SLOW_DOWN = ("muninn> (You are writing faster than I answer one person: I keep this message but do not "
             "answer it. Wait a few seconds.)")  # at most once a minute (bot/conversation/rate.py)
VIEWER = Viewer(user_id=LOCAL_USER_ID, channel_id=LOCAL_CHANNEL_ID, guild_id=LOCAL_GUILD_ID)


class LineReader:
    """stdin lines on a daemon thread, handed to the event loop; None at end of input."""

    def __init__(self, stdin: TextIO):
        self.queue: asyncio.Queue[str | None] = asyncio.Queue()
        self.ended = False
        loop = asyncio.get_running_loop()

        def read() -> None:
            while True:
                try:
                    line = stdin.readline()
                except (OSError, ValueError):  # closed underneath us
                    line = ""
                loop.call_soon_threadsafe(self.queue.put_nowait, line or None)
                if not line:
                    return
        threading.Thread(target=read, name="muninn-chat-input", daemon=True).start()

    async def line(self) -> str | None:
        """The next line of input, newline included; None once input has ended (or stdin was closed),
        and None again on every later call (the reader thread sends its None once: a question that
        took it must not leave the conversation waiting for a line that never comes)."""
        if self.ended:
            return None
        line = await self.queue.get()
        self.ended = line is None
        return line


class Screen:
    """The terminal: prints replies and log lines without mixing them into the prompt."""

    def __init__(self, out: TextIO, interactive: bool):
        self.out = out
        self.interactive = interactive
        self.prompt_shown = False
        self.writing = False   # a streamed reply is being written on the last line

    def prompt(self) -> None:
        """Show the prompt, on a terminal only (piped output gets none); log lines then go above it."""
        if self.interactive:
            self.out.write(PROMPT)
            self.out.flush()
            self.prompt_shown = True

    def line(self, text: str) -> None:
        """A line above the prompt (the prompt is drawn again after it)."""
        if self.writing:  # a log line in the middle of a streamed reply: the reply goes on below it
            self.out.write("\n" + text + "\nmuninn> …")
        elif self.prompt_shown:
            self.out.write("\r\x1b[K" + text + "\n" + PROMPT)
        else:
            self.out.write(text + "\n")
        self.out.flush()

    def said(self) -> None:
        """The person pressed Enter: the prompt line is theirs now."""
        self.prompt_shown = False

    def write_on(self, text: str) -> None:
        """More of a streamed reply, on its line."""
        if not self.writing:
            self.out.write("muninn> ")
            self.writing = True
        self.out.write(text)
        self.out.flush()

    def end_reply(self) -> None:
        """End the line of the streamed reply being written, if there is one."""
        if self.writing:
            self.out.write("\n")
            self.out.flush()
            self.writing = False


class TerminalReplyStream:
    """A reply printed as Ollama writes it (on a terminal). Printed text cannot be taken back,
    so when the final reply does not continue what was shown (a stream that broke ends as the
    fallback answer), the final reply follows on its own line."""

    def __init__(self, screen: Screen):
        self.screen = screen
        self.shown = ""

    async def update(self, text: str) -> None:
        """Print what `text` adds to the reply shown so far; text that does not continue it is left to `finish`."""
        if text.startswith(self.shown):
            self.screen.write_on(text[len(self.shown):])
            self.shown = text

    async def finish(self, text: str) -> list[Sent]:
        """Print the rest of the final reply, or all of it on a line of its own when it does not continue
        what was shown; returns one Sent without a message id."""
        if self.shown and text.startswith(self.shown):
            self.screen.write_on(text[len(self.shown):])
            self.screen.end_reply()
        else:
            self.screen.end_reply()
            self.screen.line(f"muninn> {text}")
        return [Sent(None, time.time())]


class AbovePrompt(logging.Handler):
    """The log handler of `muninn chat` on a terminal: each record is one line above the prompt."""

    def __init__(self, screen: Screen):
        super().__init__()
        self.screen = screen
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        """Print the record above the prompt; a failure to print goes to `handleError`, not to the caller."""
        try:
            self.screen.line(self.format(record))
        except Exception:
            self.handleError(record)


class TerminalOutlet:
    """The pipeline's outlet in `muninn chat`: replies are printed on the `Screen`, and a request to
    forget is confirmed by the next line read from `reader`."""

    def __init__(self, screen: Screen, reader: LineReader):
        self.screen = screen
        self.reader = reader

    def typing(self):
        """Nothing to show while Muninn thinks: `no_typing()`."""
        return no_typing()

    async def send(self, text: str) -> list[Sent]:
        """Print the reply as one `muninn>` line; returns one Sent without a message id."""
        self.screen.line(f"muninn> {text}")
        return [Sent(None, time.time())]

    async def slow_down(self) -> None:
        """One short line: this message is kept but not answered (the author is over MUNINN_RATE_PER_MINUTE)."""
        self.screen.line(SLOW_DOWN)

    def stream(self) -> TerminalReplyStream | None:
        """Replies are streamed on a terminal; piped output gets whole lines (scripts read them)."""
        return TerminalReplyStream(self.screen) if self.screen.interactive else None

    async def confirm_forget(self, offer: ForgetOffer) -> list[Sent]:
        """The text fallback of Discord's buttons: list the matches, then ask yes or no."""
        self.screen.line(f"muninn> {offer.intro}")
        for memory in offer.memories:
            self.screen.line(f"  #{memory.id} {memory.text}")
        self.screen.line("Forget " + ("it" if len(offer.memories) == 1 else "them") + "? (yes/no)")
        self.screen.prompt()
        answer = await self.reader.line()
        self.screen.said()
        if answer is not None and answer.strip().lower() in ("y", "yes"):
            removed = await offer.forget()
            self.screen.line(f"muninn> Forgotten: {removed} {'memory' if removed == 1 else 'memories'}.")
        else:
            self.screen.line("muninn> Kept: nothing was forgotten.")
        return [Sent(None, time.time())]


def local_name() -> str:
    """The login name Muninn calls you by when --name is not given; "you" when there is none."""
    try:
        return getpass.getuser() or "you"
    except (KeyError, OSError):  # no passwd entry (containers)
        return "you"


class Commands:
    """The local commands of `muninn chat`."""

    def __init__(self, engine: Engine, pipeline: Pipeline, screen: Screen):
        self.engine, self.pipeline, self.screen = engine, pipeline, screen

    @staticmethod
    def is_command(text: str) -> bool:
        """Whether the line starts with a command word: a slash then letters only (anything else
        goes to the model). `text` must not be blank."""
        word = text.split(maxsplit=1)[0]
        return word.startswith("/") and word[1:].isalpha()

    async def run(self, text: str) -> None:
        """Run the command word of the line (any case) with the rest as its argument; an unknown
        word gets one line pointing at /help."""
        word, _, rest = text.partition(" ")
        rest = rest.strip()
        handler = {"/help": self.help, "/memories": self.memories, "/search": self.search,
                   "/forget": self.forget, "/pause": self.pause, "/resume": self.resume}.get(word.lower())
        if handler is None:
            self.screen.line(f"unknown command {word}; /help lists them")
            return
        await handler(rest)

    async def help(self, rest: str) -> None:
        """/help: print the list of local commands."""
        self.screen.line(HELP)

    async def memories(self, rest: str) -> None:
        """/memories: print how many active memories you can see here, then the newest of them
        with their ids and scopes."""
        memories, total = await self.engine.list_visible(VIEWER, limit=50)
        self.screen.line(f"{total} memories you can see here" + (" (newest 50)" if total > 50 else "") + ":"
                         if total else "Muninn remembers nothing you can see here yet.")
        for memory in memories:
            self.screen.line(f"  #{memory.id} [{memory.scope}] {memory.text}")

    async def search(self, rest: str) -> None:
        """/search TEXT: print what a recall for TEXT would bring and by which way each memory came;
        it does not count as a recall (nothing is touched)."""
        if not rest:
            self.screen.line("usage: /search TEXT")
            return
        result = await self.engine.recall(rest, VIEWER, touch=False)
        self.screen.line(f"{result.mode} (vectors: {result.vector_status}), {len(result.memories)} memories:")
        for rank, recalled in enumerate(result.memories, start=1):
            reason = recalled.candidate.reason()
            self.screen.line(f"  {rank}. #{recalled.memory.id} [{recalled.memory.scope}] {recalled.memory.text}"
                             f"  (via {reason['via']})")

    async def forget(self, rest: str) -> None:
        """/forget ID: delete one of your own memories (personal, or a room memory you taught) and scrub
        it at once; an id that is not yours gets the same answer as one that does not exist."""
        if not rest.lstrip("#").isdigit():
            self.screen.line("usage: /forget ID (the number /memories shows)")
            return
        memory_id = int(rest.lstrip("#"))
        try:
            memory = await self.engine.own_memory(LOCAL_USER_ID, memory_id)
        except MemoryNotFound:
            self.screen.line(f"No memory #{memory_id} of yours.")
            return
        await self.engine.forget([memory.id], scrub=True)
        self.screen.line(f"Forgot #{memory.id}: {memory.text}")

    async def pause(self, rest: str) -> None:
        """/pause: keep nothing of what you say from now on (the messages waiting for extraction
        included); says so, or that memory was already paused."""
        changed = await self.pipeline.pause(LOCAL_USER_ID)
        self.screen.line("Paused: Muninn keeps nothing of what you say until /resume." if changed
                         else "Already paused; /resume turns memory back on.")

    async def resume(self, rest: str) -> None:
        """/resume: keep what you say again; says so, or that memory was not paused."""
        changed = await self.pipeline.resume(LOCAL_USER_ID)
        self.screen.line("Resumed: Muninn remembers what you say again." if changed else "Memory was not paused.")


def _route_logs(screen: Screen, log_file: str | None, verbose: bool) -> list[logging.Handler]:
    """On a terminal, log lines go above the prompt (WARNING and up unless -v); with a log file,
    every line at the configured level goes there too. Returns the handlers this replaced."""
    root = logging.getLogger()
    replaced = list(root.handlers)
    if not screen.interactive and not log_file:
        return replaced
    for handler in replaced:
        root.removeHandler(handler)
    if screen.interactive:
        above = AbovePrompt(screen)
        above.setLevel(logging.DEBUG if verbose else max(logging.WARNING, root.level))
        root.addHandler(above)
    else:
        for handler in replaced:
            root.addHandler(handler)
    if log_file:
        to_file = logging.FileHandler(Path(log_file).expanduser(), encoding="utf-8")
        to_file.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root.addHandler(to_file)
    redact.install()  # the new handlers need the secrets filter too
    return replaced


def _restore_logs(replaced: list[logging.Handler]) -> None:
    root = logging.getLogger()
    for handler in list(root.handlers):
        if handler not in replaced:
            root.removeHandler(handler)
            handler.close()
    for handler in replaced:
        if handler not in root.handlers:
            root.addHandler(handler)


async def run_chat(settings: Settings, *, stdin: TextIO | None = None, stdout: TextIO | None = None,
                   extractor_factory=None, name: str | None = None, log_file: str | None = None,
                   verbose: bool = False) -> int:
    """`muninn chat` on the running event loop until /quit or end of input; returns 0. Leaving so
    gives the facts waiting for extraction up to MUNINN_SHUTDOWN_SECONDS; a cancellation (Ctrl-C)
    drops them and is raised again. The log handlers are put back either way. `stdin`, `stdout`
    and `extractor_factory` default to the process's streams and bot.lifecycle's `Extractor`."""
    stdin = stdin or sys.stdin
    stdout = stdout or sys.stdout
    screen = Screen(stdout, interactive=stdin.isatty())
    name = (name or "").strip() or local_name()
    replaced = _route_logs(screen, log_file, verbose)
    try:
        async with Engine(settings) as engine:
            extractor = None
            if settings.extraction:
                if extractor_factory is None:
                    from bot.lifecycle.extractor import Extractor
                    extractor_factory = Extractor
                extractor = extractor_factory(engine)
            pipeline = Pipeline(engine, extractor)
            reader = LineReader(stdin)
            outlet = TerminalOutlet(screen, reader)
            commands = Commands(engine, pipeline, screen)
            if screen.interactive:
                screen.line(f"Talking to Muninn as {name} (--name changes it). /help lists the local commands; "
                            "/quit or Ctrl-D leaves.")
            try:
                await _converse(reader, screen, commands, pipeline, outlet, name)
            except asyncio.CancelledError:  # Ctrl-C: leave at once, whatever was waiting is dropped
                if extractor is not None:
                    await _close(extractor, 0)
                raise
            if extractor is not None:
                waiting = getattr(extractor, "waiting", 0)
                if waiting and screen.interactive:
                    screen.line(f"Saving what Muninn learned from {waiting} messages "
                                f"(up to {settings.shutdown_seconds:g} s)…")
                await _close(extractor, settings.shutdown_seconds)
    finally:
        _restore_logs(replaced)
    return 0


async def _close(extractor, timeout: float) -> None:
    """Close the extractor, waiting at most `timeout` s for it (if it takes a bound)."""
    if "timeout" in inspect.signature(extractor.close).parameters:
        await extractor.close(timeout=timeout)
    else:
        await extractor.close()


async def _converse(reader: LineReader, screen: Screen, commands: Commands, pipeline: Pipeline,
                    outlet: TerminalOutlet, name: str) -> None:
    while True:
        screen.prompt()
        line = await reader.line()
        screen.said()
        if line is None:  # end of input (Ctrl-D)
            if screen.interactive:
                screen.out.write("\n")
            return
        text = line.strip()
        if not text:
            continue
        if text.lower() in QUIT:
            return
        if commands.is_command(text):
            await commands.run(text)
            continue
        await pipeline.respond(Incoming(
            channel_id=LOCAL_CHANNEL_ID, guild_id=LOCAL_GUILD_ID, author_id=LOCAL_USER_ID,
            author_name=name, content=text, created_at=time.time(), moderator=True,  # the operator, at their terminal
            place=f"You are talking with {name} in a terminal on their computer, not on Discord."), outlet)
