"""The final order of recalled memories, and which of them count as recalled (touch).

Relevance decides, time breaks near-ties. Each candidate's fused relevance (RRF of its
BM25 rank and its vector rank, plus the neighbour loan: retrieval.fuse and
retrieval.spread_to_neighbours; neither looks at time) is multiplied by two factors:

    score     = relevance x (1 + TIME_WEIGHT x vitality) x (1 + DATE_BOOST if stored on a date the query names)
    vitality  = retention x (1 + importance) / 2                      in [0, 1]
    retention = exp(-days since last recall (or creation) / stability)   (bot/memory/decay.py)

With TIME_WEIGHT 0.02 a fresh, important memory gains at most 2 %: enough to order two
equally relevant memories, never enough to lift an irrelevant recent one over a relevant
old one (adjacent RRF ranks differ by 7-25 % at k = 3). Larger weights only lost quality
on LoCoMo: there, time says nothing about relevance, and what was
touched for earlier questions got lifted for later ones. The seed ranked keyword hits by
BM25 x strength x (1 + importance), so a months-old memory fell below anything said this
week (ranking by relevance first raised hybrid recall on LoCoMo dev asked the day after).
Decay, strength and importance still decide what maintenance archives.

One exception to the product: when the best keyword match's BM25 beats the runner-up's
by KEYWORD_LEAD (1.1x), it leads the list (keyword_winner_first): it raised LoCoMo dev's MRR,
most on temporal questions, where porter BM25 alone had beaten the hybrid ranking.

A date the question names ("on 7 July, 2023", "in August": bot/memory/recall/dates.py) doubles
the score of candidates stored on that day or in that month (DATE_BOOST 1.0).

The relevance floor (inject_floor, RecallResult.relevant): when not one recalled memory reaches
the model's floor, none goes into the prompt. Measured on questions asked where their subject
was never discussed (LoCoMo's questions asked of BEAM's chats and the other way round), at the
touch floor no evidence question of either development set lost a memory from its top 10 while
most foreign questions got nothing; dropping single memories under the floor from an otherwise
relevant list lost evidence and spared no noise (bench/README.md, the decision log).

Touch (a recall strengthens a memory) goes only to memories that were relevant:
cosine to the query at least the embedding model's floor (TOUCH_FLOORS, measured on
LoCoMo; MUNINN_TOUCH_MIN_COSINE overrides), or, for a model without a measured floor,
at least RELATIVE_FLOOR x the best cosine among the recalled. Without a query vector
(keyword-only recall) every returned keyword hit counts, as before.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, tzinfo

from bot.memory import decay
from bot.memory.connection import Connection
from bot.memory.recall.dates import DateHint
from bot.memory.recall.retrieval import TEACHER_COLUMN, VITALS_COLUMNS, Candidate, rank

TIME_WEIGHT = 0.02
DATE_BOOST = 1.0
KEYWORD_LEAD = 1.1
# The keyword winner leads only when its cosine is at least this share of the best recalled one
# (0 = always: cross-validated, requiring agreement cost LoCoMo far more than it gained BEAM).
LEAD_AGREEMENT = 0.0

# Cosine floors per embedding model family (the name before the tag), measured on the
# LoCoMo dev split. Unknown models use the relative rule.
TOUCH_FLOORS: dict[str, float] = {"all-minilm": 0.3}
# For models without a measured floor: relevant = within this share of the best hit's cosine.
RELATIVE_FLOOR = 0.5  # on all-minilm this touches about what the 0.3 floor does


def vitality(now: float, last_seen: float, stability: float, importance: float) -> float:
    """How alive a memory is, 0..1: its retention, weighted by importance."""
    return decay.retention(now, last_seen, stability) * (1.0 + importance) / 2.0


def time_factor(vital: float, weight: float = TIME_WEIGHT) -> float:
    """The multiplier a memory's vitality gives its relevance: 1 + weight x vitality."""
    return 1.0 + weight * vital


DECAY_COLUMNS = "id, " + VITALS_COLUMNS  # Candidate.vitals, keyed


def final_order(conn: Connection, candidates: Iterable[Candidate], now: float, *,
                time_weight: float = TIME_WEIGHT, date_hints: Sequence[DateHint] = (),
                date_boost: float = DATE_BOOST, tz: tzinfo = UTC) -> list[Candidate]:
    """Re-rank by relevance x time factor x date factor (see the module doc)."""
    pool = list(candidates)
    if not pool or (time_weight == 0 and not (date_hints and date_boost)):
        return rank(pool)
    # what the neighbour step read already (vitals: retrieval.lenders, PostgreSQL's walk), the rest from
    # their rows, with the teacher the fair share needs next (fair_share.py)
    rows: list[tuple] = [(c.memory_id, *c.vitals) for c in pool if c.vitals is not None]
    unread = {c.memory_id: c for c in pool if c.vitals is None}
    if unread:
        for memory_id, *vitals, teacher in conn.execute(
                f"SELECT {DECAY_COLUMNS}, {TEACHER_COLUMN} FROM memories WHERE id IN ({','.join('?' * len(unread))})",
                list(unread)):
            rows.append((memory_id, *vitals))
            unread[memory_id].vitals = (vitals[0], vitals[1], vitals[2], vitals[3])
            unread[memory_id].teacher, unread[memory_id].teacher_read = teacher, True
    factor = {}
    for memory_id, last_seen, stability, importance, created_at in rows:
        named = any(hint.covers(created_at, tz) for hint in date_hints)
        factor[memory_id] = (time_factor(vitality(now, last_seen, stability, importance), time_weight)
                             * (1.0 + date_boost if named else 1.0))
    for cand in pool:
        cand.fused *= factor.get(cand.memory_id, 1.0)
    return rank(pool)


def keyword_winner_first(ranked: list[Candidate], margin: float = KEYWORD_LEAD) -> list[Candidate]:
    """Put the best keyword match first when its BM25 beats every other keyword match by
    `margin` (x the runner-up's): an exact, clearly-best keyword hit is what the question
    asked for, even when the vector path preferred a looser paraphrase. 0 = off."""
    hits = sorted((c for c in ranked if c.fts_rank is not None), key=lambda c: c.fts_rank or 0)
    if margin <= 0 or len(hits) < 2 or not ranked or ranked[0] is hits[0]:
        return ranked
    best, runner_up = hits[0].fts_score, hits[1].fts_score
    if best is None or runner_up is None or runner_up >= 0 or best / runner_up < margin:  # bm25 < 0: lower is better
        return ranked
    if LEAD_AGREEMENT > 0:
        near = max((cos for c in ranked if (cos := c.cosine) is not None), default=None)
        said = hits[0].cosine
        if near is not None and near > 0 and said is not None and said < LEAD_AGREEMENT * near:
            return ranked  # far in meaning from what the vector path found best: no lead
    return [hits[0]] + [c for c in ranked if c is not hits[0]]


def touch_floor(model: str, override: float | None) -> float | None:
    """The absolute cosine floor for this model, or None to use the relative rule."""
    if override is not None:
        return override
    return TOUCH_FLOORS.get(model.split(":", 1)[0])


def inject_floor(model: str, override: float | None) -> float | None:
    """The relevance floor for what goes into a prompt (RecallResult.relevant): the setting when
    given (a negative one turns it off), else the model's measured touch floor, else None (off:
    a model without a measured floor has no scale to judge a cosine by)."""
    if override is not None:
        return None if override < 0 else override
    return TOUCH_FLOORS.get(model.split(":", 1)[0])


def worth_touching(chosen: Sequence[Candidate], *, vector_ran: bool, floor: float | None) -> list[int]:
    """The ids among `chosen` that were relevant enough to count as recalled."""
    if not vector_ran:
        return [c.memory_id for c in chosen]
    known = [c.cosine for c in chosen if c.cosine is not None]
    if not known:
        return []
    bar = floor if floor is not None else RELATIVE_FLOOR * max(known)
    return [c.memory_id for c in chosen if c.cosine is not None and c.cosine >= bar]
