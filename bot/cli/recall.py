"""`muninn recall`: what a viewer would recall for a query, and why; one query, or a batch file
of them (one JSON object a line in, one result a line out).

A viewer given by `--user` alone is that person in a DM with Muninn (where they see their
personal memories from everywhere); the output then says how many of their memories are
visible only elsewhere (room memories they taught, seen in those channels) and which flag
shows them.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rich.text import Text

from bot import validate
from bot.cli.args import UsageError
from bot.cli.output import emit, lines, plural, table, write
from bot.memory.engine import Engine
from bot.memory.scope import Viewer
from bot.settings import Settings

SOME_LINES_BAD = 3   # exit status: the good lines ran, some lines were bad (each reported)
BATCH_KEYS = {"query", "user_id", "channel_id", "guild_id", "dm", "limit", "as_of", "no_touch"}


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


def where(viewer: Viewer) -> str:
    """Whose view a recall took, in words."""
    if viewer.dm:
        return f"user {viewer.user_id} in a DM with Muninn"
    if viewer.guild_id is not None:
        return f"user {viewer.user_id} in channel {viewer.channel_id} of server {viewer.guild_id}" \
            if viewer.channel_id is not None else f"user {viewer.user_id} in server {viewer.guild_id}"
    return f"user {viewer.user_id} in channel {viewer.channel_id}"


def found_by(reason: dict) -> str:
    """Why recall picked a memory, short: the paths that found it and their ranks or scores."""
    said = []
    if "fts_rank" in reason:
        said.append(f"words #{reason['fts_rank']}")
    if "vector_rank" in reason or "cosine" in reason:
        said.append("meaning" + (f" {reason['cosine']:.2f}" if "cosine" in reason else ""))
    if "link" in reason:
        said.append(f"linked ({reason['link']})")
    if "neighbour_of" in reason:
        said.append(f"learned next to #{reason['neighbour_of']}")
    return ", ".join(said) or str(reason.get("via", ""))


def human_recall(result: Any, viewer: Viewer) -> Any:
    """What `muninn recall` prints for people: the mode and whose view, then a table of the memories."""
    head = Text(f"{result.mode} recall (vectors: {result.vector_status}) as {where(viewer)}: "
                f"{plural(len(result.memories), 'memory', 'memories')}"
                + ("" if result.relevant() or not result.memories else
                   f"; none reaches the relevance floor ({result.floor}): a reply's prompt gets none"))
    if not result.memories:
        return head
    rows = []
    for rank, recalled in enumerate(result.memories, start=1):
        memory = recalled.memory
        rows.append((rank, f"#{memory.id}", memory.scope, memory.text, found_by(recalled.candidate.reason())))
    return lines(head, table(("", "id", "scope", "memory", "found by"), rows, styles=("dim", "cyan", "", "", "dim")))


async def elsewhere(engine: Engine, user_id: int) -> dict[str, Any] | None:
    """The person's active memories a DM view does not show (room memories they taught, seen only in
    their channels): how many, in which channels, and the flag that shows them. None when there are none."""
    taught = [m for m in await engine.memories_of(user_id, ("room",))
              if m.scope == "room" and m.archived_at is None and m.channel_id is not None]
    if not taught:
        return None
    channels = sorted({m.channel_id for m in taught if m.channel_id is not None})
    return {"count": len(taught), "channels": [str(c) for c in channels], "flag": "--channel ID --guild ID"}


def elsewhere_note(user_id: int, hidden: dict[str, Any]) -> Text:
    """One line: how many of the person's memories only show elsewhere, and how to see them."""
    shown = ", ".join(hidden["channels"][:5]) + (", ..." if len(hidden["channels"]) > 5 else "")
    return Text(f"{plural(hidden['count'], 'more memory', 'more memories')} of user {user_id} "
                f"{'is' if hidden['count'] == 1 else 'are'} visible only in {plural(len(hidden['channels']), 'channel')} "
                f"({shown}): add --channel ID --guild ID to search as them there.", style="yellow")


async def cmd_recall(args, settings: Settings) -> int:
    """`muninn recall`: print what the viewer would recall for QUERY, and why (counted as a recall
    unless --no-touch); returns 0. With --batch, `recall_batch` runs instead. `--user` alone is
    that person's DM view, and says what it does not show."""
    if args.batch:
        return await recall_batch(args, settings)
    if args.query is None:
        raise UsageError("give a QUERY, or --batch FILE")
    only_user = args.channel is None and args.guild is None and not args.dm
    viewer = viewer_from(args.user, args.channel, args.guild, args.dm or only_user)
    as_of = as_of_from(args.as_of, touch=not args.no_touch)
    query, _ = validate.query_text(args.query)
    async with Engine(settings, warm=False) as engine:
        result = await engine.recall(query, viewer, limit=args.limit, as_of=as_of, touch=not args.no_touch)
        hidden = await elsewhere(engine, viewer.user_id) if only_user else None
    data = result.to_dict(as_of)
    human = human_recall(result, viewer)
    if only_user:
        data["viewer"] = "dm"           # --user alone: the person's DM view
        data["visible_elsewhere"] = hidden
        if hidden:
            human = lines(human, elsewhere_note(viewer.user_id, hidden))
    emit(args, data, human)
    return 0


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
    error (JSON with or without --json: it is made for scripts); returns SOME_LINES_BAD when a line
    was bad, else 0. UsageError when there is no such file."""
    path = Path(args.batch)
    if not path.is_file():
        raise UsageError(f"--batch: no file {str(path)!r}")
    bad = 0
    async with Engine(settings, warm=False) as engine:
        with path.open("rb") as batch:
            for number, line in enumerate(batch, start=1):
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
                write(json.dumps(out, ensure_ascii=False))
    return SOME_LINES_BAD if bad else 0
