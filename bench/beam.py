"""BEAM's chats as bench/quality.py's corpus: a folder the user downloads, read as it is.

BEAM (github.com/mohammadtavakoli78/BEAM) ships no licence: nothing of it is in the
repository and nothing here fetches it. `bench.quality --beam DIR` (or MUNINN_BENCH_BEAM;
default bench/data/beam/, git-ignored) reads DIR/<n>/chat.json and
DIR/<n>/probing_questions/probing_questions.json for every numbered chat folder found
(a `100K` folder inside DIR is looked into). Use the development chats only (1-10 of the
100K set): the others are kept for an independent check.

Each message becomes one memory of the chat's owner, "User: ..." or "Assistant: ...",
stamped with its batch's time anchor (the first message of a batch carries it) + its
index in the chat as seconds, the way LoCoMo's turns get their session's date. A
message longer than a memory may be is stored in parts (at paragraph breaks), each naming the
message as its source, as the product's own writers do; a part found counts as its message
found. Each question's evidence is its `source_chat_ids` (message ids); knowledge-update
questions keep which ids hold the original and which the
updated information; abstention questions have no evidence (the no-evidence set).
"""
from __future__ import annotations

import os
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bot.memory.records import MAX_TEXT_CHARS

DEFAULT = Path(__file__).resolve().parent / "data" / "beam"
ENV = "MUNINN_BENCH_BEAM"
NO_EVIDENCE = "abstention"
KNOWLEDGE_UPDATE = "knowledge_update"
PART_CHARS = MAX_TEXT_CHARS - 100  # room for the speaker's name


def folder(given: str | None) -> Path:
    """The BEAM folder: the flag, else MUNINN_BENCH_BEAM, else bench/data/beam/ (its 100K inside, if any)."""
    path = Path(given or os.environ.get(ENV) or DEFAULT)
    return path / "100K" if (path / "100K").is_dir() else path


def chats(path: Path, limit: int = 0) -> list[Path]:
    """The numbered chat folders under `path`, in number order (the first `limit`, 0 = all)."""
    found = sorted((p for p in path.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name))
    return found[:limit] if limit else found


def anchor_time(text: str) -> float:
    """'March-15-2024' -> unix seconds (UTC)."""
    return datetime.strptime(text.strip(), "%B-%d-%Y").replace(tzinfo=UTC).timestamp()


def parts(text: str, size: int = PART_CHARS) -> list[str]:
    """`text` in pieces of at most `size` characters, cut at paragraph breaks where it can."""
    out: list[str] = []
    rest = text.strip()
    while len(rest) > size:
        cut = rest.rfind("\n\n", 0, size)
        cut = cut if cut > size // 2 else rest.rfind(" ", 0, size)
        cut = cut if cut > 0 else size
        out.append(rest[:cut].strip())
        rest = rest[cut:].strip()
    return [*out, rest] if rest else out


def turn_of(external_id: str) -> str:
    """The message an imported part belongs to."""
    return external_id.split("#", 1)[0]


def flat_ids(source: Any) -> list[int]:
    """Message ids from a `source_chat_ids` value (a list, nested lists, or a dict of lists)."""
    if source is None:
        return []
    if isinstance(source, dict):
        return [i for value in source.values() for i in flat_ids(value)]
    if isinstance(source, list):
        return [i for value in source for i in flat_ids(value)]
    return [int(source)]


def load(chat: Path, owner_id: int) -> tuple[str, list[dict], list[dict]]:
    """(chat name, `muninn import` records in order, questions) of one chat folder."""
    import json
    sid = f"beam-{chat.name}"
    batches = json.loads((chat / "chat.json").read_text())
    records: list[dict] = []
    when = None
    index = 0
    for batch in batches:
        for turn in batch["turns"]:
            for message in turn:
                anchor = message.get("time_anchor") or batch.get("time_anchor")
                if anchor:
                    when = anchor_time(anchor)
                if when is None:
                    raise ValueError(f"{chat}: message {message['id']} comes before any time anchor")
                speaker = "User" if message["role"] == "user" else "Assistant"
                content = re.sub(r"\s*->->\s*\d+,\d+\s*$", "", message["content"])  # BEAM's plan markers
                pieces = parts(content)
                for n, piece in enumerate(pieces):
                    external_id = f"{sid}:{message['id']}" + (f"#{n}" if len(pieces) > 1 else "")
                    records.append({"text": f"{speaker}: {piece}", "scope": "personal", "user_id": owner_id,
                                    "created_at": when + index, "external_id": external_id,
                                    "source_message_ids": [f"{sid}:{message['id']}"]})
                index += 1
    known = {turn_of(r["external_id"]) for r in records}
    probing = json.loads((chat / "probing_questions" / "probing_questions.json").read_text())
    asks: list[dict] = []
    for ability, items in probing.items():
        for item in items:
            source = item.get("source_chat_ids")
            evidence = {f"{sid}:{i}" for i in flat_ids(source)} & known
            ask = {"question": item["question"], "category": ability, "evidence": evidence}
            if ability == KNOWLEDGE_UPDATE and isinstance(source, dict):
                ask["original"] = {f"{sid}:{i}" for i in flat_ids(source.get("original_info"))} & known
                ask["updated"] = {f"{sid}:{i}" for i in flat_ids(source.get("updated_info"))} & known
            if evidence or ability == NO_EVIDENCE:
                asks.append(ask)
    return sid, records, asks
