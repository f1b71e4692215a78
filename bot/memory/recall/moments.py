"""One memory of a moment in the top list: the rest of a text written in parts go below the cut.

A text longer than a memory may be is imported in parts, each its own memory stored at the same
moment under the same key. The parts share most of their words and meaning and lend to each
other (the neighbour loan), so two or three of them climb together and take places in the top
list that other memories would hold: on BEAM's long messages, more than half of the top-10 lists
held two parts of one message. Here, among the candidates up to the cut, a memory stored at
exactly the same moment and under the same visibility key as one ranked above it moves just below
the cut (in its order), where it still fills the list when too few others are there. Memories of
one moment that are distinct facts of one exchange (linked `co_extracted` when extraction wrote
them) keep their places; so does every memory of a moment no better one shares. Measured on
LoCoMo and BEAM dev, both backends (docs/performance.md, "One memory of a moment"): it has no
parameter.
"""
from __future__ import annotations

from bot.memory.connection import Connection
from bot.memory.recall.retrieval import Candidate


def one_each(conn: Connection, ranked: list[Candidate], limit: int) -> list[Candidate]:
    """`ranked` with the first `limit` places going, in order, to candidates that share no moment
    (and key, and no `co_extracted` link) with one placed before them; those deferred follow just
    below, then the rest (the module doc). Reads nothing when no two candidates share a stored time."""
    stored = {c.memory_id: c.vitals[3] for c in ranked if c.vitals is not None}
    unread = [c.memory_id for c in ranked if c.vitals is None]
    if unread:  # the neighbour loan and the time factor read them when they run (the defaults)
        stored.update(conn.execute(f"SELECT id, created_at FROM memories WHERE id IN ({','.join('?' * len(unread))})",
                                   unread))
    times: dict[float, list[int]] = {}
    for c in ranked:
        if c.memory_id in stored:
            times.setdefault(float(stored[c.memory_id]), []).append(c.memory_id)
    ids = [memory_id for group in times.values() if len(group) > 1 for memory_id in group]
    if not ids:
        return ranked
    marks = ",".join("?" * len(ids))
    keys = dict(conn.execute(f"SELECT id, vis_key FROM memories WHERE id IN ({marks})", ids))
    linked = {frozenset(pair) for pair in conn.execute(
        f"SELECT source_id, target_id FROM memory_links WHERE kind = 'co_extracted' AND source_id IN ({marks}) "
        f"AND target_id IN ({marks})", [*ids, *ids])}
    placed: list[Candidate] = []
    deferred: list[Candidate] = []
    seen: dict[tuple[float, str], list[int]] = {}  # (moment, key) -> the memories placed from it
    for i, c in enumerate(ranked):
        if len(placed) >= limit:
            return placed + deferred + ranked[i:]
        moment = (float(stored[c.memory_id]), keys[c.memory_id]) if c.memory_id in keys else None
        if moment is not None and any(frozenset((k, c.memory_id)) not in linked for k in seen.get(moment, ())):
            deferred.append(c)
            continue
        placed.append(c)
        if moment is not None:
            seen.setdefault(moment, []).append(c.memory_id)
    return placed + deferred
