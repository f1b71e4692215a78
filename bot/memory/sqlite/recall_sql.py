"""SQLite's own steps of recall: the keyword path through FTS5, the vector path through the
vector cache (vec0 behind it), and the cosines of the chosen memories. The steps both backends
share are in bot/memory/recall/."""
from __future__ import annotations

from typing import Iterable, Sequence

from bot.memory.connection import Connection
from bot.memory.recall.retrieval import Candidate, KeywordHits
from bot.memory.sqlite import fts
from bot.memory.sqlite import vec0 as vectors


def fts_candidates(conn: Connection, query: str, keys: list[str], limit: int,
                   as_of: float | None = None) -> KeywordHits:
    """Keyword path: BM25 alone (time is ranking.py's business), scoped, active only."""
    planned = fts.plan(conn, query, keys, as_of)
    found = KeywordHits()
    found.searched = planned.words
    if planned.hits is None:
        return found
    hits, params = planned.hits  # `hits(id, relevance)`: matches first or the visible set first (fts.py)
    # Every hit is an active, visible memory already (fts.py checks its row): joining memories
    # again cost one row lookup per hit, a large share of the query.
    sql = (
        f"WITH {hits} "
        "SELECT h.id, h.relevance AS score "  # relevance only: time enters later, as a tie-breaker (ranking.py)
        "FROM hits h ORDER BY score ASC, h.id DESC LIMIT ?")
    params += [limit]
    found.extend(Candidate(row[0], fts_rank=rank, fts_score=row[1])
                 for rank, row in enumerate(conn.execute(sql, params), start=1))
    return found


def vector_candidates(conn: Connection, info: vectors.IndexInfo, query_vector: list[float],
                      keys: list[str], limit: int, as_of: float | None = None) -> list[Candidate]:
    """Semantic path: KNN inside the viewer's visibility keys."""
    return [Candidate(memory_id, vector_rank=rank, distance=distance)
            for rank, (memory_id, distance) in enumerate(
                vectors.knn(conn, info, query_vector, keys, limit, as_of), start=1)]


def measure_similarity(conn: Connection, query_vector: Sequence[float], candidates: Iterable[Candidate],
                       info: vectors.IndexInfo | None = None, *, after_search: bool = False) -> None:
    """Give every candidate its cosine to the query; the vector path's hits know it already,
    the others (keyword hits, graph links) get it from their stored vector (vectors.cosines:
    the search cache, or vec0 point lookups). `after_search`: the vector search has just run on
    `conn` (and brought the cache up to date): outside a transaction the change log is not read
    again (two statements per recall)."""
    unknown = {c.memory_id: c for c in candidates if c.cosine is None}
    if not unknown:
        return
    info = info or vectors.index_info(conn)
    if info is None:
        return
    synced = after_search and conn.get_autocommit()
    for memory_id, cosine in vectors.cosines(conn, info, query_vector, list(unknown), synced=synced).items():
        unknown[memory_id].similarity = cosine
