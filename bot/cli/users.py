"""`muninn user export ID` and `muninn user forget ID`: a person's access and deletion requests,
answered by the operator.

`export` writes, as JSON, everything /memory export gives the person (their personal memories,
each with where it was learned, and the room memories they taught) and their messages in the
conversation history (with Muninn's replies to them and their DM conversations): to stdout, or
to `--out FILE`, readable by the operator alone. `forget` is /memory forget-all for them: the same
complete forget (bot/conversation/pipeline.py `forget_person`, with its scrub of the database
files), after a question unless `--yes`. A bad id is one line on stderr and exit status 2.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from bot import validate
from bot.memory import records
from bot.memory.engine import Engine
from bot.memory.messages import HistoryMessage
from bot.memory.records import Memory
from bot.settings import Settings

BAD_INPUT = 2
NOT_CONFIRMED = 1


class Refused(Exception):
    """Bad input for `muninn user`: the message is shown as one line."""


def user_id_of(text: str) -> int:
    """The ID argument as a Discord user id; Refused says what is wrong."""
    try:
        user_id = validate.snowflake(text, "user id", optional=False)
    except validate.Invalid as exc:
        raise Refused(str(exc)) from None
    assert user_id is not None
    return user_id


def learned_in(memory: Memory) -> str:
    """Where a memory was learned, in words (its guild_id and channel_id say the same as numbers)."""
    if memory.guild_id is not None:
        return f"server {memory.guild_id}, channel {memory.channel_id}"
    if memory.channel_id is not None:
        return f"a direct message (channel {memory.channel_id})"
    return "not in a conversation (told on the command line or imported)"


def message_data(message: HistoryMessage) -> dict[str, Any]:
    """One history row as JSON-ready values, times in ISO 8601."""
    return {"id": message.id, "channel_id": message.channel_id, "guild_id": message.guild_id,
            "author_id": message.author_id, "author_name": message.author_name, "role": message.role,
            "content": message.content, "created_at": records.iso(message.created_at),
            "edited_at": records.iso(message.edited_at)}


def export_data(user_id: int, memories: list[Memory], messages: list[HistoryMessage],
                now: datetime | None = None) -> dict[str, Any]:
    """The export: /memory export's content (each memory says its scope), where each memory was
    learned, and the person's messages in the history."""
    now = now or datetime.now(timezone.utc)
    return {"user_id": str(user_id), "exported_at": now.isoformat(timespec="seconds"),
            "memories": [{**memory.to_dict(), "learned_in": learned_in(memory)} for memory in memories],
            "messages": [message_data(message) for message in messages]}


def write_private(path: Path, text: str) -> None:
    """Write the file readable by its owner alone, whole or not at all (a temporary file renamed)."""
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text)
        os.chmod(temporary, 0o600)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def output_path(text: str | None) -> Path | None:
    """The --out file, checked before the database is opened; Refused when it cannot be written."""
    if text is None:
        return None
    path = Path(text)
    if path.is_dir():
        raise Refused(f"--out {text!r} is a directory; give a file name")
    if not path.parent.is_dir():
        raise Refused(f"--out {text!r}: no folder {str(path.parent)!r}")
    if not os.access(path.parent, os.W_OK):
        raise Refused(f"--out {text!r}: folder {str(path.parent)!r} is not writable")
    return path


async def export(args: argparse.Namespace, settings: Settings) -> int:
    """`muninn user export ID [--out FILE]`: the person's data as JSON; returns 0."""
    user_id = user_id_of(args.id)
    path = output_path(args.out)
    async with Engine(settings, warm=False) as engine:
        memories = await engine.memories_of(user_id)
        messages = await engine.messages.of_person(user_id)
    # replace_invalid: a lone surrogate stored by an older Muninn must not make the export fail
    text = validate.replace_invalid(json.dumps(export_data(user_id, memories, messages), ensure_ascii=False, indent=2))
    if path is None:
        print(text, flush=True)
        return 0
    await asyncio.to_thread(write_private, path, text + "\n")
    personal = sum(memory.scope == "personal" for memory in memories)
    print(f"wrote user {user_id}'s {personal} personal memories, {len(memories) - personal} room memories they "
          f"taught and {len(messages)} messages to {path}", flush=True)
    return 0


async def forget(args: argparse.Namespace, settings: Settings) -> int:
    """`muninn user forget ID [--yes]`: /memory forget-all for that person, after a question
    (stdin) unless --yes; prints what went. Returns 0, or NOT_CONFIRMED when the answer was not yes."""
    user_id = user_id_of(args.id)
    async with Engine(settings, warm=False) as engine:
        if not args.yes:
            memories = await engine.memories_of(user_id)
            messages = await engine.messages.of_person(user_id)
            personal = sum(memory.scope == "personal" for memory in memories)
            print(f"This deletes user {user_id}'s {personal} personal memories, learned anywhere, the "
                  f"{len(memories) - personal} room memories they taught and {len(messages)} messages of the "
                  "conversation history (theirs, Muninn's replies to them, their DMs). It cannot be undone. "
                  "Forget everything? [y/N] ", end="", file=sys.stderr, flush=True)
            answer = await asyncio.to_thread(sys.stdin.readline)
            if answer.strip().lower() not in ("y", "yes"):
                print(f"muninn user forget: not confirmed; nothing of user {user_id} was forgotten "
                      "(--yes skips the question)", file=sys.stderr)
                return NOT_CONFIRMED
        from bot.conversation.pipeline import Pipeline  # only here: the other commands start without it
        forgotten = await Pipeline(engine).forget_person(user_id)
    data = {"user_id": str(user_id), "personal": forgotten.personal, "taught": forgotten.taught,
            "messages": forgotten.messages}
    human = (f"forgot user {user_id}: {forgotten.personal} personal memories, {forgotten.taught} room memories "
             f"they taught, {forgotten.messages} messages")
    print(json.dumps(data) if getattr(args, "json", False) else human, flush=True)
    return 0


async def cmd_user(args: argparse.Namespace, settings: Settings) -> int:
    """`muninn user export|forget ID`: bad input is one line on stderr and exit status 2."""
    try:
        return await (export if args.action == "export" else forget)(args, settings)
    except Refused as exc:
        print(validate.replace_invalid(f"muninn user {args.action}: {exc}"), file=sys.stderr)
        return BAD_INPUT


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    """The `user` subcommand (export, forget) on the command line's parser."""
    summary = "a person's data: export it, or forget it (their requests)"
    user = sub.add_parser("user", parents=[common], help=summary, description=summary + ".",
                          epilog="examples:\n  muninn user export 42 --out user-42.json\n  muninn user forget 42")
    actions = user.add_subparsers(dest="action", metavar="ACTION", required=True, help="export or forget")
    summary = "everything Muninn keeps of a person, as JSON (their memories and messages)"
    p = actions.add_parser("export", parents=[common], help=summary, description=summary + ".",
                           epilog="examples:\n  muninn user export 42\n  muninn user export 42 --out user-42.json")
    p.add_argument("id", metavar="ID", help="the person's Discord user id")
    p.add_argument("--out", metavar="FILE", help="write it to FILE (readable by you alone) instead of stdout")
    summary = "forget everything about a person, as /memory forget-all does (asks first)"
    p = actions.add_parser("forget", parents=[common], help=summary, description=summary + ".",
                           epilog="examples:\n  muninn user forget 42\n  muninn user forget 42 --yes --json")
    p.add_argument("id", metavar="ID", help="the person's Discord user id")
    p.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    user.set_defaults(handler=cmd_user)
