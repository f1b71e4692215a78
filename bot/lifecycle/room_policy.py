"""The write policy of shared memory: who may teach a room what everyone there is told.

A room memory is recalled for everyone in its channel, so a member's room fact is only that
member's claim. Each server chooses (`/memory room mode`, stored by `engine.rooms`):
  moderated (the default)  a room fact from a member who may not moderate the channel waits for
                           a moderator (a pending memory: recalled for nobody, listed to the
                           channel's moderators by `/memory room pending` to approve or reject);
  open                     it is stored at once, as that member's attributed claim;
  off                      no room fact from the conversation is stored at all.
What a moderator (Manage Messages in the channel; the server's owner and administrators have it)
teaches stands as set by a moderator in every mode but off. `/memory remember scope:room` stays a
moderator's command in every mode; global memories are never learned from conversation.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Sequence

from bot.conversation.exchange import Exchange
from bot.lifecycle.facts import Fact
from bot.memory.engine import Engine
from bot.memory.records import PENDING, SET
from bot.memory.rooms import MODES

log = logging.getLogger(__name__)

MODERATED, OPEN, OFF = MODES


async def apply(engine: Engine, facts: Sequence[Fact], own: Sequence[Exchange]) -> list[Fact]:
    """The facts of one author's messages `own` as the server's mode lets them be stored: room
    facts set by a moderator, waiting for one, kept as a claim, or dropped."""
    if not any(fact.scope == "room" for fact in facts):
        return list(facts)
    author = own[0]
    mode = await engine.rooms.mode(author.guild_id)
    # Every message the facts were drawn from must be a moderator's: one written before a
    # moderator role was given is not.
    moderator = all(exchange.moderator for exchange in own)
    kept: list[Fact] = []
    for fact in facts:
        if fact.scope != "room":
            kept.append(fact)
        elif mode == OFF:
            continue
        elif moderator:
            kept.append(dataclasses.replace(fact, standing=SET))
        elif mode == MODERATED:
            kept.append(dataclasses.replace(fact, standing=PENDING))
        else:
            kept.append(fact)
    if len(kept) < len(facts):
        log.info("room memory is off in guild %s: dropped %d room facts of author %s", author.guild_id,
                 len(facts) - len(kept), author.author_id)
    return kept
