"""Reply chains: a message that replies to an older one brings that one into the context.

When the message being answered replies to a message the recent history (the last
MUNINN_HISTORY_LIMIT messages) does not hold, that message joins the history given to the
prompt, and so does the message it replied to in turn, up to `CHAIN_DEPTH` messages back. Each
comes from the stored history when it holds it (a deleted one ends the chain: its words were
taken back), otherwise from the outlet (`QuotingOutlet`: Discord, as the person being answered
can read it). Only messages of the same channel are followed, so a chain never brings in what the
author cannot see; nor the words of a person who paused Muninn's memory. A chain that cannot be
read (Discord or the database failing) is left out: the answer matters more.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from bot.conversation.outlets import Outlet
from bot.logs import Throttle
from bot.memory.engine import Engine
from bot.memory.messages import HistoryMessage

log = logging.getLogger(__name__)

CHAIN_DEPTH = 3  # messages followed back from the one being answered
LOG_EVERY_SECONDS = 60.0
_throttle = Throttle()


@dataclass(frozen=True)
class Quoted:
    """A message as the outlet read it: who wrote it, when, its words, and the message of the same
    channel it replies to (`refers_to`; None: none)."""
    id: int
    author_id: int
    author_name: str
    content: str
    created_at: float
    refers_to: int | None = None


@runtime_checkable
class QuotingOutlet(Outlet, Protocol):
    """An outlet that can read an earlier message of the conversation it answers (Discord)."""

    async def quoted(self, message_id: int) -> Quoted | None:
        """The message `message_id` of the channel being answered, or None when it is not there
        (deleted, another channel's, or not readable)."""


async def with_chain(engine: Engine, *, channel_id: int, guild_id: int | None, reply_to: int | None,
                     recent: list[HistoryMessage], outlet: Outlet, assistant_id: int,
                     depth: int = CHAIN_DEPTH) -> list[HistoryMessage]:
    """`recent` (oldest first) with the reply chain from `reply_to` that it does not hold, in time order."""
    if reply_to is None or depth <= 0:
        return recent
    try:
        chain = await _chain(engine, channel_id, guild_id, reply_to, {m.id for m in recent}, outlet, assistant_id,
                             depth)
    except Exception as exc:  # Discord or the database failing: answer without the chain
        if _throttle.ready("chain", LOG_EVERY_SECONDS):
            log.warning("could not read the messages a reply points at: %s: %s", type(exc).__name__, exc)
        return recent
    if not chain:
        return recent
    return sorted([*chain, *recent], key=lambda m: (m.created_at, m.id))


async def _chain(engine: Engine, channel_id: int, guild_id: int | None, first: int, known: set[int], outlet: Outlet,
                 assistant_id: int, depth: int) -> list[HistoryMessage]:
    found: list[HistoryMessage] = []
    seen: set[int] = set()
    next_id: int | None = first
    for _ in range(depth):
        if next_id is None or next_id in seen:
            break
        seen.add(next_id)
        message_id = next_id
        stored = await engine.messages.in_channel(channel_id, message_id)
        if stored is not None and stored.deleted:
            break  # its words were taken back: neither they nor what they replied to come back
        quoted = None
        if stored is None or stored.message.role == "user":  # a person's reply: Discord knows what it answers
            quoted = await outlet.quoted(message_id) if isinstance(outlet, QuotingOutlet) else None
        if stored is not None:
            message = stored.message
            next_id = stored.reply_to if message.role == "assistant" else (quoted.refers_to if quoted else None)
        elif quoted is not None:
            message = HistoryMessage(id=quoted.id, channel_id=channel_id, guild_id=guild_id,
                                     author_id=quoted.author_id, author_name=quoted.author_name,
                                     role="assistant" if quoted.author_id == assistant_id else "user",
                                     content=quoted.content, created_at=quoted.created_at)
            next_id = quoted.refers_to
        else:
            break
        if (message.id not in known and message.content.strip()
                and not (message.role == "user" and await engine.memory_paused(message.author_id))):
            found.append(message)
    return found
