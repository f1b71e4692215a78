"""`muninn chat`: talk to Muninn in a terminal, through the same pipeline as on Discord.

You are one local user in one local room (guild 0, channel 0), so what Muninn learns
here stays here: it is stored as your personal memories of that room. Lines starting with
a command word are handled locally (`/help` lists them, chat_commands.py), never sent to the model.

On a terminal (chat_terminal.py) the input line can be edited and its history recalled with
the arrow keys; Muninn's replies, notices and log lines (WARNING and up, unless -v) appear
above it without disturbing what is being typed; "muninn is thinking" shows until the first
words, then the reply as Ollama writes it (MUNINN_STREAM_REPLIES). Ollama is checked at
the start and one line says what to fix. Piped input or output (chat_piped.py) gets whole lines.

Ctrl-D or /quit first saves the facts waiting for extraction, for at most
MUNINN_SHUTDOWN_SECONDS; Ctrl-C leaves after at most INTERRUPT_SAVE_SECONDS of that. Either
way, one line says what was saved and what was dropped, when anything was. With --log-file,
every log line goes to that file.
"""
from __future__ import annotations

import asyncio
import getpass
import inspect
import logging
import sys
import time
from pathlib import Path
from typing import TextIO

from bot import redact
from bot.cli.chat_commands import (
    CHAT_COMMANDS,
    LOCAL_CHANNEL_ID,
    LOCAL_GUILD_ID,
    LOCAL_USER_ID,
    QUIT,
    VIEWER,
    Commands,
    Console,
)
from bot.cli.chat_piped import PipedConsole
from bot.cli.output import plural
from bot.conversation.outlets import ForgetOffer, ReplyStream, Sent
from bot.conversation.pipeline import Incoming, Pipeline
from bot.llm.errors import OllamaDisabled, OllamaError
from bot.llm.servers import missing_models, parts_of, server_name
from bot.memory.engine import Engine
from bot.settings import Settings

__all__ = ["LOCAL_CHANNEL_ID", "LOCAL_GUILD_ID", "LOCAL_USER_ID", "SLOW_DOWN", "VIEWER", "local_name", "run_chat"]

INTERRUPT_SAVE_SECONDS = 2.0   # Ctrl-C: how long facts waiting for extraction may still take
CHECK_SECONDS = 5.0            # the start's look at Ollama
STOP_TRIES = 6                 # cancellations of the conversation, half a second apart, when leaving
SLOW_DOWN = ("muninn> (You are writing faster than I answer one person: I keep this message but do not "
             "answer it. Wait a few seconds.)")  # at most once a minute (bot/conversation/rate.py)


class AbovePrompt(logging.Handler):
    """The log handler of `muninn chat` on a terminal: each record is one line above the input line."""

    def __init__(self, console: Console):
        super().__init__()
        self.console = console
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        """Print the record above the input line; a failure to print goes to `handleError`, not to the caller."""
        try:
            self.console.line(self.format(record))
        except Exception:
            self.handleError(record)


class TerminalOutlet:
    """The pipeline's outlet in `muninn chat`: replies are printed on the console, notices name the
    chat's own commands, and a request to forget is confirmed by the next line typed."""

    commands = CHAT_COMMANDS

    def __init__(self, console: Console):
        self.console = console

    def typing(self):
        """"muninn is thinking" on a terminal until the first words of the reply; nothing when piped."""
        return self.console.thinking()

    async def send(self, text: str) -> list[Sent]:
        """Print the reply as one `muninn>` line; returns one Sent without a message id."""
        self.console.line(f"muninn> {text}")
        return [Sent(None, time.time())]

    async def slow_down(self) -> None:
        """One short line: this message is kept but not answered (the author is over MUNINN_RATE_PER_MINUTE)."""
        self.console.line(SLOW_DOWN)

    def stream(self) -> ReplyStream | None:
        """Replies are streamed on a terminal; piped output gets whole lines (scripts read them)."""
        return self.console.stream()

    async def confirm_forget(self, offer: ForgetOffer) -> list[Sent]:
        """The text fallback of Discord's buttons: list the matches, then ask yes or no."""
        self.console.line(f"muninn> {offer.intro}")
        for memory in offer.memories:
            self.console.line(f"  #{memory.id} {memory.text}")
        self.console.line("Forget " + ("it" if len(offer.memories) == 1 else "them") + "? (yes/no)")
        answer = await self.console.read()
        if answer is not None and answer.strip().lower() in ("y", "yes"):
            removed = await offer.forget()
            self.console.line(f"muninn> Forgotten: {plural(removed, 'memory', 'memories')}.")
        else:
            self.console.line("muninn> Kept: nothing was forgotten.")
        return [Sent(None, time.time())]


async def _server_problem(engine: Engine) -> str | None:
    """ollama_problem for OpenAI-compatible servers, or chat and embeddings on different ones."""
    try:
        missing = await asyncio.wait_for(
            missing_models(engine.ollama, engine.settings.chat_model, engine.settings.embed_model), CHECK_SECONDS)
    except (OllamaError, asyncio.TimeoutError) as exc:
        cause = str(exc) or type(exc).__name__
        return (f"{server_name(engine.ollama)} did not answer ({cause}): start it, or fix MUNINN_CHAT_URL / "
                "MUNINN_EMBED_URL / OLLAMA_URL. Muninn answers once it is up; the local commands work meanwhile.")
    return "; ".join(str(problem) for problem in missing) or None


def local_name() -> str:
    """The login name Muninn calls you by when --name is not given; "you" when there is none."""
    try:
        return getpass.getuser() or "you"
    except (KeyError, OSError):  # no passwd entry (containers)
        return "you"


async def ollama_problem(engine: Engine, settings: Settings) -> str | None:
    """One line saying what keeps Ollama from answering here, and what to do; None when it is ready."""
    if not engine.ollama.enabled:
        return ("No OLLAMA_URL is set, so Muninn cannot answer: set it in .env "
                "(for example OLLAMA_URL=http://localhost:11434). The local commands work meanwhile.")
    parts = parts_of(engine.ollama)
    if len(parts) > 1 or parts[0][0].SERVER != "Ollama":
        return await _server_problem(engine)
    try:
        names = await asyncio.wait_for(parts[0][0].model_names(), CHECK_SECONDS)
    except (OllamaError, asyncio.TimeoutError) as exc:
        if isinstance(exc, OllamaDisabled):
            return str(exc)
        return (f"Ollama is not answering at {settings.shown('ollama_url')}: start it with `ollama serve` "
                "(or fix OLLAMA_URL). Muninn answers once it is up; the local commands work meanwhile.")
    missing = [model for model in dict.fromkeys((settings.chat_model, settings.embed_model))
               if not {model, f"{model}:latest"} & set(names)]
    if not missing:
        return None
    pulls = " && ".join(f"ollama pull {model}" for model in missing)
    effect = ("Muninn cannot answer" if settings.chat_model in missing else "recall finds memories by their words only")
    return f"Ollama has no {' and no '.join(missing)}, so {effect} until you pull the model: {pulls}"


def _route_logs(console: Console, log_file: str | None, verbose: bool) -> list[logging.Handler]:
    """On a terminal, log lines go above the input line (WARNING and up unless -v); with a log
    file, every line at the configured level goes there too. Returns the handlers this replaced."""
    root = logging.getLogger()
    replaced = list(root.handlers)
    if not console.interactive and not log_file:
        return replaced
    for handler in replaced:
        root.removeHandler(handler)
    if console.interactive:
        above = AbovePrompt(console)
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


def _console(stdin: TextIO, stdout: TextIO) -> Console:
    """The terminal's console when both ends are a terminal, else whole lines."""
    if stdin.isatty() and stdout.isatty():
        from bot.cli.chat_terminal import TerminalConsole  # prompt_toolkit: only for a terminal
        return TerminalConsole()
    return PipedConsole(stdin, stdout)


async def run_chat(settings: Settings, *, stdin: TextIO | None = None, stdout: TextIO | None = None,
                   extractor_factory=None, name: str | None = None, log_file: str | None = None,
                   verbose: bool = False) -> int:
    """`muninn chat` on the running event loop until /quit or end of input (0), or Ctrl-C on a
    terminal (130); the module docstring says what leaving saves. A cancellation (a SIGINT when
    piped) saves for INTERRUPT_SAVE_SECONDS at most and is raised again. `stdin`, `stdout` and
    `extractor_factory` default to the process's streams and bot.lifecycle's `Extractor`."""
    console = _console(stdin or sys.stdin, stdout or sys.stdout)
    name = (name or "").strip() or local_name()
    async with console:
        replaced = _route_logs(console, log_file, verbose)
        try:
            async with Engine(settings) as engine:
                extractor = None
                if settings.extraction:
                    if extractor_factory is None:
                        from bot.lifecycle.extractor import Extractor
                        extractor_factory = Extractor
                    extractor = extractor_factory(engine)
                pipeline = Pipeline(engine, extractor)
                commands = Commands(engine, pipeline, console)
                if console.interactive:
                    console.line(f"Talking to Muninn as {name} (--name changes it). /help lists the local commands; "
                                 "/quit or Ctrl-D leaves.")
                    problem = await ollama_problem(engine, settings)
                    if problem:
                        console.line(problem)
                conversation = asyncio.get_running_loop().create_task(
                    _converse(console, commands, pipeline, TerminalOutlet(console), name))
                interrupt = asyncio.get_running_loop().create_task(console.interrupted.wait())
                try:
                    await asyncio.wait([conversation, interrupt], return_when=asyncio.FIRST_COMPLETED)
                except asyncio.CancelledError:  # a SIGINT: leave soon, whatever is still waiting is dropped
                    await _stop(conversation, interrupt)
                    await _leave(extractor, console, min(INTERRUPT_SAVE_SECONDS, settings.shutdown_seconds))
                    raise
                interrupted = console.interrupted.is_set()
                await _stop(conversation, interrupt)
                if not interrupted:
                    conversation.result()  # a failure of the conversation itself is raised here
                await _leave(extractor, console, min(INTERRUPT_SAVE_SECONDS, settings.shutdown_seconds)
                             if interrupted else settings.shutdown_seconds)
        finally:
            _restore_logs(replaced)
    return 130 if interrupted else 0


async def _stop(*tasks: asyncio.Task) -> None:
    """Cancel the tasks and wait for them, a few seconds at most. A cancellation can be lost
    underneath (a library that turns it into a timeout it then handles), so it is repeated."""
    for _ in range(STOP_TRIES):
        running = [task for task in tasks if not task.done()]
        if not running:
            break
        for task in running:
            task.cancel()
        await asyncio.wait(running, timeout=0.5)
    for task in tasks:
        if task.done() and not task.cancelled():
            task.exception()  # retrieved: the reason to stop was given already


async def _leave(extractor, console: Console, timeout: float) -> None:
    """Close the extractor, waiting at most `timeout` s for the facts still waiting, and say
    (on a terminal) what was saved and what was dropped, when anything was."""
    if extractor is None:
        return
    waiting = getattr(extractor, "waiting", 0)
    if waiting and console.interactive and timeout > 0:
        console.line(f"Saving what Muninn learned from {plural(waiting, 'message')} (up to {timeout:g} s)…")
    takes = inspect.signature(extractor.close).parameters
    if "report" in takes:  # the chat says what was dropped itself, in plainer words
        await extractor.close(timeout=timeout, report=not console.interactive)
    elif "timeout" in takes:
        await extractor.close(timeout=timeout)
    else:  # an extractor that takes no bound
        await extractor.close()
    stored, dropped = getattr(extractor, "stored", 0), getattr(extractor, "dropped", 0)
    if console.interactive and stored:
        console.line(f"Saved {plural(stored, 'memory', 'memories')} from this conversation: "
                     f"/memories lists {'it' if stored == 1 else 'them'} next time.")
    if console.interactive and dropped:
        last = "message" if dropped == 1 else f"{dropped} messages"
        console.line(f"Not saved: what Muninn was still learning from your last {last} (it did not finish in time).")


async def _converse(console: Console, commands: Commands, pipeline: Pipeline, outlet: TerminalOutlet,
                    name: str) -> None:
    while True:
        line = await console.read()
        if line is None:  # end of input (Ctrl-D)
            return
        text = line.strip()
        if not text:
            continue
        if text.lower() in QUIT:
            return
        if commands.is_command(text):
            await commands.run(text)
            continue
        said_at = time.time()
        reply = await pipeline.respond(Incoming(
            channel_id=LOCAL_CHANNEL_ID, guild_id=LOCAL_GUILD_ID, author_id=LOCAL_USER_ID,
            author_name=name, content=text, created_at=said_at, moderator=True,  # the operator, at their terminal
            place=f"You are talking with {name} in a terminal on their computer, not on Discord."), outlet)
        if reply is not None:
            commands.last = (text, said_at, reply)
