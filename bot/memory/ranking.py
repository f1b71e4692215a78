"""The final order of recalled memories, and which of them count as recalled (touch).

Relevance decides, time breaks near-ties. Each candidate's fused relevance (RRF of its
BM25 rank and its vector rank, plus the neighbour loan: retrieval.fuse and
retrieval.spread_to_neighbours; neither path looks at time) is multiplied by a small
time factor:

    score    = relevance x (1 + TIME_WEIGHT x vitality)
    vitality = retention x (1 + importance) / 2          in [0, 1]
    retention = exp(-days since last recall (or creation) / stability)   (bot/memory/decay.py)

With the chosen weight (0.1) a fresh, important memory gains at most 10 %: enough to
order two near-equally relevant memories, never enough to lift an irrelevant recent one
over a relevant old one (adjacent fused ranks differ by 15-25 % at RRF k = 3).
The seed ranked keyword hits by BM25 x strength x (1 + importance), which let a
months-old memory fall below everything said this week (bench/README.md).

Touch (a recall strengthens a memory) goes only to memories that were relevant:
cosine to the query at least the embedding model's floor (TOUCH_FLOORS, measured on
LoCoMo; MUNINN_TOUCH_MIN_COSINE overrides). Without a query vector (keyword-only
recall) every returned keyword hit counts, as before.
"""
from __future__ import annotations

import math
import struct
from typing import Iterable, Sequence

import apsw

from bot.memory import decay, vectors
from bot.memory.retrieval import Candidate, rank

TIME_WEIGHT = 0.1

# Cosine floors per embedding model family (the name before the tag), measured on the
# LoCoMo dev split (bench/README.md, "Touch floor"). Unknown models use the relative rule.
TOUCH_FLOORS: dict[str, float] = {"all-minilm": 0.3}
# For models without a measured floor: relevant = within this share of the best hit's cosine.
RELATIVE_FLOOR = 0.75


def vitality(now: float, last_seen: float, stability: float, importance: float) -> float:
    """How alive a memory is, 0..1: its retention, weighted by importance."""
    return decay.retention(now, last_seen, stability) * (1.0 + importance) / 2.0


def time_factor(vital: float, weight: float = TIME_WEIGHT) -> float:
    return 1.0 + weight * vital


def apply_time(conn: apsw.Connection, candidates: Iterable[Candidate], now: float,
               weight: float = TIME_WEIGHT) -> list[Candidate]:
    """Re-rank by relevance x time factor (see the module doc)."""
    pool = list(candidates)
    if not pool or weight == 0:
        return rank(pool)
    ids = [c.memory_id for c in pool]
    rows = conn.execute(
        "SELECT id, coalesce(last_accessed, created_at), stability, importance FROM memories "
        f"WHERE id IN ({','.join('?' * len(ids))})", ids)
    vital = {row[0]: vitality(now, row[1], row[2], row[3]) for row in rows}
    for cand in pool:
        cand.fused *= time_factor(vital.get(cand.memory_id, 0.0), weight)
    return rank(pool)


def measure_similarity(conn: apsw.Connection, info: vectors.IndexInfo, query_vector: Sequence[float],
                       candidates: Iterable[Candidate]) -> None:
    """Give every candidate its cosine to the query; the vector path's hits know it already,
    the others (keyword hits, graph links) read their stored vector."""
    unknown = {c.memory_id: c for c in candidates if c.cosine is None}
    if not unknown:
        return
    norm = math.hypot(*query_vector) or 1.0
    query = [x / norm for x in query_vector]
    rows = conn.execute(f"SELECT memory_id, embedding FROM vec_memories WHERE memory_id IN "
                        f"({','.join('?' * len(unknown))})", list(unknown))
    for memory_id, blob in rows:
        stored = struct.unpack(f"{info.dim}f", blob)  # stored vectors are unit length
        unknown[memory_id].similarity = sum(a * b for a, b in zip(query, stored))


def touch_floor(model: str, override: float | None) -> float | None:
    """The absolute cosine floor for this model, or None to use the relative rule."""
    if override is not None:
        return override
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
