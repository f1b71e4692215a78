"""PostgreSQL's keyword step, with SQLite's rules for common words (bot/memory/fts.py).

Which words are searched: fts.selective's rule (a word in too many memories is left out
while rarer ones are there), on counts taken here from the GIN index, capped with LIMIT and
cached per database for a while. How much is ranked: when a searched word is common (over
fts.common_limit), only the newest fts.COMMON_HITS visible matches among the newest
fts.COMMON_WINDOW memories are ranked, as on SQLite; `ts_rank_cd` over every visible match
of a word in 30 % of all memories was the keyword step's cost in a busy channel (issue 13).
"""
from __future__ import annotations

import time
from typing import Any

from bot.memory import fts
from bot.memory.postgres.connection import PgConnection
from bot.memory.retrieval import Candidate, KeywordHits

# Per database URL: word -> (count up to its limit, that limit, when counted); as fts._counts.
_counts: dict[str, dict[str, tuple[int, int, float]]] = {}
# Per database URL: (max(id), when read). fts's common-word rule takes max(id) as the size of
# the database; a few seconds old only widens the newest-memories window.
_newest: dict[str, tuple[int, float]] = {}
NEWEST_TTL_S = 5.0
_COUNT = ("SELECT count(*) FROM (SELECT 1 FROM memories WHERE archived_at IS NULL "
          "AND text_search @@ plainto_tsquery('muninn', %s) LIMIT %s) c")


def _database(conn: PgConnection) -> str:
    return str(getattr(conn.storage, "url", "") or id(conn))


def newest_id(conn: PgConnection) -> int:
    """fts.newest_id, read at most every NEWEST_TTL_S per database (it was 2-3 round trips a recall)."""
    where, now = _database(conn), time.monotonic()
    hit = _newest.get(where)
    if hit is None or now - hit[1] >= NEWEST_TTL_S:
        row = conn.pg.execute(fts.NEWEST_ID_SQL).fetchone()
        hit = (int(row[0]) if row else 0, now)
        _newest[where] = hit
    return hit[0]


def _cached(cache: dict[str, tuple[int, int, float]], word: str, limit: int, now: float) -> int | None:
    """A count still good for `limit`: young enough, and exact or counted at least that far."""
    hit = cache.get(word)
    if hit is not None and now - hit[2] < fts.COUNT_TTL_S and (hit[0] <= hit[1] or hit[1] >= limit):
        return hit[0]
    return None


def doc_count(conn: PgConnection, word: str, limit: int) -> int:
    """How many active memories contain `word`, exactly up to `limit`; above it, some number > limit."""
    cache = _counts.setdefault(_database(conn), {})
    now = time.monotonic()
    known = _cached(cache, word, limit, now)
    if known is not None:
        return known
    if len(cache) >= fts.COUNT_CACHE_MAX:
        cache.clear()
    row = conn.pg.execute(_COUNT, (word, limit + 1)).fetchone()
    count = int(row[0]) if row else 0
    cache[word] = (count, limit, now)
    return count


def forget_counts() -> None:
    _counts.clear()
    _newest.clear()


def count_at_once(conn: PgConnection, words: list[str], limit: int) -> None:
    """Count the words not counted yet in one statement (a round trip each was 3-4 per recall),
    into the cache that doc_count answers from."""
    cache = _counts.setdefault(_database(conn), {})
    now = time.monotonic()
    wanted = [w for w in dict.fromkeys(words) if _cached(cache, w, limit, now) is None]
    if len(wanted) < 2:
        return  # doc_count reads a single word itself
    if len(cache) + len(wanted) >= fts.COUNT_CACHE_MAX:
        cache.clear()
    row = conn.pg.execute(f"SELECT {', '.join([f'({_COUNT})'] * len(wanted))}".encode(),
                          [value for w in wanted for value in (w, limit + 1)]).fetchone()
    assert row is not None
    for word, count in zip(wanted, row, strict=True):
        cache[word] = (int(count), limit, now)


def searched_words(conn: PgConnection, words: list[str], limit: int | None = None) -> list[str]:
    limit = fts.common_limit(conn, newest_id(conn)) if limit is None else limit
    if len(words) > 1:
        count_at_once(conn, words, limit)
    return fts.selective(conn, words, count=doc_count, limit=limit)


def _tsquery(words: list[str]) -> str:
    return " || ".join(["plainto_tsquery('muninn', %s)"] * len(words))


def _score(words: list[str], counts: dict[str, int]) -> tuple[str, list[Any]]:
    """ts_rank_cd of `h.text_search` for `words`. Its cost grows with the query's words, and a
    word counted in no memory adds nothing to the rank of a memory that lacks it (cover density
    only counts the words a text holds), so such words are ranked only for the memories holding
    them (stored since the count): a third of the cost for a query of one word found and four not."""
    absent = [w for w in words if counts.get(w, 1) == 0]
    present = [w for w in words if counts.get(w, 1) != 0]
    if not absent or not present:
        return f"ts_rank_cd(h.text_search, {_tsquery(words)})", list(words)
    return (f"CASE WHEN h.text_search @@ ({_tsquery(absent)}) THEN ts_rank_cd(h.text_search, {_tsquery(words)}) "
            f"ELSE ts_rank_cd(h.text_search, {_tsquery(present)}) END", [*absent, *words, *present])


def fts_candidates(conn: PgConnection, query: str, keys: list[str], limit: int,
                   as_of: float | None) -> KeywordHits:
    common_limit = fts.common_limit(conn, newest_id(conn))
    words = searched_words(conn, fts.tokens(query), common_limit)
    if not words or not keys:
        return KeywordHits()
    counts = {w: doc_count(conn, w, common_limit) for w in words}
    match = _tsquery(words)
    since = " AND m.created_at <= %s" if as_of is not None else ""
    after: list[Any] = [as_of] if as_of is not None else []
    if max(counts.values()) > common_limit:
        # A common word: the newest COMMON_HITS visible matches, walked newest first per visibility
        # key in the (vis_key, id) index that carries text_search (migration 11; `id > 0` selects
        # it), so only the viewer's own rows are matched and no heap page is read. Walking all ids
        # matched 16-20k tsvectors of other viewers' memories per recall (50-70 ms in a busy
        # channel under load). The window ends at the viewer's newest memory, as on SQLite
        # (fts.newest_visible_id), read in the same statement (one seek per key).
        window = ""
        if as_of is None:  # a recall as of a past moment has no "newest memories" to cut at
            window = (" AND m.id > (SELECT coalesce(max((SELECT max(n.id) FROM memories n WHERE n.vis_key = v.key "
                      "AND n.archived_at IS NULL)), 0) FROM unnest(%s::text[]) v(key)) - %s")
            after = [keys, fts.COMMON_WINDOW]
        hits = ("SELECT w.id, w.text_search FROM unnest(%s::text[]) k(key) CROSS JOIN LATERAL (SELECT m.id, "
                "m.text_search FROM memories m WHERE m.vis_key = k.key AND m.archived_at IS NULL AND m.id > 0"
                f"{window}{since} AND m.text_search @@ ({match}) ORDER BY m.id DESC LIMIT %s) w "
                "ORDER BY w.id DESC LIMIT %s")
        hit_params = [keys, *after, *words, fts.COMMON_HITS, fts.COMMON_HITS]
    else:
        # The match is written out here, not read from a CTE: from a CTE the planner cannot see
        # the words and guesses 500 matches for any of them, so it led with the GIN index for a
        # word in 40 % of memories (a 42k-entry bitmap: 10-30 ms) where the newest ids took 5 ms.
        hits = (f"SELECT m.id, m.text_search FROM memories m WHERE m.archived_at IS NULL AND m.vis_key = ANY(%s) "
                f"AND m.text_search @@ ({match}){since}")
        hit_params = [keys, *words, *after]
    score, score_params = _score(words, counts)
    # Never a prepared statement: psycopg prepares a statement after its 5th run, and PostgreSQL
    # then may settle on one generic plan for every viewer and word, while whether the GIN match,
    # the newest ids or the (vis_key, id) index should lead depends on these very values.
    # Planning each time costs ~0.3 ms; the generic plan cost a busy viewer 40 ms (issue 13).
    rows = conn.pg.execute(
        f"SELECT h.id, -{score} AS score FROM ({hits}) h ORDER BY score ASC, h.id DESC LIMIT %s".encode(),
        [*score_params, *hit_params, limit], prepare=False).fetchall()
    # score: negated so that lower is better, as bm25's (ranking.keyword_winner_first compares them)
    found = KeywordHits(Candidate(int(row[0]), fts_rank=rank, fts_score=float(row[1]))
                        for rank, row in enumerate(rows, start=1))
    found.searched = words  # the name re-rank needs them: not chosen a second time (subqueries.py)
    return found
