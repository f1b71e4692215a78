"""The hard protocol of bench/quality.py: one shared world instead of one database per conversation.

The isolated protocol gives each LoCoMo conversation a database of its own, asked by its
one owner in a DM: nothing else competes for the top 10. Here every dev conversation lives
in ONE database, as a guild would fill it:

- conversation i's turns are personal memories of its owner (user i), learned in the guild
  (key `p:i:GUILD`: seen by user i in the guild's channels and in DMs), as in the isolated
  protocol (the owner holds both speakers' turns);
- user i usually talks in channel `ROOM_BASE + i`, a busy room whose room memories are the
  turns of the OTHER conversations (other people, same months: LoCoMo's conversations
  overlap from Dec 2022 to Jan 2024), each stored at its real time; with `same_names` those
  turns are voiced by the asker's own speakers' first names (another Caroline in the
  room), the harshest overlap;
- every conversation's turns are also other users' personal memories, which the asker may
  never see.

All memories are imported together in time order (as a live bot stores them). Each
question is asked by its conversation's owner twice: in a DM (global + their personal
memories) and in their room (global + their personal memories learned in the guild + the
room's memories). Every recalled memory is checked against the scope rule, written out
here independently of bot/memory/scope.py: a memory the asker may not see fails the run.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from bot.memory import records
from bot.memory.scope import Viewer

from .bm25 import Bm25Index

GUILD_ID = 7_000
ROOM_BASE = 8_000
VIEWS = ("dm", "room")


CROWD_BASE = 100_000     # crowd users' ids
CROWD_AFTER = 400 * 86400.0  # the crowd talks after the last LoCoMo session (Jan 2024 + 400 days)


@dataclass(frozen=True)
class WorldSpec:
    """One hard protocol: where a question is asked ('dm' or 'room', the owner's busy guild
    channel), whether the room's speakers share the asker's speakers' names, how many copies of
    every conversation a crowd of other users adds as their own newer personal memories, and
    when the question is asked (days after the conversation's last session; None = now, as the
    product asks)."""
    view: str
    same_names: bool = False
    crowd: int = 0
    days_after: float | None = 1.0


def room_of(owner: int) -> int:
    return ROOM_BASE + owner


def viewer_for(owner: int, view: str) -> Viewer:
    return Viewer(owner, dm=True) if view == "dm" else Viewer(owner, channel_id=room_of(owner), guild_id=GUILD_ID)


def revoice(text: str, names: dict[str, str]) -> str:
    """Replace whole-word speaker names (the 'Speaker: ' prefix and mentions) by others."""
    if not names:
        return text
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, names)) + r")\b")
    return pattern.sub(lambda m: names[m.group(1)], text)


def world_records(conversations: list[dict], records: dict[str, list[dict]], *,
                  same_names: bool, crowd: int = 0) -> list[dict]:
    """Every memory of the shared world as `muninn import` records, in time order.
    `conversations`: [{"sid", "owner", "speakers": (a, b)}] in corpus order. `crowd` copies of
    every conversation become personal memories of other users, stored after everything else
    (a community that kept talking): the asker never sees them, but they make the asker's
    memories old and the question's words common, as in a big bot's database."""
    out: list[dict] = []
    for conv in conversations:
        for r in records[conv["sid"]]:
            out.append(dict(r, user_id=conv["owner"], guild_id=GUILD_ID))
    for host in conversations:
        for other in conversations:
            if other is host:
                continue
            names = dict(zip(other["speakers"], host["speakers"], strict=True)) if same_names else {}
            for r in records[other["sid"]]:
                out.append({"text": revoice(r["text"], names), "scope": "room", "channel_id": room_of(host["owner"]),
                            "guild_id": GUILD_ID, "created_at": r["created_at"],
                            "external_id": f"room{host['owner']}:{r['external_id']}"})
    for copy in range(crowd):
        for j, conv in enumerate(conversations):
            user = CROWD_BASE + copy * len(conversations) + j
            for r in records[conv["sid"]]:
                out.append({"text": r["text"], "scope": "personal", "user_id": user, "guild_id": GUILD_ID,
                            "created_at": r["created_at"] + CROWD_AFTER + copy,
                            "external_id": f"crowd{user}:{r['external_id']}"})
    out.sort(key=lambda r: (r["created_at"], r["external_id"]))
    return out


class ScopeLeak(AssertionError):
    """A recall returned a memory its asker may not see."""


def may_see(memory: records.Memory, viewer: Viewer) -> bool:
    """The scope rule, restated: global everywhere; room memories only in their channel;
    personal memories only to their owner, in DMs, or in the guild they were learned in
    (a private channel's only in that channel)."""
    if memory.scope == "global":
        return True
    if memory.scope == "room":
        return not viewer.dm and memory.channel_id == viewer.channel_id
    if memory.owner_id != viewer.user_id:
        return False
    if viewer.dm:
        return True
    if memory.guild_id != viewer.guild_id:
        return False
    return not memory.vis_key.count(":") == 3 or memory.channel_id == viewer.channel_id


def check_scope(memories: list[records.Memory], viewer: Viewer, question: str) -> None:
    for memory in memories:
        if not may_see(memory, viewer):
            raise ScopeLeak(f"{viewer} was shown memory {memory.id} ({memory.vis_key}) for {question!r}")


def visible_keys_for(owner: int, view: str) -> list[str]:
    """The keys the world's asker sees (for the BM25 baseline), from the rule above."""
    if view == "dm":
        return ["g", f"p:{owner}:{GUILD_ID}"]
    return ["g", f"p:{owner}:{GUILD_ID}", f"r:{room_of(owner)}"]


def bm25_world(rows: list[dict], asks: list[dict], view: str, limit: int) -> list[list[str]]:
    """Porter BM25 over what each asker sees in the shared world (no decay, no touch)."""
    index = Bm25Index((f"r:{r['channel_id']}" if r["scope"] == "room" else f"p:{r['user_id']}:{GUILD_ID}",
                       r["external_id"], r["created_at"], r["text"]) for r in rows)
    return [index.ask(q["question"], visible_keys_for(q["owner"], view), limit, q["as_of"]) for q in asks]
