"""One memory of a text in the top list: the other parts of a text stored in parts go below the cut.

A text longer than a memory may be is stored in parts (an import's long message, say): each part
its own memory, stored at the same moment under the same visibility key, all naming the same source
message. The parts share most of their words and meaning and lend to each other (the neighbour
loan), so two or three of them climb together and take places in the top list that other memories
would hold. Here, among the candidates up to the cut, a memory stored at exactly the same moment,
under the same key and from a source message of one ranked above it moves just below the cut (in
its order), where it still fills the list when too few others are there. Distinct facts of one
exchange (linked `co_extracted` when extraction wrote them) keep their places; so do memories of
one moment without a shared source (an import whose lines carry only a date, say) and every memory
no better part shares a text with. No parameter; measured in docs/performance.md, "One memory of a
moment in the top list".
"""
from __future__ import annotations

from bot.memory.connection import Connection
from bot.memory.recall.retrieval import Candidate

Text = tuple[float, str, str]  # a text stored in parts: (moment, key, source message)


def one_each(conn: Connection, ranked: list[Candidate], limit: int) -> list[Candidate]:
    """`ranked` with the first `limit` places going, in order, to candidates that are no part of a
    text (same moment, key and source message, no `co_extracted` link) placed before them; those
    deferred follow just below, then the rest (the module doc). Reads nothing when no two
    candidates share a stored time."""
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
    texts, linked = _texts(conn, ids, stored)
    if not texts:
        return ranked
    placed: list[Candidate] = []
    deferred: list[Candidate] = []
    seen: dict[Text, list[int]] = {}  # the memories placed from each text
    for i, c in enumerate(ranked):
        if len(placed) >= limit:
            return placed + deferred + ranked[i:]
        mine = texts.get(c.memory_id, ())
        if any(frozenset((k, c.memory_id)) not in linked for text in mine for k in seen.get(text, ())):
            deferred.append(c)
            continue
        placed.append(c)
        for text in mine:
            seen.setdefault(text, []).append(c.memory_id)
    return placed + deferred


def _texts(conn: Connection, ids: list[int], stored: dict[int, float]) -> tuple[dict[int, list[Text]],
                                                                                  set[frozenset[int]]]:
    """Of `ids` (candidates sharing a moment with another), those that also share a key and a source
    message with another, each with the texts it is a part of; and the pairs among them linked
    `co_extracted` (distinct facts of one exchange, not parts)."""
    marks = ",".join("?" * len(ids))
    holders: dict[Text, list[int]] = {}
    for memory_id, key, message_id in conn.execute(
            "SELECT s.memory_id, m.vis_key, s.message_id FROM memory_sources s JOIN memories m ON m.id = s.memory_id "
            f"WHERE s.memory_id IN ({marks})", ids):
        holders.setdefault((float(stored[memory_id]), key, str(message_id)), []).append(memory_id)
    texts: dict[int, list[Text]] = {}
    for text, members in holders.items():
        if len(members) > 1:
            for memory_id in members:
                texts.setdefault(memory_id, []).append(text)
    shared = list(texts)
    linked: set[frozenset[int]] = set()
    if shared:
        marks = ",".join("?" * len(shared))
        linked = {frozenset(pair) for pair in conn.execute(
            f"SELECT source_id, target_id FROM memory_links WHERE kind = 'co_extracted' AND source_id IN ({marks}) "
            f"AND target_id IN ({marks})", [*shared, *shared])}
    return texts, linked
