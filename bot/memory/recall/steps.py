"""Recall's two steps on a read connection, as `Engine.recall` runs them around the embedding call.

The keyword step runs while the question is being embedded: the viewer's visibility keys, the
keyword hits (re-ranked by the names the plain query left out) and the vector index's state.
The search step takes the embedding: vector candidates, fusion, the neighbour loan, the final
order (fusion.py; with events on a date the question names: happens.py; newer before older where
two disagree: newer.py; one memory of a moment in the top list: moments.py), the fair share of
each member (fair_share.py), the graph walk, and each chosen memory's
cosine to the question.

`read_steps` runs both as one job when the question's vector is ready by the time the keyword
step ends (given by the caller, or embedded while the job waited for a reader, as it does when
many recalls are in flight): each job is a hand-off from the event loop to a reader thread and
back, and on two cores each hand-off costs the process GIL switches between its threads.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

from bot.memory import records
from bot.memory.recall import fair_share, fusion, happens, moments, newer, ranking, retrieval, subqueries
from bot.memory.recall.beside import WalkBeside
from bot.memory.recall.dates import DateHint
from bot.memory.recall.retrieval import Candidate, VectorStatus
from bot.memory.scope import Viewer
from bot.memory.storage import Storage
from bot.memory.vectors.index import IndexInfo
from bot.settings import Settings

# The candidates each path brings to the fusion, per memory asked for (bench/fusion_cv.py's grid
# can set them). A deeper keyword list scored better on SQLite but put a group under a baseline on
# PostgreSQL (docs/performance.md, "Where hybrid trails a baseline"): both stay at the same depth.
VECTOR_DEPTH = 3
KEYWORD_DEPTH = 3


@dataclass
class KeywordStep:
    """What the keyword step found, and the index state the search step needs."""
    keys: list[str]                 # the viewer's visibility keys
    hits: list[Candidate]           # keyword hits, best first
    info: IndexInfo | None          # the vector index (None: there is none)
    partial: bool                   # a re-index is pending: some vectors are missing
    viewer_id: int | None = None    # who asks: their own memories never count against a member's share
    query: str = ""                 # what was asked (the fair share's second look searches it again)


@dataclass
class SearchStep:
    """The chosen memories (fused, ordered, plus linked ones), the recall's mode, and the
    step's timings in ms ("vector", "fuse_graph_touch")."""
    chosen: list[Candidate]
    mode: str
    timings_ms: dict[str, float] = field(default_factory=dict)


def keyword_step(conn: Any, storage: Storage[Any], query: str, viewer: Viewer, candidates: int,
                 as_of: float | None, beside: WalkBeside | None = None) -> KeywordStep:
    """The viewer's keys, their keyword hits and the vector index's state, as of one moment;
    with `beside`, the vector search starts on another reader once the keys are known."""
    keys = storage.visible_keys(conn, viewer)
    if beside is not None:
        beside.keys_known(keys)
    hits, (info, partial) = storage.keyword_step(conn, query, keys, candidates, as_of)
    # names the plain query left out as too common re-rank its hits (subqueries.py)
    fused = subqueries.fuse_keyword_lists(hits, subqueries.name_hits(conn, query, hits), candidates)
    return KeywordStep(keys, fused, info, partial, viewer.user_id, query)


def search_step(conn: Any, storage: Storage[Any], settings: Settings, found: KeywordStep,
                vector: list[float] | None, limit: int, now: float, as_of: float | None,
                date_hints: Sequence[DateHint] = (), beside: WalkBeside | None = None) -> SearchStep:
    """Vector candidates (when `vector` is usable; `beside`'s walk when it searched them), fused
    with the keyword hits, ordered, cut to `limit` with no other member past their share, then
    the graph's linked memories (within the shares too); measured against the question's vector."""
    t0 = time.perf_counter()
    keys, info, depth = found.keys, found.info, limit * VECTOR_DEPTH
    walked = beside.take(info, vector, keys) if beside is not None else None
    if walked is not None:
        vector_hits = walked
    else:
        vector_hits = (storage.vector_candidates(conn, info, vector, keys, depth, as_of)
                       if vector is not None and info is not None else [])
    if vector is not None and vector_hits and found.hits and settings.fusion == fusion.SCORES:
        # score fusion weighs every keyword hit's cosine too (the vector cache has them at hand);
        # those the vector search found carry theirs already
        near = {c.memory_id for c in vector_hits}
        storage.measure_similarity(conn, vector, [c for c in found.hits if c.memory_id not in near], info)
    t1 = time.perf_counter()
    fused = fusion.fuse(found.hits, vector_hits, settings)
    fused = storage.spread_to_neighbours(conn, fused, keys, settings.neighbour_share, as_of)
    fused = happens.dated(conn, fused, date_hints, keys, as_of, limit)
    fused = storage.final_order(conn, fused, now, time_weight=settings.time_weight, date_hints=date_hints,
                                date_boost=settings.date_boost, tz=settings.timezone)
    fused = happens.lift(conn, fused, date_hints, settings.date_boost, settings.timezone)
    if fusion.keywords_count(settings):
        fused = ranking.keyword_winner_first(fused, settings.keyword_lead)
    fused = newer.newer_first(conn, fused, limit, dated=bool(date_hints),
                              question=found.query if settings.changed_value_first else "")
    fused = moments.one_each(conn, fused, limit)
    fair = fair_share.FairShare(found.viewer_id, fair_share.share_of(limit))
    relevant = fair_share.relevance(fused, ranking.touch_floor(settings.embed_model, settings.touch_min_cosine))
    cut = fair_share.fair_cut(conn, fused, limit, fair, relevant)
    keyword, semantic = len(found.hits) >= limit * KEYWORD_DEPTH, len(vector_hits) >= depth
    if fair.filled and (keyword or semantic):
        # one member's memories filled the list, and a search stopped at its depth: the others' may lie deeper
        fill = fair_share.deeper(conn, storage, settings, found.query, keys, info, vector, depth, as_of, fused,
                                 keyword=keyword, semantic=semantic)
        if fill:
            fair = fair_share.FairShare(found.viewer_id, fair.share)
            cut = fair_share.fair_cut(conn, fused + fill, limit, fair, relevant)
    chosen = cut + storage.graph_neighbours(conn, cut, keys, settings.graph_limit, as_of, fair.admit)
    if vector is not None and chosen:
        storage.measure_similarity(conn, vector, chosen, info)
    t2 = time.perf_counter()
    return SearchStep(chosen, retrieval.mode_of(vector is not None, found.hits),
                      {"vector": (t1 - t0) * 1000, "fuse_graph_touch": (t2 - t1) * 1000})


Question = tuple[list[float] | None, VectorStatus]  # the question's vector (None: none) and why


class VectorSlot:
    """The question's vector once the embedding is done: set on the event loop (`take`, a done
    callback of the embedding task, or `value` for a vector the caller gave), read once by the
    reader that ends the keyword step (one attribute: no lock needed). With `beside`, the vector
    is handed to it too, which starts the vector search on another reader (beside.py)."""

    def __init__(self, value: Question | None = None, beside: WalkBeside | None = None) -> None:
        """`value`: ready from the start (a vector the caller gave)."""
        self.value = value
        self.beside = beside
        if value is not None and beside is not None:
            beside.vector_known(value[0])

    def take(self, task: asyncio.Future) -> None:
        """The embedding task's answer, when it has one (a failure is for the recall to await)."""
        if not task.cancelled() and task.exception() is None:
            self.value = task.result()
            if self.beside is not None:
                self.beside.vector_known(self.value[0])


def checked_vector(vector: list[float] | None, status: VectorStatus, found: KeywordStep,
                   embed_model: str) -> tuple[list[float] | None, VectorStatus, tuple[str, str] | None]:
    """The question's vector if the index can take it, its status, and a warning to log once
    (key, text) when the index and the model disagree."""
    info = found.info
    if vector is None:
        return None, status, None
    if info is None:
        return None, VectorStatus.NO_EMBEDDINGS, None
    if info.model != embed_model:
        return None, VectorStatus.MODEL_MISMATCH, ("mismatch", f"vectors were made with {info.model!r}, "
                                                   f"OLLAMA_EMBED_MODEL is {embed_model!r}: run `muninn reindex`")
    if len(vector) != info.dim:
        return None, VectorStatus.WRONG_SIZE, ("wrong-size", f"{embed_model} returned a {len(vector)}-dimensional "
                                               f"vector, the index holds {info.dim}: run `muninn reindex`")
    if found.partial:  # a re-index is under way or was interrupted: some vectors are missing
        return vector, VectorStatus.PARTIAL, None
    return vector, status, None


@dataclass
class Reading:
    """What `read_steps` did in one job: the keyword step always; the search step (with the
    vector it took) when the vector was ready; the memories when it also loaded them."""
    found: KeywordStep
    keyword_done: float                              # time.perf_counter() at the keyword step's end
    searched: SearchStep | None = None               # None: the vector was not ready, search in a job of its own
    vector: list[float] | None = None
    status: VectorStatus = VectorStatus.OK
    warning: tuple[str, str] | None = None           # checked_vector's
    loaded: dict[int, records.Memory] | None = None  # the chosen memories, when asked to load (no touch)
    beside: WalkBeside | None = None                 # the vector search on another reader (beside.py)


def read_steps(conn: Any, storage: Storage[Any], settings: Settings, query: str, viewer: Viewer, limit: int,
               now: float, as_of: float | None, date_hints: Sequence[DateHint], slot: VectorSlot,
               load: bool) -> Reading:
    """The keyword step, then, if `slot` holds the vector by then, `search_into` on the same
    connection: one job instead of two (three with `load`). With the slot's `beside`, the vector
    search runs on another reader while the keyword step does."""
    found = keyword_step(conn, storage, query, viewer, limit * KEYWORD_DEPTH, as_of, slot.beside)
    reading = Reading(found, time.perf_counter(), beside=slot.beside)
    ready = slot.value
    if ready is None:
        if slot.beside is not None:  # a walk started by now is still taken by the search step's job
            slot.beside.no_more()
        return reading
    return search_into(conn, storage, settings, reading, ready, limit, now, as_of, date_hints, load)


def search_into(conn: Any, storage: Storage[Any], settings: Settings, reading: Reading, question: Question,
                limit: int, now: float, as_of: float | None, date_hints: Sequence[DateHint], load: bool) -> Reading:
    """The search step with the question's vector (checked_vector), into `reading`; with `load`,
    the chosen memories as they are too (a recall that does not touch)."""
    reading.vector, reading.status, reading.warning = checked_vector(*question, reading.found, settings.embed_model)
    reading.searched = search_step(conn, storage, settings, reading.found, reading.vector, limit, now, as_of,
                                   date_hints, reading.beside)
    if load:
        reading.loaded = storage.get_many(conn, [c.memory_id for c in reading.searched.chosen])
    return reading
