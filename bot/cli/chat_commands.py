"""The local commands of `muninn chat`: lines starting with a command word, handled here and never
sent to the model."""
from __future__ import annotations

import asyncio
from typing import AsyncContextManager, Protocol

from bot.cli.output import plural
from bot.conversation.outlets import CommandNames, ReplyStream
from bot.conversation.pipeline import Pipeline, Reply
from bot.memory.engine import Engine
from bot.memory.records import MemoryNotFound
from bot.memory.scope import Viewer

LOCAL_USER_ID = 1
LOCAL_CHANNEL_ID = 0
LOCAL_GUILD_ID = 0
VIEWER = Viewer(user_id=LOCAL_USER_ID, channel_id=LOCAL_CHANNEL_ID, guild_id=LOCAL_GUILD_ID)
QUIT = {"/quit", "/exit", "/q"}
# What the pipeline's notices call these commands here (it names Discord's elsewhere).
CHAT_COMMANDS = CommandNames(resume="/resume", forget_all="/forget-all", list="/memories")
HELP = """Local commands (never sent to the model):
  /memories        what Muninn remembers that you can see here
  /search TEXT     what Muninn would recall for TEXT, and why (counts as no recall)
  /why             why the last reply recalled what it did
  /forget ID       forget one of your memories
  /forget-all      forget everything Muninn remembers about you (asks first)
  /pause, /resume  stop or restart Muninn remembering what you say
  /help            this list
  /quit            leave (Ctrl-D too; Ctrl-C leaves without waiting long)
The arrow keys bring back what you typed before. You can also say "forget that I live in Oslo":
Muninn shows what matches and asks first."""
VIA = {"fts": "shares words with your message", "vector": "close in meaning to your message",
       "both": "shares words with your message and is close in meaning"}


class Console(Protocol):
    """Where the chat prints and reads (chat_terminal.TerminalConsole, chat_piped.PipedConsole)."""

    interactive: bool
    interrupted: asyncio.Event     # set by Ctrl-C on a terminal

    async def __aenter__(self) -> "Console": ...

    async def __aexit__(self, *exc: object) -> None: ...

    def line(self, text: str) -> None:
        """Print one line (above the input line, on a terminal)."""

    async def read(self) -> str | None:
        """The next line of input; None once input ended."""

    def thinking(self) -> AsyncContextManager:
        """A block during which the console shows that Muninn is thinking."""

    def stream(self) -> ReplyStream | None:
        """Where a reply is shown while it is written; None: printed whole."""


def why(reason: dict) -> str:
    """A recall's reason for one memory, in words."""
    if reason.get("via") == "link":
        return f"linked to a memory that matched ({reason.get('link')})"
    said = VIA.get(reason.get("via", ""), "matched your message")
    if "cosine" in reason and reason.get("via") != "fts":
        said += f" (similarity {reason['cosine']:.2f})"
    if "neighbour_of" in reason:
        said += f"; learned right around #{reason['neighbour_of']}, which matched"
    return said


class Commands:
    """The local commands of `muninn chat`; `last` is the last reply and what it answered (for /why)."""

    def __init__(self, engine: Engine, pipeline: Pipeline, console: Console):
        self.engine, self.pipeline, self.console = engine, pipeline, console
        self.last: tuple[str, float, Reply] | None = None   # (what was said, when, the reply)

    @staticmethod
    def is_command(text: str) -> bool:
        """Whether the line starts with a command word: a slash then letters (and inner dashes) only;
        anything else goes to the model. `text` must not be blank."""
        word = text.split(maxsplit=1)[0]
        return word.startswith("/") and word[1:].replace("-", "a").isalpha() and not word.endswith("-")

    async def run(self, text: str) -> None:
        """Run the command word of the line (any case) with the rest as its argument; an unknown
        word gets one line pointing at /help."""
        word, _, rest = text.partition(" ")
        rest = rest.strip()
        handler = {"/help": self.help, "/memories": self.memories, "/search": self.search, "/why": self.why,
                   "/forget": self.forget, "/forget-all": self.forget_all, "/pause": self.pause,
                   "/resume": self.resume}.get(word.lower())
        if handler is None:
            self.console.line(f"unknown command {word}; /help lists them")
            return
        await handler(rest)

    async def help(self, rest: str) -> None:
        """/help: print the list of local commands."""
        self.console.line(HELP)

    async def memories(self, rest: str) -> None:
        """/memories: how many active memories you can see here, then the newest of them with their ids and scopes."""
        memories, total = await self.engine.list_visible(VIEWER, limit=50)
        if not total:
            self.console.line("Muninn remembers nothing you can see here yet.")
            return
        self.console.line(f"{plural(total, 'memory', 'memories')} you can see here"
                          + (" (newest 50)" if total > 50 else "") + ":")
        for memory in memories:
            self.console.line(f"  #{memory.id} [{memory.scope}] {memory.text}")

    async def search(self, rest: str) -> None:
        """/search TEXT: what a recall for TEXT would bring and why; it does not count as a recall."""
        if not rest:
            self.console.line("usage: /search TEXT")
            return
        result = await self.engine.recall(rest, VIEWER, touch=False)
        self.console.line(f"{result.mode} (vectors: {result.vector_status}), "
                          f"{plural(len(result.memories), 'memory', 'memories')}:")
        for rank, recalled in enumerate(result.memories, start=1):
            reason = recalled.candidate.reason()
            self.console.line(f"  {rank}. #{recalled.memory.id} [{recalled.memory.scope}] {recalled.memory.text}"
                              f"  (via {reason['via']})")

    async def why(self, rest: str) -> None:
        """/why: the memories the last reply was given, each with why recall chose it (recall run
        again as it was then: nothing is touched, newer memories are left out)."""
        if self.last is None or self.last[2].prompt is None:
            self.console.line("No reply yet to explain: /why tells why the last reply recalled what it did.")
            return
        said, at, reply = self.last
        assert reply.prompt is not None
        given = reply.prompt.memories
        quoted = said if len(said) <= 60 else said[:59].rstrip() + "…"
        if not given:
            self.console.line(f"The last reply recalled nothing: no memory you can see here matched “{quoted}”.")
            return
        result = await self.engine.recall(said, VIEWER, touch=False, as_of=at)
        found = {recalled.memory.text: recalled for recalled in result.memories}
        self.console.line(f"The last reply recalled {plural(len(given), 'memory', 'memories')} for “{quoted}”:")
        for text in given:
            recalled = found.get(text)
            if recalled is None:  # forgotten or changed since
                self.console.line(f"  {text}: no longer recalled for these words")
            else:
                self.console.line(f"  #{recalled.memory.id} {text}: {why(recalled.candidate.reason())}")

    async def forget(self, rest: str) -> None:
        """/forget ID: delete one of your own memories (personal, or a room memory you taught) and scrub
        it at once; an id that is not yours gets the same answer as one that does not exist."""
        if not rest.lstrip("#").isdigit():
            self.console.line("usage: /forget ID (the number /memories shows)")
            return
        memory_id = int(rest.lstrip("#"))
        try:
            memory = await self.engine.own_memory(LOCAL_USER_ID, memory_id)
        except MemoryNotFound:
            self.console.line(f"No memory #{memory_id} of yours.")
            return
        await self.engine.forget([memory.id], scrub=True)
        self.console.line(f"Forgot #{memory.id}: {memory.text}")

    async def forget_all(self, rest: str) -> None:
        """/forget-all: after a typed yes, forget everything about you (as /memory forget-all on Discord)."""
        self.console.line("This forgets everything Muninn remembers about you and your messages in its history. "
                          "It cannot be undone. Forget everything? (yes/no)")
        answer = await self.console.read()
        if answer is None or answer.strip().lower() not in ("y", "yes"):
            self.console.line("Kept: nothing was forgotten.")
            return
        gone = await self.pipeline.forget_person(LOCAL_USER_ID)
        self.last = None
        self.console.line(f"Forgot everything: {plural(gone.personal + gone.taught, 'memory', 'memories')} "
                          f"and {plural(gone.messages, 'message')}.")

    async def pause(self, rest: str) -> None:
        """/pause: keep nothing of what you say from now on (the messages waiting for extraction included)."""
        changed = await self.pipeline.pause(LOCAL_USER_ID)
        self.console.line("Paused: Muninn keeps nothing of what you say until /resume." if changed
                          else "Already paused; /resume turns memory back on.")

    async def resume(self, rest: str) -> None:
        """/resume: keep what you say again; says so, or that memory was not paused."""
        changed = await self.pipeline.resume(LOCAL_USER_ID)
        self.console.line("Resumed: Muninn remembers what you say again." if changed else "Memory was not paused.")
