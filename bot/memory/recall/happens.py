"""The date lift on the second clock: a candidate whose event happens on a date the question names.

ranking.final_order lifts a memory stored on a date the question names ("what did I do
yesterday": what was said yesterday). A memory can also tell of an event on that date while it
was said earlier ("tomorrow I fly to Rome", said the day before): its `happens_on`
(bot/memory/clocks.py) falls on the named date, and it gets the same lift, once: a memory lifted
for when it was stored is not lifted again for when it happens.
"""
from __future__ import annotations

from collections.abc import Sequence
from datetime import tzinfo

from bot.memory import clocks
from bot.memory.connection import Connection
from bot.memory.recall.dates import DateHint
from bot.memory.recall.retrieval import Candidate, rank


def lift(conn: Connection, ranked: list[Candidate], hints: Sequence[DateHint], boost: float,
         tz: tzinfo) -> list[Candidate]:
    """`ranked` with the candidates whose event happens on a named date lifted by 1 + `boost`
    (unless their storing date was lifted already), in their new order; as it was without hints."""
    if not hints or boost <= 0 or not ranked:
        return ranked
    by_id = {c.memory_id: c for c in ranked}
    lifted = False
    for memory_id, created_at, happens_on in conn.execute(
            f"SELECT id, created_at, happens_on FROM memories WHERE id IN ({','.join('?' * len(by_id))}) "
            "AND happens_on IS NOT NULL", list(by_id)):
        span = clocks.parse(happens_on)
        if span is None or any(hint.covers(created_at, tz) for hint in hints):
            continue
        if any(hint.overlaps(span) for hint in hints):
            by_id[memory_id].fused *= 1.0 + boost
            lifted = True
    return rank(ranked) if lifted else ranked
