"""Recalled memories as the prompt presents them: each an attributed, dated claim (prompt.Claim).

A personal memory is what the person being answered told Muninn (the scope rule shows nobody
else's); a room memory is what its teacher said, named by the display name they last used in
this channel ("a member" when their messages are gone), approved or set by a moderator when
one vouched for it (bot/lifecycle/room_policy.py); a global memory is the operator's note.
When the names cannot be read, the memories are still given, as claims of "a member".
Each claim carries when it was learned, when its event happens (if it names a date), and whether
a newer memory in the same list says otherwise (recall's newer.py: `outdated`).
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Mapping, Sequence

from bot.conversation.prompt import APPROVED, MEMBER, MODERATOR, OPERATOR, OWN, Claim
from bot.memory.engine import Engine
from bot.memory.records import SET, Memory
from bot.memory.rooms import Attribution

log = logging.getLogger(__name__)


async def claims(engine: Engine, memories: Sequence[Memory], *, viewer_id: int, viewer_name: str,
                 channel_id: int | None, outdated: Mapping[int, int] | None = None) -> list[Claim]:
    """`memories` (recalled for `viewer_id` in `channel_id`, None: a DM) as claims, in their order.
    `outdated`: memory id -> the newer memory that says otherwise; a memory is shown as earlier
    when that newer one is in the list too."""
    try:
        found = await engine.rooms.attribution(channel_id, memories)
    except Exception as exc:  # a busy database: the memories still count, unnamed
        log.warning("could not read who taught the recalled memories: %s: %s", type(exc).__name__, exc)
        found = Attribution()
    shown = {memory.id for memory in memories}
    earlier = {old for old, new in (outdated or {}).items() if new in shown}
    return [dataclasses.replace(claim(memory, found, viewer_id=viewer_id, viewer_name=viewer_name),
                                happens=memory.happens_on, earlier=memory.id in earlier) for memory in memories]


def claim(memory: Memory, found: Attribution, *, viewer_id: int, viewer_name: str) -> Claim:
    """One memory as a claim, with who stands behind it."""
    said_at = memory.created_at
    if memory.scope == "global":
        return Claim(memory.text, said_at, OPERATOR)
    if memory.scope == "personal":
        if memory.owner_id == viewer_id:
            return Claim(memory.text, said_at, OWN, by=viewer_name)
        return Claim(memory.text, said_at, MEMBER)  # never shown by the scope rule; unnamed if it were
    teacher = found.names.get(memory.owner_id) if memory.owner_id is not None else None
    approval = found.approvals.get(memory.id)
    if approval is None:
        return Claim(memory.text, said_at, MEMBER, by=teacher)
    moderator = found.names.get(approval.moderator_id) if approval.moderator_id is not None else None
    if approval.how == SET:
        return Claim(memory.text, said_at, MODERATOR, moderator=moderator)
    return Claim(memory.text, said_at, APPROVED, by=teacher, moderator=moderator)
