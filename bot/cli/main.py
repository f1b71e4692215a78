"""The `muninn` command line: operators, scripts and our own checks use it, so keep it stable.

Each subcommand is a `cmd_*` coroutine taking (args, settings); `build_parser` wires
them. Bad input exits with status 2 and one line on stderr; nothing is lost. An import
or a recall batch with some bad lines runs the good ones and exits with status 3.
"""
from __future__ import annotations

import argparse
import asyncio
import io
import logging
import os
import sys
import traceback
from pathlib import Path
from typing import Awaitable, Callable, Protocol, TypeVar

from rich.text import Text

from bot import redact, validate
from bot.cli import backup, invite, migrate, users, web
from bot.cli.args import OneLineParser, UsageError, add_command, importance, positive_int, recall_limit, snowflake
from bot.cli.importer import import_lines
from bot.cli.output import emit, key_values, lines, plural, status, table, write
from bot.cli.progress import Progress
from bot.cli.recall import SOME_LINES_BAD, cmd_recall
from bot.memory import records
from bot.memory.engine import Engine
from bot.memory.scope import SCOPES
from bot.memory.sqlite import files
from bot.settings import Settings, SettingsError, load_settings, new_database_notice

log = logging.getLogger("muninn")
T = TypeVar("T")

__all__ = ["SOME_LINES_BAD", "UsageError", "build_parser", "main"]


def visible_to(memory: records.NewMemory) -> str:
    """Who will see a memory, by the scope rule (bot/memory/scope.py), in words."""
    if memory.scope == "global":
        return "everyone, everywhere"
    if memory.scope == "room":
        return f"everyone in channel {memory.channel_id}"
    if memory.guild_id is None:
        return (f"user {memory.owner_id} in their DMs with Muninn only (learned in a DM; "
                "--guild ID makes it a memory of that server)")
    return f"user {memory.owner_id} in server {memory.guild_id} and in their DMs with Muninn"


# -- subcommands -------------------------------------------------------------

async def cmd_remember(args, settings: Settings) -> int:
    """`muninn remember`: store one memory and say its id and who sees it (with --json, the id and
    whether it got a vector); returns 0. UsageError when a value is refused."""
    try:
        memory = records.NewMemory(text=args.text, scope=args.scope, owner_id=args.user, channel_id=args.channel,
                                 guild_id=args.guild, importance=args.importance,
                                 standing=records.SET if args.scope == "room" else None)  # the operator's word
    except ValueError as exc:  # validate.Invalid included: a lone surrogate from a bad terminal byte
        raise UsageError(str(exc)) from None
    async with Engine(settings, warm=False) as engine:
        memory_id = await engine.remember(memory)
        embedded = (await engine.get(memory_id)).embedded
    said = f"Remembered #{memory_id} ({memory.scope}), visible to {visible_to(memory)}."
    if not embedded:
        said += " It has no vector yet (the embedding server is off or did not answer): `muninn maintain` adds it."
    emit(args, {"id": memory_id, "embedded": embedded}, Text(said))
    return 0


async def cmd_import(args, settings: Settings) -> int:
    """`muninn import FILE`: import the file with a progress bar, each bad line on stderr, then print
    the counts (and how many memories still await vectors); returns SOME_LINES_BAD when a line was bad, else 0."""
    path = Path(args.file)
    if not path.is_file():
        raise UsageError(f"no file {str(path)!r}")
    with path.open("rb") as lines:
        total = sum(1 for line in lines if line.strip())
    async with Engine(settings, warm=False) as engine:
        with Progress("importing", total) as bar, path.open("rb") as lines:
            report = await import_lines(engine, lines, on_progress=bar.advance)
        missing = (await engine.stats())["missing_vectors"]
    for number, error in report.errors:
        write(f"line {number}: {error}", stream=sys.stderr)
    data = {"imported": report.imported, "skipped_existing": report.skipped_existing,
            "errors": [{"line": n, "error": e} for n, e in report.errors], "missing_vectors": missing}
    human = (f"imported {report.imported}, skipped {report.skipped_existing} already present, "
             f"{plural(len(report.errors), 'bad line')}")
    if missing:
        human += (f"; {plural(missing, 'memory', 'memories')} await embeddings (embedding server unavailable?): "
                  "run `muninn maintain` later")
    emit(args, data, Text(human))
    return SOME_LINES_BAD if report.errors else 0


async def cmd_stats(args, settings: Settings) -> int:
    """`muninn stats`: print the engine's counts and where the database is; returns 0."""
    async with Engine(settings, warm=False) as engine:
        data = await engine.stats()
        data["database"] = engine.storage.where()
    emit(args, data, key_values(data))
    return 0


async def cmd_reindex(args, settings: Settings) -> int:
    """`muninn reindex`: re-embed every active memory with OLLAMA_EMBED_MODEL (progress on stderr),
    then print how many; returns 0. When Ollama cannot embed, its error is raised before any vector is dropped."""
    async with Engine(settings, warm=False) as engine:
        bar = Progress(f"embedding with {settings.embed_model}", None)

        def progress(done: int, total: int) -> None:
            bar.total = total
            bar.update(done)
        count = await engine.reindex(progress=progress)
        bar.finish()
    emit(args, {"reindexed": count, "model": settings.embed_model},
         Text(f"re-embedded {plural(count, 'memory', 'memories')} with {settings.embed_model}"))
    return 0


async def cmd_doctor(args, settings: Settings) -> int:
    """`muninn doctor`: print each check, with its fix when it failed; returns 0 when every check
    passed, else 1."""
    from bot.cli.doctor import run_doctor
    checks = await run_doctor(settings, fix=args.fix)
    rows = [(status(c.ok), c.name, c.detail + (f"\nfix: {c.fix}" if c.fix else "")) for c in checks]
    human = table(("", "check", "detail"), rows, styles=("", "bold", ""))
    emit(args, {"ok": all(c.ok for c in checks), "checks": [c.to_dict() for c in checks]}, human)
    return 0 if all(c.ok for c in checks) else 1


TOKEN_HELP = ("create a bot at https://discord.com/developers/applications, enable its Message Content intent "
              "(Bot > Privileged Gateway Intents), and put its token in .env as DISCORD_TOKEN=...")


def discord_token_problem(settings: Settings) -> str | None:
    """The line to print when DISCORD_TOKEN is empty, saying how to get one; None when there is a token."""
    if not settings.discord_token.strip():
        return f"muninn: no DISCORD_TOKEN: {TOKEN_HELP}"
    return None


class DiscordAdapter(Protocol):
    """What the command line needs from the Discord adapter (`cogs.adapter`)."""
    StartupError: type[Exception]

    async def run_bot(self, settings: Settings) -> None:
        """Run the bot until it is stopped; StartupError when Discord turns it away."""

    async def sync_commands(self, settings: Settings, guild_id: int | None = None) -> list[str]:
        """Register the slash commands and message menus globally, or in one guild; returns their names
        as people find them ("/memory", "Remember this (message menu)")."""


async def on_discord(args, settings: Settings, action: Callable[[DiscordAdapter], Awaitable[T]]) -> tuple[int, T | None]:
    """Run `action(adapter)` (discord.py is loaded only here), or say in one line why not.
    Returns (exit status, the action's result)."""
    command = args.command
    problem = discord_token_problem(settings)
    if problem:
        print(problem, file=sys.stderr)
        return 1, None
    if args.load_discord is None:
        print(f"muninn {command}: this entry point has no Discord adapter; start the bot with the `muninn` command",
              file=sys.stderr)
        return 2, None
    client = args.load_discord()
    try:
        return 0, await action(client)
    except client.StartupError as exc:
        print(f"muninn {command}: {exc}", file=sys.stderr)
        return 1, None


async def cmd_run(args, settings: Settings) -> int:
    """`muninn run` (and plain `muninn`): run the Discord bot until it is stopped; returns the status
    of `on_discord`."""
    status, _ = await on_discord(args, settings, lambda client: client.run_bot(settings))
    return status


async def cmd_sync(args, settings: Settings) -> int:
    """`muninn sync`: register the slash commands with Discord and print their names; returns 0, or
    the status of `on_discord` when they could not be registered."""
    status, names = await on_discord(args, settings, lambda client: client.sync_commands(settings, args.guild))
    if status or names is None:
        return status
    where = f"to guild {args.guild} (usable now)" if args.guild else "globally (Discord may take up to an hour)"
    emit(args, {"synced": names, "guild": args.guild},
         Text(f"synced {plural(len(names), 'command')} {where}: " + ", ".join(names)))
    return 0


async def cmd_chat(args, settings: Settings) -> int:
    """`muninn chat`: talk to Muninn in this terminal (bot/cli/chat.py); returns 0."""
    from bot.cli.chat import run_chat
    return await run_chat(settings, name=args.name, log_file=args.log_file, verbose=args.verbose)


async def cmd_maintain(args, settings: Settings) -> int:
    """`muninn maintain`: one maintenance run, printing each step as it ends (not with --json) and
    then how long it took; --archived lists archived memories, --restore brings one back. Returns 0;
    UsageError when another process is maintaining, or the memory to restore is missing or not archived."""
    from bot.lifecycle import maintenance
    async with Engine(settings, warm=False) as engine:
        if args.restore is not None:
            try:
                memory = await engine.get(args.restore)
            except records.MemoryNotFound as exc:
                raise UsageError(str(exc)) from None
            if memory.archived_at is None:
                raise UsageError(f"memory #{memory.id} is not archived")
            await engine.restore(memory.id)
            emit(args, {"restored": memory.id}, Text(f"restored #{memory.id}: {memory.text}"))
            return 0
        if args.archived:
            memories, total = await maintenance.archived(engine, reason=args.reason, limit=args.limit or 50)
            rows = [(f"#{m.id}", m.scope, m.text, m.archive_reason, records.iso(m.archived_at)) for m in memories]
            head = Text(plural(total, "archived memory", "archived memories")
                        + (f" (newest {len(memories)})" if len(memories) < total else ""))
            human = lines(head, table(("id", "scope", "memory", "why", "archived"), rows, styles=("cyan",))) \
                if rows else head
            emit(args, {"total": total, "memories": [m.to_dict() for m in memories]}, human)
            return 0
        # Each step commits as it goes and prints when done, so an interrupted run keeps (and shows) its work.
        try:
            report = await maintenance.run_with_lease(
                engine, use_llm=not args.no_llm, on_step=None if args.json else lambda line: print(line, flush=True))
        except maintenance.MaintenanceBusy as exc:
            raise UsageError(str(exc)) from None
    emit(args, report.to_dict(), Text(f"done in {report.seconds:.1f} s"))
    return 0


# -- parser ------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    """The parser of every subcommand: each sets `handler` to its `cmd_*` coroutine (and `no_json`
    to why it refuses --json, if it does), has a help text and examples; --db, --json and -v are
    taken before or after the subcommand."""
    common = OneLineParser(add_help=False)
    # SUPPRESS: a subcommand's unset option must not overwrite one given before the subcommand.
    common.add_argument("--db", metavar="PATH", default=argparse.SUPPRESS,
                        help="database file (default: MUNINN_DB_PATH or data/muninn.db)")
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                        help="print the result as JSON, for scripts")
    common.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                        help="debug logging, and a failure's whole traceback")

    parser = OneLineParser(prog="muninn", parents=[common], description="Muninn: a Discord bot that remembers.",
                           epilog="examples:\n  muninn doctor\n  muninn chat\n  muninn recall 'where do I live' "
                                  "--user 42\n\nmuninn COMMAND --help says more about each command.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", help="what to do (default: run)")

    def command(name: str, handler, summary: str, *examples: str, no_json: str | None = None):
        return add_command(sub, common, name, handler, summary, *examples, no_json=no_json)

    p = command("remember", cmd_remember, "store a memory, and say who will see it",
                "remember 'Oz prefers dark mode' --scope personal --user 42 --guild 5",
                "remember 'the wiki is at wiki.example.org' --scope room --channel 7 --guild 5")
    p.add_argument("text", help="the memory, one sentence")
    p.add_argument("--scope", choices=SCOPES, required=True,
                   help="personal: one person's; room: a channel's; global: everyone's")
    p.add_argument("--user", type=snowflake, metavar="ID", help="owner (personal) or author user id")
    p.add_argument("--channel", type=snowflake, metavar="ID", help="channel id (required for room scope)")
    p.add_argument("--guild", type=snowflake, metavar="ID",
                   help="server id where it was learned (omit it for a memory learned in a DM)")
    p.add_argument("--importance", type=importance, default=0.5, metavar="0..1",
                   help="how much it matters, from 0 to 1 (default 0.5)")

    p = command("recall", cmd_recall, "what Muninn would recall for a query, and why",
                "recall 'where do I live' --user 42", "recall 'GPU' --user 42 --channel 7 --guild 5 --no-touch",
                "recall --batch queries.jsonl")
    p.add_argument("query", nargs="?", help="the words to recall for (not with --batch)")
    p.add_argument("--user", type=snowflake, metavar="ID",
                   help="whose view; alone, their DM view (their personal memories from everywhere)")
    p.add_argument("--channel", type=snowflake, metavar="ID", help="the channel the viewer is in")
    p.add_argument("--guild", type=snowflake, metavar="ID", help="the server of that channel")
    p.add_argument("--dm", action="store_true", help="the viewer is in a DM with Muninn")
    p.add_argument("--limit", type=recall_limit, metavar="N", help=f"at most N memories (1 to {validate.MAX_RECALL_LIMIT})")
    p.add_argument("--as-of", metavar="ISO-TIME", help="evaluate at this time (decay, touch, newer memories hidden)")
    p.add_argument("--no-touch", action="store_true", help="inspect only: do not count this as a recall")
    p.add_argument("--batch", metavar="FILE.jsonl", help="one query object a line, one JSON result a line")

    p = command("import", cmd_import, "import memories from a JSON-lines file", "import memories.jsonl")
    p.add_argument("file", metavar="FILE.jsonl", help="one memory object a line (docs/lifecycle.md)")

    command("stats", cmd_stats, "counts of memories, vectors and links", "stats", "stats --json")
    command("reindex", cmd_reindex, "re-embed every memory with OLLAMA_EMBED_MODEL", "reindex")

    p = command("doctor", cmd_doctor, "check the database, sqlite-vec and the LLM servers", "doctor", "doctor --fix")
    p.add_argument("--fix", action="store_true",
                   help="also clamp nonsense stored values and make the database files private")

    command("run", cmd_run, "start the Discord bot (the default with no COMMAND)", "run",
            no_json="the bot runs until it is stopped and prints log lines, not a result")

    p = command("sync", cmd_sync, "register the slash commands with Discord", "sync --guild 5", "sync")
    p.add_argument("--guild", type=snowflake, metavar="ID",
                   help="only in this server (instant; global sync can take an hour)")

    p = command("chat", cmd_chat, "talk to Muninn in this terminal, without Discord", "chat", "chat --name Kari",
                no_json="chat is a conversation for people; use `muninn recall --json` for results")
    p.add_argument("--name", help="what Muninn calls you (default: your login name)")
    p.add_argument("--log-file", metavar="PATH", help="write every log line to this file")

    p = command("maintain", cmd_maintain,
                "archive faded memories, embed, link and consolidate (idempotent, safe to interrupt)",
                "maintain", "maintain --archived --reason decayed", "maintain --restore 12")
    p.add_argument("--no-llm", action="store_true", help="consolidate by keeping the clearest original")
    p.add_argument("--archived", action="store_true", help="list archived memories instead (restorable)")
    p.add_argument("--reason", choices=["decayed", "superseded", "consolidated"], help="with --archived: only these")
    p.add_argument("--limit", type=positive_int, metavar="N", help="with --archived: how many (default 50)")
    p.add_argument("--restore", type=snowflake, metavar="ID", help="bring an archived memory back")

    migrate.add_parser(sub, common)
    backup.add_parser(sub, common)
    users.add_parser(sub, common)
    web.add_parser(sub, common)
    invite.add_parser(sub, common)
    return parser


def setup_logging(settings: Settings, verbose: bool) -> None:
    """Log to stderr at MUNINN_LOG_LEVEL (DEBUG with -v), with the configured secrets (token, URL
    passwords) and Discord's tokens redacted from every line (bot.redact)."""
    logging.basicConfig(level=logging.DEBUG if verbose else getattr(logging, settings.log_level),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    redact.remember(settings.secrets())
    redact.install()  # discord.py logs interaction URLs (with their tokens) at DEBUG


def main(argv: list[str] | None = None, load_discord: Callable[[], DiscordAdapter] | None = None) -> int:
    """The command line. `load_discord` plugs in the Discord adapter (see `cogs.launch`)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    args.load_discord = load_discord
    if args.command is None:  # plain `muninn` runs the bot
        args.command, args.handler = "run", cmd_run
        args.no_json = parser.parse_args(["run"]).no_json
    if getattr(args, "json", False) and getattr(args, "no_json", None):
        print(f"muninn {args.command}: --json is not for this command: {args.no_json} "
              f"(see muninn {args.command} --help)", file=sys.stderr)
        return 2
    try:
        overrides = {"db_path": args.db} if getattr(args, "db", None) else {}
        settings = load_settings(**overrides)
    except SettingsError as exc:
        print(f"muninn: setting error: {redact.redact(str(exc))}", file=sys.stderr)
        return 2
    args.verbose = getattr(args, "verbose", False)
    args.json = getattr(args, "json", False)
    setup_logging(settings, args.verbose)
    try:
        with files.announcing(lambda path: print(new_database_notice(path, settings.env_file), file=sys.stderr)):
            return asyncio.run(args.handler(args, settings))
    except UsageError as exc:
        print(f"muninn {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `muninn doctor --json | head`: the reader left, nothing more to say
        _quiet_stdout()
        return 141  # as a shell reports a command stopped by SIGPIPE
    except Exception as exc:  # one line for operators; the traceback only with -v
        from bot.llm.errors import OllamaError
        from bot.memory.errors import explain
        message = None if args.verbose else str(exc) if isinstance(exc, (OllamaError, SettingsError)) else explain(exc)
        if message is None:  # the traceback, as Python prints it, minus the secrets a driver's error may quote
            print(redact.redact("".join(traceback.format_exception(exc))), file=sys.stderr, end="", flush=True)
            return 1
        print(validate.replace_invalid(redact.redact(f"muninn {args.command}: {message}")), file=sys.stderr)
        return 1



def _quiet_stdout() -> None:
    """Point stdout at /dev/null: Python flushes it at exit, which would fail on the closed pipe again."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
        pass


if __name__ == "__main__":
    sys.exit(main())
