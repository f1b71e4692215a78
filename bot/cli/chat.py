"""`muninn chat`: talk to Muninn in a terminal, through the same pipeline as on Discord.

You are one local user in one local room (guild 0, channel 0), so what Muninn learns
here stays here: it is stored as your personal memories of that room. Type /quit
(or press Ctrl-D) to leave; pending fact extraction finishes before the program ends.
"""
from __future__ import annotations

import asyncio
import getpass
import sys
import time
from typing import TextIO

from bot.conversation.pipeline import Incoming, Pipeline, Sent, no_typing
from bot.memory.engine import Engine
from bot.settings import Settings

LOCAL_USER_ID = 1
LOCAL_CHANNEL_ID = 0
LOCAL_GUILD_ID = 0
QUIT = {"/quit", "/exit", "/q"}
HELP = "Talking to Muninn locally. Type a message and press Enter; /quit or Ctrl-D leaves."


class TerminalOutlet:
    def __init__(self, out: TextIO):
        self.out = out

    def typing(self):
        return no_typing()

    async def send(self, text: str) -> list[Sent]:
        print(f"muninn> {text}", file=self.out, flush=True)
        return [Sent(None, time.time())]


def local_name() -> str:
    try:
        return getpass.getuser() or "you"
    except (KeyError, OSError):  # no passwd entry (containers)
        return "you"


async def run_chat(settings: Settings, *, stdin: TextIO | None = None, stdout: TextIO | None = None,
                   extractor_factory=None) -> int:
    stdin = stdin or sys.stdin
    stdout = stdout or sys.stdout
    interactive = stdin.isatty()
    name = local_name()
    async with Engine(settings) as engine:
        extractor = None
        if settings.extraction:
            if extractor_factory is None:
                from bot.lifecycle.extractor import Extractor
                extractor_factory = Extractor
            extractor = extractor_factory(engine)
        pipeline = Pipeline(engine, extractor)
        outlet = TerminalOutlet(stdout)
        if interactive:
            print(HELP, file=stdout, flush=True)
        try:
            while True:
                if interactive:
                    print("you> ", end="", file=stdout, flush=True)
                line = await asyncio.to_thread(stdin.readline)
                if not line:  # end of input
                    break
                text = line.strip()
                if not text:
                    continue
                if text in QUIT:
                    break
                await pipeline.respond(Incoming(
                    channel_id=LOCAL_CHANNEL_ID, guild_id=LOCAL_GUILD_ID, author_id=LOCAL_USER_ID,
                    author_name=name, content=text, created_at=time.time(),
                    place=f"You are talking with {name} in a terminal on their computer."), outlet)
        finally:
            if extractor is not None:
                await extractor.close()
    return 0
