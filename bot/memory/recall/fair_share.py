"""No single member can crowd the others out of what recall returns.

Memories taught by one other member (a room memory's owner is who taught it; the viewer's own
memories, personal or room, and global ones never count against anyone) take at most SHARE of
the `limit` memories recall returns: ceil(limit / 2), 3 of 5. Past that, the next relevant
memories of the others take their places, in the final order. Only when nothing else relevant
is left do that member's further memories fill the list, so a question only they can answer
still gets a full one. The graph walk's linked memories count too: a member at their share gets
none of theirs linked in unless the list was already theirs for want of anything else.

"Relevant" is what recall's touch counts as recalled (ranking.worth_touching): a keyword hit, or
a cosine to the question at the embedding model's floor (or half the best candidate's, for a
model without a measured floor). A vector neighbour below it is only a filler: it never takes
the place of a held-back memory that is relevant.

When one member's memories had to fill the list and a search came back as deep as it was asked
(recall asks each path for 3 x limit), the others' may lie just deeper: one more look, DEEPER
times as deep, brings their relevant memories in as fill-ins after the first candidates
(`deeper`). A member who floods a channel with hundreds of better-matching memories can still
push the others past that depth; MUNINN_LEARN_PER_DAY bounds how fast anyone can.

Without one member over their share the list is exactly the plain cut of the final order.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from bot.memory.connection import Connection
from bot.memory.recall import fusion
from bot.memory.recall.ranking import RELATIVE_FLOOR
from bot.memory.recall.retrieval import TEACHER_COLUMN, Candidate
from bot.memory.storage import Storage
from bot.memory.vectors.index import IndexInfo
from bot.settings import Settings

DEEPER = 20          # the second look at the others' memories: this many times the first's depth
DEEPER_MAX = 4000    # and never more (vec0 refuses k > 4096)


def share_of(limit: int) -> int:
    """The most memories of one other member in a list of `limit`: half of it, rounded up."""
    return max(1, math.ceil(limit / 2))


@dataclass
class FairShare:
    """The count of each other member's memories in one recall's list, against their share."""
    viewer_id: int | None
    share: int
    counts: dict[int, int] = field(default_factory=dict)
    filled: bool = False     # a member went past their share: nothing else relevant was left

    def teacher_of(self, cand: Candidate) -> int | None:
        """Who taught `cand` when that counts against a share: another member (never the viewer)."""
        teacher = cand.teacher
        return None if teacher is None or teacher == self.viewer_id else teacher

    def over(self, cand: Candidate) -> bool:
        """Whether `cand`'s teacher already has their share of the list."""
        who = self.teacher_of(cand)
        return who is not None and self.counts.get(who, 0) >= self.share

    def count(self, cand: Candidate) -> None:
        """`cand` is in the list: it counts against its teacher's share."""
        who = self.teacher_of(cand)
        if who is not None:
            self.counts[who] = self.counts.get(who, 0) + 1

    def admit(self, cand: Candidate) -> bool:
        """For the graph walk: whether a linked memory may join the list (and count it)."""
        if self.over(cand) and not self.filled:
            return False
        self.count(cand)
        return True


def relevance(pool: Sequence[Candidate], floor: float | None) -> Callable[[Candidate], bool]:
    """Whether a candidate is relevant (the module doc): a keyword hit, or a vector hit at the cosine
    `floor` (None: RELATIVE_FLOOR x the best cosine in `pool`)."""
    if floor is None:
        best = max((c.cosine for c in pool if c.cosine is not None), default=None)
        floor = None if best is None else RELATIVE_FLOOR * best
    bar = floor

    def relevant(cand: Candidate) -> bool:
        cosine = cand.cosine
        return cand.fts_rank is not None or (bar is not None and cosine is not None and cosine >= bar)
    return relevant


def read_teachers(conn: Connection, pool: Sequence[Candidate]) -> None:
    """Give each candidate whose row no earlier step read its teacher, in one statement."""
    unread = {c.memory_id: c for c in pool if not c.teacher_read}
    if not unread:
        return
    for memory_id, teacher in conn.execute(
            f"SELECT id, {TEACHER_COLUMN} FROM memories WHERE id IN ({','.join('?' * len(unread))})", list(unread)):
        unread[memory_id].teacher, unread[memory_id].teacher_read = teacher, True


def fair_cut(conn: Connection, ranked: list[Candidate], limit: int, fair: FairShare,
             relevant: Callable[[Candidate], bool]) -> list[Candidate]:
    """The first `limit` of `ranked` (in its order) in which no other member passes their share
    while something else relevant is left; `fair` counts what it took, for the graph walk."""
    read_teachers(conn, ranked)
    taken: list[int] = []        # positions in `ranked`
    held: list[int] = []         # over their teacher's share
    passed: list[int] = []       # not relevant, passed over while someone's memories were held
    for i, cand in enumerate(ranked):
        if len(taken) >= limit:
            break
        if fair.over(cand):
            held.append(i)
        elif held and not relevant(cand):
            passed.append(i)
        else:
            fair.count(cand)
            taken.append(i)
    # nothing else relevant is left: the held-back relevant ones first, then the rest in order
    held_set = set(held)
    rest = ([i for i in held if relevant(ranked[i])]
            + sorted([i for i in held if not relevant(ranked[i])] + passed))
    for i in rest[:max(0, limit - len(taken))]:
        fair.filled = fair.filled or i in held_set
        fair.count(ranked[i])
        taken.append(i)
    return [ranked[i] for i in sorted(taken)]


def deeper(conn: Any, storage: Storage[Any], settings: Settings, query: str, keys: list[str],
           info: IndexInfo | None, vector: list[float] | None, depth: int, as_of: float | None,
           pool: Sequence[Candidate], *, keyword: bool, semantic: bool) -> list[Candidate]:
    """The second look (the module doc): the paths that came back `depth` deep (`keyword`,
    `semantic`) searched again DEEPER times as deep, fused among themselves (fusion.py), without the
    candidates of `pool`; fill-ins, ranked after every one of `pool`."""
    k = min(DEEPER_MAX, depth * DEEPER)
    hits = storage.fts_candidates(conn, query, keys, k, as_of) if keyword and query.strip() else []
    near = (storage.vector_candidates(conn, info, vector, keys, k, as_of)
            if semantic and vector is not None and info is not None else [])
    seen = {c.memory_id for c in pool}
    fused = fusion.fuse(hits, near, settings)
    return [c for c in fused if c.memory_id not in seen]
