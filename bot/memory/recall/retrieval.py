"""Hybrid retrieval, the seed design step by step: FTS5 path, vector path, Reciprocal
Rank Fusion, a 1-hop walk of the link graph, touch.

The database steps are plain functions on a connection (they run on the engine's
database thread); `Engine.recall` strings them together with the embedding call.
Every path filters by `scope.visible_keys`, and only active memories are returned.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Callable, Iterable

from bot.memory import records
from bot.memory.connection import Connection
from bot.memory.scope import ACTIVE, key_filter
from bot.memory.vectors.index import cosine_from_distance

GRAPH_LINK_KINDS = ("co_extracted", "consolidated", "semantic")

MODE_HYBRID = "hybrid"
MODE_FTS = "fts-only"
MODE_VECTOR = "vector-only"

# Candidate.vitals as a memories row gives them (the columns of ranking.DECAY_COLUMNS after id).
VITALS_COLUMNS = "coalesce(last_accessed, created_at), stability, importance, created_at"


def teacher_column(table: str = "") -> str:
    """Candidate.teacher as a memories row (of `table`, when given) gives it: who taught a room memory."""
    prefix = f"{table}." if table else ""
    return f"CASE WHEN {prefix}scope = 'room' THEN {prefix}owner_id END"


TEACHER_COLUMN = teacher_column()  # fair_share.py


@dataclass
class Candidate:
    """One memory on its way through retrieval, with why it was picked."""
    memory_id: int
    fts_rank: int | None = None
    fts_score: float | None = None      # bm25; lower is better
    vector_rank: int | None = None
    distance: float | None = None       # L2 between unit vectors
    fused: float = 0.0
    link: dict | None = None            # {"from": id, "kind": ..., "weight": ...} for graph additions
    neighbour_of: int | None = None     # the hit stored next to it that lent it score (spread_to_neighbours)
    similarity: float | None = None     # cosine to the query, for what recall returns (each backend's recall_sql)
    touched: bool | None = None         # counted as recalled (above the touch floor); None = touch was off
    outdated_by: int | None = None      # a newer memory recalled with it says otherwise (newer.py)
    # (last recalled or created, stability, importance, created_at) as the neighbour step read them,
    # for ranking.final_order (which then reads no row again); None = not read
    vitals: tuple[float, float, float, float] | None = field(default=None, repr=False, compare=False)
    # who taught it, for the fair share (fair_share.py): a room memory's owner, None for a personal or
    # global one; read from the row the neighbour step, the final order or the graph walk read (teacher_read)
    teacher: int | None = field(default=None, repr=False, compare=False)
    teacher_read: bool = field(default=False, repr=False, compare=False)

    @property
    def cosine(self) -> float | None:
        """Cosine to the query: the measured similarity, else from the vector distance (None: neither)."""
        if self.similarity is not None:
            return self.similarity
        return None if self.distance is None else cosine_from_distance(self.distance)

    @property
    def via(self) -> str:
        """Which path found it: "link", "both", "fts" or "vector"."""
        if self.link is not None:
            return "link"
        if self.fts_rank is not None and self.vector_rank is not None:
            return "both"
        return "fts" if self.fts_rank is not None else "vector"

    def reason(self) -> dict:
        """Why it was picked, as shown by `recall` and `/memory search`: path, ranks, scores, link."""
        out: dict = {"via": self.via}
        if self.fts_rank is not None:
            out["fts_rank"] = self.fts_rank
            out["fts_score"] = float(f"{self.fts_score:.6g}")
        if self.vector_rank is not None and self.distance is not None:
            out["vector_rank"] = self.vector_rank
        if self.cosine is not None:
            out["cosine"] = round(self.cosine, 4)
        if self.neighbour_of is not None:
            out["neighbour_of"] = self.neighbour_of
        if self.link is not None:
            out["link"] = self.link
        else:
            out["fused_score"] = float(f"{self.fused:.6g}")
        if self.touched is not None:
            out["touched"] = self.touched
        if self.outdated_by is not None:
            out["outdated_by"] = self.outdated_by
        return out


@dataclass
class Recalled:
    """A memory recall returns, with the candidate that says why."""
    memory: records.Memory
    candidate: Candidate

    def to_dict(self, now: float | None = None) -> dict:
        """The memory's to_dict with its "reason"."""
        out = self.memory.to_dict(now)
        out["reason"] = self.candidate.reason()
        return out


class VectorStatus(StrEnum):
    """Why the vector path did or did not run (shown by `recall` and `/memory search`)."""
    OK = "ok"
    PARTIAL = "partial"                # a reindex is unfinished: some memories have no vector yet
    DISABLED = "disabled"              # no OLLAMA_URL
    EMPTY_QUERY = "empty-query"        # nothing to embed (no letters or digits)
    UNREACHABLE = "unreachable"        # Ollama down or cooling down
    MODEL_MISSING = "model-missing"    # the embedding model is not pulled
    BAD_RESPONSE = "bad-response"      # malformed or non-finite embedding
    WRONG_SIZE = "wrong-size"          # the model's dimension differs from the index
    NO_EMBEDDINGS = "no-embeddings"    # nothing is embedded yet
    MODEL_MISMATCH = "model-mismatch"  # the index was made with another model: reindex


@dataclass
class RecallResult:
    """What a recall returns: the memories in order, the mode and vector status, and the timings."""
    query: str
    mode: str
    vector_status: VectorStatus
    memories: list[Recalled] = field(default_factory=list)
    timings_ms: dict = field(default_factory=dict)
    # the relevance floor (ranking.inject_floor): the cosine to the question at least one memory
    # needs for any to be put into a prompt; None: no floor (the vector path did not run, or the
    # embedding model has no measured floor)
    floor: float | None = None

    def relevant(self) -> list[Recalled]:
        """The memories worth putting into a prompt: all of them, in order, when at least one
        reaches the relevance floor; none when none does (a question about something never
        discussed: nothing is better than noise). Without a floor, or without any cosine
        (vectors missing), all of them."""
        floor = self.floor
        known = [cos for r in self.memories if (cos := r.candidate.cosine) is not None]
        if floor is None or not known or max(known) >= floor:
            return list(self.memories)
        return []

    @property
    def texts(self) -> list[str]:
        """The recalled memories' texts, in order."""
        return [r.memory.text for r in self.memories]

    @property
    def ids(self) -> list[int]:
        """The recalled memories' ids, in order."""
        return [r.memory.id for r in self.memories]

    def to_dict(self, now: float | None = None) -> dict:
        """The result as JSON-ready data (timings rounded to the microsecond); `for_prompt`: how
        many of the memories a reply's prompt would get (the relevance floor's verdict)."""
        return {"query": self.query, "mode": self.mode, "vector_status": self.vector_status,
                "relevance_floor": self.floor, "for_prompt": len(self.relevant()),
                "memories": [r.to_dict(now) for r in self.memories],
                "timings_ms": {k: round(v, 3) for k, v in self.timings_ms.items()}}


class KeywordHits(list[Candidate]):
    """The keyword path's hits, and the words it searched (`searched`: the name re-rank of
    subqueries.py needs them; a backend that does not say leaves it None and is asked again)."""
    searched: list[str] | None = None


def fuse(fts_hits: list[Candidate], vector_hits: list[Candidate], *, k: float, limit: int,
         weight_fts: float = 1.0, weight_vector: float = 1.0) -> list[Candidate]:
    """Reciprocal Rank Fusion: score = w_f/(k + rank_fts) + w_v/(k + rank_vec)."""
    merged: dict[int, Candidate] = {}
    for hit in fts_hits:
        merged[hit.memory_id] = Candidate(hit.memory_id, fts_rank=hit.fts_rank, fts_score=hit.fts_score)
    for hit in vector_hits:
        cand = merged.setdefault(hit.memory_id, Candidate(hit.memory_id))
        cand.vector_rank, cand.distance = hit.vector_rank, hit.distance
    for cand in merged.values():
        if cand.fts_rank is not None:
            cand.fused += weight_fts / (k + cand.fts_rank)
        if cand.vector_rank is not None:
            cand.fused += weight_vector / (k + cand.vector_rank)
    return rank(merged.values())[:limit]


def rank(candidates) -> list[Candidate]:
    """Best fused score first."""
    # Ties go to the better single rank, then to keyword evidence (it is exact), then to the newer memory.
    return sorted(candidates, key=_rank_key)


_NO_RANK = 10**9


def _rank_key(c: Candidate) -> tuple[float, int, bool, int]:
    # rank() sorts every recall's candidates three times (fuse, neighbour loan, final order): no
    # generator per candidate (it counts in every recall's CPU)
    fts_rank, vector_rank = c.fts_rank, c.vector_rank
    if fts_rank is None:
        best = _NO_RANK if vector_rank is None else vector_rank
    else:
        best = fts_rank if vector_rank is None or fts_rank <= vector_rank else vector_rank
    return (-c.fused, best, fts_rank is None, -c.memory_id)


NEIGHBOUR_WINDOW_S = 3600.0
# Each hit lends to the NEIGHBOUR_REACH memories on either side of it; the one n places away
# gets share x NEIGHBOUR_FALLOFF^(n-1). On LoCoMo dev, reach 2 at falloff 0.8 raised hybrid
# recall over reach 1; reach 3-4 and other falloffs were flat.
NEIGHBOUR_REACH = 2
NEIGHBOUR_FALLOFF = 0.8


def spread_to_neighbours(conn: Connection, ranked: list[Candidate], keys: list[str], share: float,
                         as_of: float | None = None, *, reach: int | None = None) -> list[Candidate]:
    """Re-rank: each hit lends `share` of its fused score to the hits stored just before and
    just after it under the same visibility key, and a falling share to those up to `reach`
    places away (within NEIGHBOUR_WINDOW_S of the hit; the largest loan counts). What was
    said around a matching line is its context: an answer often shares few words with the
    question while the line before it shares many (the loan raised hybrid recall on LoCoMo
    dev). Only candidates are re-ranked; nothing new surfaces."""
    reach = NEIGHBOUR_REACH if reach is None else reach
    if share <= 0 or not ranked or reach <= 0:
        return ranked
    by_id = {c.memory_id: c for c in ranked}
    # Only a hit with another candidate under its key within the window can lend anything: walk
    # from those alone, the same loans for less (the walk from every hit was a noticeable share of
    # a recall's CPU; where candidates are spread over months none is walked).
    ids = lenders(conn, by_id, keys)
    if not ids:
        return rank(by_id.values())
    marks = ",".join("?" * len(ids))
    where, key_params = key_filter(keys, "vis_key")
    step = ("(SELECT {agg}(p.id) FROM memories p WHERE p.vis_key = w.vis_key AND p.id {op} w.other AND p."
            + ACTIVE + ")")
    # One statement: a walk of the (vis_key, id) index, `reach` steps each side of every hit.
    # The time tests are applied to what it finds, so no step ever scans for a memory in the window.
    sql = (
        "WITH RECURSIVE walk(hit, vis_key, t, dir, other, places) AS ("
        f"SELECT id, vis_key, created_at, -1, id, 0 FROM memories WHERE id IN ({marks}) AND {where} UNION ALL "
        f"SELECT id, vis_key, created_at, 1, id, 0 FROM memories WHERE id IN ({marks}) AND {where} UNION ALL "
        f"SELECT hit, vis_key, t, dir, CASE WHEN dir < 0 THEN {step.format(agg='max', op='<')} "
        f"ELSE {step.format(agg='min', op='>')} END, places + 1 FROM walk w WHERE places < ? AND other IS NOT NULL) "
        "SELECT w.hit, w.other, w.places FROM walk w JOIN memories m ON m.id = w.other "
        "WHERE w.places > 0 AND abs(m.created_at - w.t) <= ?" + (" AND m.created_at <= ?" if as_of is not None else ""))
    params: list = [*ids, *key_params, *ids, *key_params, reach, NEIGHBOUR_WINDOW_S]
    if as_of is not None:
        params.append(as_of)
    return lend_to_neighbours(by_id, conn.execute(sql, params), share)


def lenders(conn: Connection, by_id: dict[int, Candidate], keys: list[str]) -> list[int]:
    """Those of the candidates (under `keys`) that have another of them under the same key stored
    within NEIGHBOUR_WINDOW_S: the only hits whose neighbour loan can reach a candidate. Gives
    each the `vitals` the final order needs, and the `teacher` the fair share needs, from the same rows."""
    where, key_params = key_filter(keys, "vis_key")
    times: dict[str, list[tuple[float, int]]] = {}
    for memory_id, last_seen, stability, importance, created_at, vis_key, teacher in conn.execute(
            f"SELECT id, {VITALS_COLUMNS}, vis_key, {TEACHER_COLUMN} FROM memories "
            f"WHERE id IN ({','.join('?' * len(by_id))}) AND {where}", [*by_id, *key_params]):
        times.setdefault(vis_key, []).append((created_at, memory_id))
        cand = by_id[memory_id]
        cand.vitals = (last_seen, stability, importance, created_at)
        cand.teacher, cand.teacher_read = teacher, True
    out: list[int] = []
    for stored in times.values():
        stored.sort()
        # sorted by time, a hit has a partner within the window iff one of its two sides is one
        for i, (t, memory_id) in enumerate(stored):
            if ((i > 0 and t - stored[i - 1][0] <= NEIGHBOUR_WINDOW_S)
                    or (i + 1 < len(stored) and stored[i + 1][0] - t <= NEIGHBOUR_WINDOW_S)):
                out.append(memory_id)
    return out


def lend_to_neighbours(by_id: dict[int, Candidate], found: Iterable[tuple[int, int, int]],
                       share: float) -> list[Candidate]:
    """spread_to_neighbours' arithmetic over its walk's rows (hit, neighbour, places away):
    PostgreSQL walks with a statement of its own (postgres/backend.py)."""
    # the largest loan wins; an equal one goes to the nearer, then the newer hit, whatever order
    # the walk's rows came in (SQLite's and PostgreSQL's statements order them differently)
    best: dict[int, tuple[float, int, int]] = {}
    for hit, other, places in found:
        amount = share * by_id[hit].fused * NEIGHBOUR_FALLOFF ** (places - 1)
        offer = (amount, -places, hit)
        if other in by_id and amount > 0.0 and offer > best.get(other, (0.0, 0, 0)):
            best[other] = offer
    for other, (amount, _, hit) in best.items():
        cand = by_id[other]
        cand.fused += amount
        cand.neighbour_of = hit
    return rank(by_id.values())


def graph_neighbours(conn: Connection, seeds: list[Candidate], keys: list[str], limit: int,
                     as_of: float | None = None, admit: Callable[[Candidate], bool] | None = None) -> list[Candidate]:
    """1-hop walk from the fused results: up to `limit` linked, visible, active memories (only those
    `admit` takes, when given: the fair share, which sees each one's teacher)."""
    if not seeds or limit <= 0:
        return []
    seed_ids = [c.memory_id for c in seeds]
    marks = ",".join("?" * len(seed_ids))
    kinds = ",".join("?" * len(GRAPH_LINK_KINDS))
    where, key_params = key_filter(keys, "m.vis_key")
    sql = (
        f"SELECT l.seed, l.other, l.kind, l.weight, {teacher_column('m')} FROM ("
        f" SELECT source_id AS seed, target_id AS other, kind, weight FROM memory_links WHERE source_id IN ({marks})"
        " UNION ALL"
        f" SELECT target_id, source_id, kind, weight FROM memory_links WHERE target_id IN ({marks})"
        # CROSS JOIN (SQLite keeps that order; PostgreSQL plans it freely): the links first. With one
        # visible key (a DM of someone without memories) SQLite otherwise walked all of that key's
        # memories to probe each for links (a real cost even with no links at all).
        f") l CROSS JOIN memories m WHERE m.id = l.other AND l.kind IN ({kinds}) AND {where} AND m.{ACTIVE}"
        + (" AND m.created_at <= ?" if as_of is not None else ""))
    params: list = [*seed_ids, *seed_ids, *GRAPH_LINK_KINDS, *key_params]
    if as_of is not None:
        params.append(as_of)
    position = {memory_id: i for i, memory_id in enumerate(seed_ids)}
    rows = sorted(conn.execute(sql, params), key=lambda r: (position[r[0]], -r[3], r[1]))
    taken = set(seed_ids)
    out: list[Candidate] = []
    for seed, other, kind, weight, teacher in rows:
        if other in taken:
            continue
        taken.add(other)
        cand = Candidate(other, link={"from": seed, "kind": kind, "weight": round(weight, 4)},
                         teacher=teacher, teacher_read=True)
        if admit is not None and not admit(cand):
            continue
        out.append(cand)
        if len(out) >= limit:
            break
    return out


def mode_of(vector_ran: bool, fts_hits: list[Candidate]) -> str:
    """Which row of the seed's fallback table applied."""
    if not vector_ran:
        return MODE_FTS
    return MODE_HYBRID if fts_hits else MODE_VECTOR

