"""The `muninn` command line: operators, scripts and our own checks use it, so keep it stable.

Each subcommand is a `cmd_*` coroutine taking (args, settings); `build_parser` wires
them. Bad input exits with status 2 and one line on stderr; nothing is lost. An import
or a recall batch with some bad lines runs the good ones and exits with status 3.
"""
from __future__ import annotations

import argparse
import asyncio
import io
import json
import logging
import os
import sys
import traceback
from pathlib import Path
from typing import Awaitable, Callable, Protocol, TypeVar

from bot import redact, validate
from bot.cli import migrate, users
from bot.cli.args import OneLineParser, importance, positive_int, recall_limit, snowflake
from bot.cli.importer import import_lines
from bot.cli.progress import Progress
from bot.memory import records
from bot.memory.engine import Engine
from bot.memory.scope import SCOPES, Viewer
from bot.settings import Settings, SettingsError, load_settings

log = logging.getLogger("muninn")
T = TypeVar("T")

SOME_LINES_BAD = 3   # exit status: the good lines ran, some lines were bad (each reported)


class UsageError(Exception):
    """Bad command-line input; the message is shown as one line."""


# -- shared helpers ----------------------------------------------------------

def emit(args: argparse.Namespace, data, human: str) -> None:
    """Print a result; text that cannot be encoded (a lone surrogate in stored text) is replaced,
    never allowed to abort the output."""
    text = json.dumps(data, ensure_ascii=False) if getattr(args, "json", False) else human
    print(validate.replace_invalid(redact.scrub(text)), flush=True)  # never a configured secret


def viewer_from(user_id, channel_id, guild_id, dm) -> Viewer:
    """The Viewer of a recall from the raw option or batch values; UsageError says what is wrong
    (no user, a bad id, a DM with a guild)."""
    if user_id is None:
        raise UsageError("a viewer needs --user ID (user_id in batch files)")
    try:
        user = validate.snowflake(user_id, "user id", optional=False)
        channel = validate.snowflake(channel_id, "channel id")
        guild = validate.snowflake(guild_id, "guild id")
        in_dm = validate.boolean(dm, "dm")
    except validate.Invalid as exc:
        raise UsageError(str(exc)) from None
    if in_dm and guild is not None:
        raise UsageError("--dm and --guild exclude each other: a DM has no guild")
    assert user is not None
    return Viewer(user_id=user, channel_id=channel, guild_id=guild, dm=in_dm)


def as_of_from(value, *, touch: bool = True) -> float | None:
    """The --as-of time (or a batch line's as_of) in unix seconds, None when not given; UsageError
    when validate.as_of refuses it."""
    try:
        return validate.as_of(value, touch=touch)
    except validate.Invalid as exc:
        raise UsageError(f"--as-of: {exc}") from None


def human_recall(result) -> str:
    """The text `muninn recall` prints for a result: its mode, then each memory with why it came."""
    lines = [f"mode: {result.mode} (vectors: {result.vector_status}), {len(result.memories)} memories"
             + ("" if result.relevant() or not result.memories else
                f"; none reaches the relevance floor ({result.floor}): a reply's prompt gets none")]
    for i, recalled in enumerate(result.memories, start=1):
        reason = recalled.candidate.reason()
        why = ", ".join(f"{k}={v}" for k, v in reason.items() if k != "via")
        lines.append(f"{i:>2}. #{recalled.memory.id} [{recalled.memory.scope}] {recalled.memory.text}")
        lines.append(f"      via {reason['via']}: {why}")
    return "\n".join(lines)


# -- subcommands -------------------------------------------------------------

async def cmd_remember(args, settings: Settings) -> int:
    """`muninn remember`: store one memory and print its id (with --json, also whether it got a
    vector); returns 0. UsageError when a value is refused."""
    try:
        memory = records.NewMemory(text=args.text, scope=args.scope, owner_id=args.user, channel_id=args.channel,
                                 guild_id=args.guild, importance=args.importance,
                                 standing=records.SET if args.scope == "room" else None)  # the operator's word
    except ValueError as exc:  # validate.Invalid included: a lone surrogate from a bad terminal byte
        raise UsageError(str(exc)) from None
    async with Engine(settings, warm=False) as engine:
        memory_id = await engine.remember(memory)
        embedded = (await engine.get(memory_id)).embedded
    emit(args, {"id": memory_id, "embedded": embedded}, str(memory_id))
    return 0


async def cmd_recall(args, settings: Settings) -> int:
    """`muninn recall`: print what the viewer would recall for QUERY, and why (counted as a recall
    unless --no-touch); returns 0. With --batch, `recall_batch` runs instead."""
    if args.batch:
        return await recall_batch(args, settings)
    if args.query is None:
        raise UsageError("give a QUERY, or --batch FILE")
    viewer = viewer_from(args.user, args.channel, args.guild, args.dm)
    as_of = as_of_from(args.as_of, touch=not args.no_touch)
    query, _ = validate.query_text(args.query)
    async with Engine(settings, warm=False) as engine:
        result = await engine.recall(query, viewer, limit=args.limit, as_of=as_of, touch=not args.no_touch)
    emit(args, result.to_dict(as_of), human_recall(result))
    return 0


BATCH_KEYS = {"query", "user_id", "channel_id", "guild_id", "dm", "limit", "as_of", "no_touch"}


def batch_request(raw: bytes) -> tuple[dict, bool]:
    """One batch line checked: (the recall's arguments, whether the query had invalid characters
    replaced). Raises UsageError or validate.Invalid with the reason."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"not valid UTF-8 (byte {raw[exc.start]:#04x} at column {exc.start + 1})") from None
    request = json.loads(line, parse_constant=validate.reject_json_constant)
    if not isinstance(request, dict):
        raise UsageError("line is not a JSON object")
    unknown = set(request) - BATCH_KEYS
    if unknown:
        raise UsageError(f"unknown key(s): {validate.replace_invalid(', '.join(sorted(unknown)))}")
    query, replaced = validate.query_text(request.get("query"), "'query'")
    touch = not validate.boolean(request.get("no_touch"), "no_touch")
    return {"query": query, "viewer": viewer_from(request.get("user_id"), request.get("channel_id"),
                                                  request.get("guild_id"), request.get("dm", False)),
            "limit": validate.limit(request.get("limit"), "'limit'"),
            "as_of": as_of_from(request.get("as_of"), touch=touch), "touch": touch}, replaced


async def recall_batch(args, settings: Settings) -> int:
    """`muninn recall --batch FILE`: for each non-blank line, one JSON line with its result or its
    error; returns SOME_LINES_BAD when a line was bad, else 0. UsageError when there is no such file."""
    path = Path(args.batch)
    if not path.is_file():
        raise UsageError(f"--batch: no file {str(path)!r}")
    bad = 0
    async with Engine(settings, warm=False) as engine:
        with path.open("rb") as lines:
            for number, line in enumerate(lines, start=1):
                if not line.strip():
                    continue
                try:
                    request, replaced = batch_request(line)
                    result = await engine.recall(request["query"], request["viewer"], limit=request["limit"],
                                                 as_of=request["as_of"], touch=request["touch"])
                    out = {"line": number, **result.to_dict(request["as_of"])}
                    if replaced:
                        out["warning"] = "the query had invalid characters (lone surrogates); they were replaced"
                except (UsageError, ValueError, RecursionError) as exc:
                    bad += 1
                    out = {"line": number, "error": validate.replace_invalid(str(exc))}
                print(validate.replace_invalid(json.dumps(out, ensure_ascii=False)), flush=True)
    return SOME_LINES_BAD if bad else 0


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
        print(validate.replace_invalid(f"line {number}: {error}"), file=sys.stderr)
    data = {"imported": report.imported, "skipped_existing": report.skipped_existing,
            "errors": [{"line": n, "error": e} for n, e in report.errors], "missing_vectors": missing}
    human = (f"imported {report.imported}, skipped {report.skipped_existing} already present, "
             f"{len(report.errors)} bad lines")
    if missing:
        human += f"; {missing} memories await embeddings (Ollama unavailable?): run `muninn maintain` later"
    emit(args, data, human)
    return SOME_LINES_BAD if report.errors else 0


async def cmd_stats(args, settings: Settings) -> int:
    """`muninn stats`: print the engine's counts and where the database is; returns 0."""
    async with Engine(settings, warm=False) as engine:
        data = await engine.stats()
        data["database"] = engine.storage.where()
    human = "\n".join(f"{key}: {value}" for key, value in data.items())
    emit(args, data, human)
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
    emit(args, {"reindexed": count, "model": settings.embed_model}, f"re-embedded {count} memories")
    return 0


async def cmd_doctor(args, settings: Settings) -> int:
    """`muninn doctor`: print each check, with its fix when it failed; returns 0 when every check
    passed, else 1."""
    from bot.cli.doctor import run_doctor
    checks = await run_doctor(settings, fix=args.fix)
    human = "\n".join(f"{'ok  ' if c.ok else 'FAIL'} {c.name}: {c.detail}" + (f"\n     fix: {c.fix}" if c.fix else "")
                      for c in checks)
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
        """Register the slash commands globally, or in one guild; returns their names."""


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
    emit(args, {"synced": names, "guild": args.guild}, f"synced {len(names)} commands {where}: "
                                                        + ", ".join(f"/{name}" for name in names))
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
            emit(args, {"restored": memory.id}, f"restored #{memory.id}: {memory.text}")
            return 0
        if args.archived:
            memories, total = await maintenance.archived(engine, reason=args.reason, limit=args.limit or 50)
            human = "\n".join([f"{total} archived memories"] + [
                f"#{m.id} [{m.scope}] {m.text}  ({m.archive_reason}, {records.iso(m.archived_at)})" for m in memories])
            emit(args, {"total": total, "memories": [m.to_dict() for m in memories]}, human)
            return 0
        # Each step commits as it goes and prints when done, so an interrupted run keeps (and shows) its work.
        try:
            report = await maintenance.run_with_lease(
                engine, use_llm=not args.no_llm, on_step=None if args.json else lambda line: print(line, flush=True))
        except maintenance.MaintenanceBusy as exc:
            raise UsageError(str(exc)) from None
    emit(args, report.to_dict(), f"done in {report.seconds:.1f} s")
    return 0


# -- parser ------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    """The parser of every subcommand: each sets `handler` to its `cmd_*` coroutine, and --db,
    --json and -v are taken before or after the subcommand."""
    common = OneLineParser(add_help=False)
    # SUPPRESS: a subcommand's unset option must not overwrite one given before the subcommand.
    common.add_argument("--db", metavar="PATH", default=argparse.SUPPRESS,
                        help="database file (default: MUNINN_DB_PATH or data/muninn.db)")
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON")
    common.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="debug logging")

    parser = OneLineParser(prog="muninn", parents=[common],
                                     description="Muninn: a Discord bot that remembers.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("remember", parents=[common], help="store a memory, print its id")
    p.add_argument("text")
    p.add_argument("--scope", choices=SCOPES, required=True)
    p.add_argument("--user", type=snowflake, help="owner (personal) or author user id")
    p.add_argument("--channel", type=snowflake, help="channel id (required for room scope)")
    p.add_argument("--guild", type=snowflake, help="guild id where it was learned (omit for a DM)")
    p.add_argument("--importance", type=importance, default=0.5)
    p.set_defaults(handler=cmd_remember)

    p = sub.add_parser("recall", parents=[common], help="what Muninn would recall for a query, and why")
    p.add_argument("query", nargs="?")
    p.add_argument("--user", type=snowflake)
    p.add_argument("--channel", type=snowflake)
    p.add_argument("--guild", type=snowflake)
    p.add_argument("--dm", action="store_true", help="the viewer is in a DM with Muninn")
    p.add_argument("--limit", type=recall_limit, help=f"at most {validate.MAX_RECALL_LIMIT}")
    p.add_argument("--as-of", metavar="ISO-TIME", help="evaluate at this time (decay, touch, newer memories hidden)")
    p.add_argument("--no-touch", action="store_true", help="inspect only: do not count this as a recall")
    p.add_argument("--batch", metavar="FILE.jsonl", help="one query object a line, one result a line")
    p.set_defaults(handler=cmd_recall)

    p = sub.add_parser("import", parents=[common], help="import memories from a JSON-lines file")
    p.add_argument("file", metavar="FILE.jsonl")
    p.set_defaults(handler=cmd_import)

    p = sub.add_parser("stats", parents=[common], help="counts of memories, vectors and links")
    p.set_defaults(handler=cmd_stats)

    p = sub.add_parser("reindex", parents=[common], help="re-embed every memory with OLLAMA_EMBED_MODEL")
    p.set_defaults(handler=cmd_reindex)

    p = sub.add_parser("doctor", parents=[common], help="check the database, sqlite-vec and Ollama")
    p.add_argument("--fix", action="store_true",
                   help="also clamp nonsense stored values and make the database files private")
    p.set_defaults(handler=cmd_doctor)

    p = sub.add_parser("run", parents=[common], help="start the Discord bot (the default with no COMMAND)")
    p.set_defaults(handler=cmd_run)

    p = sub.add_parser("sync", parents=[common], help="register the slash commands with Discord")
    p.add_argument("--guild", type=snowflake, help="only in this server (instant; global sync can take an hour)")
    p.set_defaults(handler=cmd_sync)

    p = sub.add_parser("chat", parents=[common], help="talk to Muninn in this terminal, without Discord")
    p.add_argument("--name", help="what Muninn calls you (default: your login name)")
    p.add_argument("--log-file", metavar="PATH", help="write every log line to this file")
    p.set_defaults(handler=cmd_chat)

    p = sub.add_parser("maintain", parents=[common],
                       help="archive faded memories, embed, link and consolidate (idempotent, safe to interrupt)")
    p.add_argument("--no-llm", action="store_true", help="consolidate by keeping the clearest original")
    p.add_argument("--archived", action="store_true", help="list archived memories instead (restorable)")
    p.add_argument("--reason", choices=["decayed", "superseded", "consolidated"], help="with --archived: only these")
    p.add_argument("--limit", type=positive_int, help="with --archived: how many (default 50)")
    p.add_argument("--restore", type=snowflake, metavar="ID", help="bring an archived memory back")
    p.set_defaults(handler=cmd_maintain)

    migrate.add_parser(sub, common)
    users.add_parser(sub, common)
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
