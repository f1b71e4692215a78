""""Remember this" on a message: the message's words kept as a memory, under the rules of learning.

The person who asks (the keeper) chooses the scope; the memory is attributed to who wrote the
message:
  personal  the keeper's own memory. Someone else's words are stored as "Bob said: …" and name
            Bob, who may then export it, see where it came from and erase it, as any memory that
            mentions him (he never sees it in recall: it is the keeper's).
  room      the author's claim in this channel, under the server's room memory mode
            (room_policy.py): kept by a moderator (Manage Messages here) it stands as set by them
            when they wrote it, or as the author's claim approved by them; kept by anyone else it
            waits for a moderator (moderated), stands as the author's claim (open), or is refused (off).
  global    the bot's owner only, as their note ("Bob said: …" when Bob wrote it).
Never kept: anyone's password, token or key; something sensitive (health, home, contact, anything
like a credential) about anyone but the memory's owner; anything of a person who paused Muninn's
memory. Keeping the same message again in the same scope gives the memory it already made; a
moderator who keeps a message whose room claim waits for approval approves it.
"""
from __future__ import annotations

from dataclasses import dataclass

from bot.lifecycle import sensitive
from bot.lifecycle.room_policy import OFF, OPEN
from bot.memory.engine import Engine
from bot.memory.records import PENDING, PENDING_REASON, SET, NewMemory
from bot.memory.scope import SCOPES

KEPT_IMPORTANCE = 0.8  # kept on purpose: worth keeping longer than a fact picked up in passing

# How a kept memory stands, for the keeper's confirmation.
PERSONAL, GLOBAL, SET_BY_YOU, APPROVED_BY_YOU, CLAIM, WAITING = (
    "personal", "global", "set", "approved", "claim", "pending")


class Refused(Exception):
    """The message cannot be kept as asked; the message says why, to the keeper."""


@dataclass(frozen=True)
class Said:
    """The message to keep, as Discord shows it: who wrote it, where and when, and its words."""
    message_id: int
    channel_id: int
    guild_id: int | None
    author_id: int
    author_name: str
    content: str
    created_at: float
    private: bool = False                # a guild channel not everyone in the guild can read
    people: tuple[str, ...] = ()         # display names of the people it mentions


@dataclass(frozen=True)
class Keeper:
    """Who asks to keep it: `moderator`, Manage Messages in the message's channel; `operator`, the bot's owner."""
    user_id: int
    moderator: bool = False
    operator: bool = False


@dataclass(frozen=True)
class Kept:
    """What keeping did: the memory's id, its scope, how it stands (PERSONAL ... WAITING), and
    whether the message was already kept so (`again`: nothing new was stored)."""
    memory_id: int
    scope: str
    standing: str
    again: bool = False


def check(said: Said, keeper: Keeper, scope: str) -> None:
    """What can be refused without the database: the scope's permission, no words, a secret,
    something sensitive about someone other than the memory's owner. Raises Refused."""
    if scope not in SCOPES:
        raise ValueError(f"unknown scope {scope!r}")
    if scope == "room" and said.guild_id is None:
        raise Refused("A room memory belongs to a server channel; in a DM, keep it for yourself.")
    if scope == "global" and not keeper.operator:
        raise Refused("Only the bot's owner can add global memories.")
    if not said.content.strip():
        raise Refused("That message has no text Muninn can remember.")
    if sensitive.secret(said.content):
        raise Refused("Muninn keeps no passwords, tokens or keys, not even yours: nothing was stored.")
    owner = owner_of(said, keeper, scope)
    if owner == said.author_id:
        kind = sensitive.screen(said.content, said.author_name, said.people)
    else:
        kind = sensitive.sensitive_kind(said.content)
    if kind is not None:
        raise Refused(f"That message tells something sensitive ({kind}) about someone other than "
                      f"{'its author' if owner == said.author_id else 'you'}: Muninn does not keep that.")


def owner_of(said: Said, keeper: Keeper, scope: str) -> int:
    """Whose memory it becomes: a room memory is its author's claim; the others are the keeper's."""
    return said.author_id if scope == "room" else keeper.user_id


async def keep(engine: Engine, said: Said, keeper: Keeper, scope: str) -> Kept:
    """Keep the message as a memory of `scope` (the module docstring gives the rules); Refused
    says why it is not kept."""
    check(said, keeper, scope)
    if await engine.memory_paused(said.author_id):
        raise Refused("Your memory with Muninn is paused: `/memory resume` turns it back on."
                      if said.author_id == keeper.user_id else
                      "Its author asked Muninn to keep nothing of what they say.")
    owner = owner_of(said, keeper, scope)
    text = said.content if owner == said.author_id else f"{said.author_name} said: {said.content}"
    standing = PERSONAL if scope == "personal" else GLOBAL if scope == "global" else CLAIM
    if scope == "room":
        mode = await engine.rooms.mode(said.guild_id)
        if mode == OFF:
            raise Refused("Room memory is off in this server (`/memory room mode`): nothing was stored.")
        standing = ((SET_BY_YOU if keeper.user_id == said.author_id else APPROVED_BY_YOU) if keeper.moderator
                    else CLAIM if mode == OPEN else WAITING)
    try:
        memory = NewMemory(text=text, scope=scope, owner_id=owner, channel_id=said.channel_id,
                           guild_id=said.guild_id, importance=KEPT_IMPORTANCE, created_at=said.created_at,
                           source_message_ids=[said.message_id], private=scope == "personal" and said.private,
                           mentions=[said.author_id] if scope == "personal" and owner != said.author_id else [],
                           standing={SET_BY_YOU: SET, WAITING: PENDING}.get(standing))
    except ValueError as exc:
        raise Refused(f"Muninn cannot remember that: {exc}.") from None
    for earlier in await engine.from_message(said.message_id):
        if earlier.scope == scope and earlier.owner_id == owner and earlier.text == memory.text:
            if earlier.archive_reason == PENDING_REASON and keeper.moderator:  # a moderator keeps a waiting claim
                assert said.guild_id is not None
                await engine.rooms.approve(earlier.id, channel_id=said.channel_id, guild_id=said.guild_id,
                                           moderator_id=keeper.user_id)
                return Kept(earlier.id, scope, APPROVED_BY_YOU)
            return Kept(earlier.id, scope, standing, again=True)
    if standing == APPROVED_BY_YOU:
        memory_id = await engine.rooms.keep_approved(memory, moderator_id=keeper.user_id)
    else:
        memory_id = await engine.remember(memory)
    return Kept(memory_id, scope, standing)
