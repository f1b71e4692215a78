"""PostgreSQL's own recall statements: the search in the server, neighbours and similarities."""
from __future__ import annotations

from typing import Any, Sequence

from bot.memory.postgres.connection import PgConnection
from bot.memory.postgres.vector_forms import vector_literal
from bot.memory.recall import retrieval
from bot.memory.recall.retrieval import TEACHER_COLUMN, VITALS_COLUMNS, Candidate
from bot.memory.vectors import index as vectors
from bot.memory.vectors.cache import VectorCache
from bot.memory.vectors.index import IndexInfo


def server_knn(conn: PgConnection, info: IndexInfo, vector: Sequence[float], keys: list[str], k: int,
               as_of: float | None = None) -> list[tuple[int, float]]:
    """The search in the server: an exact scan of the visible vectors (the vis_key index, then
    a top-N sort); what the vector cache does not hold (migration 9)."""
    if not keys or k <= 0:
        return []
    since = " AND created_at <= %s" if as_of is not None else ""
    extra = [as_of] if as_of is not None else []
    rows = conn.pg.execute(
        f"SELECT memory_id, embedding <-> %s::vector AS d FROM memory_vectors WHERE vis_key = ANY(%s){since} "
        "ORDER BY d, memory_id LIMIT %s".encode(), [vector_literal(vector), keys, *extra, k]).fetchall()
    return [(int(mid), float(d)) for mid, d in rows]


def similar(conn: PgConnection, info: IndexInfo, memory_id: int, keys: list[str], k: int,
            search: Any) -> list[tuple[int, float]]:
    """The k nearest under `keys` to a stored memory's own vector (read from
    `memory_vectors`), found by `search` (the cache's knn or the server's),
    itself left out: [(id, L2 distance)]; [] when it has no vector."""
    row = conn.pg.execute("SELECT embedding::text FROM memory_vectors WHERE memory_id = %s", (memory_id,)).fetchone()
    if row is None:
        return []
    own = [float(x) for x in str(row[0]).strip("[]").split(",")]
    return [(mid, d) for mid, d in search(conn, info, own, keys, k + 1) if mid != memory_id][:k]


def neighbours_many(cache: VectorCache | None, conn: PgConnection, info: IndexInfo, items: Sequence[tuple[int, str]],
                    k: int) -> dict[int, list[tuple[int, float]]]:
    """For each (id, vis_key): its k nearest others under that key as (id, cosine), nearest
    first; through the vector cache outside a transaction, else one server statement per item."""
    if cache is not None and conn.get_autocommit():
        found = cache.neighbours(conn, info, items, k)
        return {mid: [(other, vectors.cosine_from_distance(d)) for other, d in near] for mid, near in found.items()}
    out: dict[int, list[tuple[int, float]]] = {}
    for memory_id, key in items:
        rows = conn.pg.execute(
            "SELECT o.memory_id, o.embedding <-> s.embedding AS d FROM memory_vectors s "
            "JOIN memory_vectors o ON o.vis_key = s.vis_key AND o.memory_id != s.memory_id "
            "WHERE s.memory_id = %s AND o.vis_key = %s ORDER BY d, o.memory_id LIMIT %s",
            (memory_id, key, k)).fetchall()
        out[memory_id] = [(int(other), vectors.cosine_from_distance(float(d))) for other, d in rows]
    return out


def spread_to_neighbours(conn: PgConnection, ranked: list[Candidate], keys: list[str], share: float,
                         as_of: float | None) -> list[Candidate]:
    """retrieval.spread_to_neighbours with PostgreSQL's own statement: for each hit, its
    `reach` nearest active memories on either side under its key, one ordered walk of the
    (vis_key, id) index each (a LATERAL array), of which only those that are candidates
    themselves are returned: only they can be lent to (retrieval.lend_to_neighbours). Their
    times are tested here, from the candidates' decay rows that the same statement reads for
    final_order. (The recursive walk took one max()/min() seek per step and read the time of
    every neighbour found, several times this statement's work; the portable one joins the walk
    to `memories`, which PostgreSQL ran as a hash over every memory.)"""
    reach = retrieval.NEIGHBOUR_REACH
    if share <= 0 or not ranked or reach <= 0:
        return ranked
    by_id = {c.memory_id: c for c in ranked}
    side = ("SELECT h.id AS hit, n.other, n.places FROM memories h CROSS JOIN LATERAL unnest(ARRAY(SELECT p.id "
            "FROM memories p WHERE p.vis_key = h.vis_key AND p.id {op} h.id AND p.archived_at IS NULL "
            "ORDER BY p.id {order} LIMIT %(reach)s)) WITH ORDINALITY n(other, places) "
            "WHERE h.id = ANY(%(ids)s) AND h.vis_key = ANY(%(keys)s)")
    rows = conn.pg.execute(
        ("SELECT hit, other, places::int, NULL::float8, NULL::float8, NULL::float8, NULL::float8, NULL::bigint FROM ("
         f"{side.format(op='<', order='DESC')} UNION ALL {side.format(op='>', order='ASC')}) x "
         "WHERE x.other = ANY(%(ids)s) "
         # the candidates' decay rows (Candidate.vitals: final_order reads none again; Candidate.teacher for
         # the fair share) and their times here
         f"UNION ALL SELECT id, NULL, NULL, {VITALS_COLUMNS}, {TEACHER_COLUMN} "
         "FROM memories WHERE id = ANY(%(ids)s)").encode(),
        {"ids": list(by_id), "keys": keys, "reach": reach}).fetchall()
    created: dict[int, float] = {}
    for hit, other, _, last_seen, stability, importance, created_at, teacher in rows:
        if other is None:  # a decay row: for final_order next (Candidate.vitals) and the times here
            cand = by_id[int(hit)]
            cand.vitals = (last_seen, stability, importance, created_at)
            cand.teacher, cand.teacher_read = (None if teacher is None else int(teacher)), True
            created[int(hit)] = float(created_at)
    walked = [(int(h), int(o), int(p)) for h, o, p, *_ in rows if o is not None
              and abs(created[o] - created[h]) <= retrieval.NEIGHBOUR_WINDOW_S
              and (as_of is None or created[o] <= as_of)]
    return retrieval.lend_to_neighbours(by_id, walked, share)


def measure_similarity(cache: VectorCache | None, conn: PgConnection, vector: Sequence[float], chosen: list[Candidate],
                       info: IndexInfo | None) -> None:
    """Set the similarity of each of `chosen` that has no cosine yet: from the
    vector cache where it holds the vector, the others in one statement; one
    without a vector, or no index or a query of another size: left as it is."""
    unknown = {c.memory_id: c for c in chosen if c.cosine is None}
    if not unknown or info is None or len(vector) != info.dim:
        return
    if cache is not None:  # the recall's search has just loaded the viewer's keys
        # on a read connection right after the recall's own search: its sync still holds
        cosines = cache.cosines(conn, info, vector, list(unknown),
                                synced=conn.get_autocommit())
        for memory_id, cosine in cosines.items():
            unknown.pop(memory_id).similarity = cosine
        if not unknown:
            return
    rows = conn.pg.execute("SELECT memory_id, embedding <-> %s::vector FROM memory_vectors WHERE memory_id = ANY(%s)",
                           (vector_literal(vector), list(unknown))).fetchall()
    for memory_id, distance in rows:
        unknown[int(memory_id)].similarity = vectors.cosine_from_distance(float(distance))
