"""The date lift on the second clock: a candidate whose event happens on a date the question names.

ranking.final_order lifts a memory stored on a date the question names ("what did I do
yesterday": what was said yesterday). A memory can also tell of an event on that date while it
was said earlier ("tomorrow I fly to Rome", said the day before): its `happens_on`
(bot/memory/clocks.py) falls on the named date, and it gets the same lift, once: a memory lifted
for when it was stored is not lifted again for when it happens.

An event on a relative date the question names ("what's on Friday?", "anything next week?")
may share no word with the question and lie far from it in meaning ("Alice has a dentist
appointment"): `dated` adds the viewer's memories whose event happens then to the candidates,
up to the recall's limit, at the score of the weakest candidate, before the final order (whose
time factor and date lift, and `lift` here, then put them among the likely ones). Only dated
memories are searched (a partial index holds them), under the viewer's visible keys, as of the
recall's moment.
"""
from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta, tzinfo

from bot.memory import clocks
from bot.memory.connection import Connection
from bot.memory.recall.dates import DateHint, SpanHint
from bot.memory.recall.retrieval import TEACHER_COLUMN, Candidate, rank
from bot.memory.scope import ACTIVE, key_filter
from bot.memory.storage import storage_of

# A stored interval is at most this long for the search (longer ones are found by their start
# only): "last year" is the longest span a phrase names.
REACH_BACK = timedelta(days=366)
SCANNED = 500   # dated rows read at most per recall


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


def dated(conn: Connection, ranked: list[Candidate], hints: Sequence[DateHint], keys: list[str],
          as_of: float | None, limit: int) -> list[Candidate]:
    """`ranked` and, after it, up to `limit` of the viewer's memories under `keys` whose event happens
    on a relative date the question names and that no path found (see the module doc)."""
    spans = [hint.span for hint in hints if isinstance(hint, SpanHint)]
    if not spans or not keys or limit <= 0:
        return ranked
    where, key_params = key_filter(keys, "vis_key")
    # the stored text starts with its first day (fixed width: any collation orders it as dates)
    bounds = " OR ".join("(happens_on >= ? AND substr(happens_on, 1, 10) <= ?)" for _ in spans)
    params: list = [*key_params]
    for span in spans:
        params += [(span.first - REACH_BACK).isoformat(), span.last.isoformat()]
    # SQLite's planner, without statistics for the new index, would walk every memory of the keys
    index = " INDEXED BY memories_happens" if storage_of(conn).name == "sqlite" else ""
    sql = (f"SELECT id, happens_on, {TEACHER_COLUMN} FROM memories{index} WHERE {where} AND happens_on IS NOT NULL "
           f"AND {ACTIVE} AND ({bounds})" + (" AND created_at <= ?" if as_of is not None else "")
           + f" ORDER BY created_at DESC, id DESC LIMIT {SCANNED}")
    if as_of is not None:
        params.append(as_of)
    known = {c.memory_id for c in ranked}
    floor = min((c.fused for c in ranked), default=1.0)
    added: list[Candidate] = []
    for memory_id, happens_on, teacher in conn.execute(sql, params):
        stored = clocks.parse(happens_on)
        if memory_id in known or stored is None or not any(stored.overlaps(named) for named in spans):
            continue
        added.append(Candidate(memory_id, fused=floor, teacher=teacher, teacher_read=True))
        if len(added) >= limit:
            break
    return ranked + added
