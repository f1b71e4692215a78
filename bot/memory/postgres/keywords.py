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
# Per database URL: (max(id), when read). fts's common-word rule reads max(id) as the size of
# the database, 2-3 times per recall; a few seconds old only widens the newest-memories window.
_newest: dict[str, tuple[int, float]] = {}
NEWEST_TTL_S = 5.0


class _Rows:
    def __init__(self, rows: list[tuple[Any, ...]]) -> None:
        self.rows = rows

    def fetchall(self) -> list[tuple[Any, ...]]:
        return self.rows


class _SizeOnce:
    """The connection as fts's shared rule sees it during one keyword step, with its max(id)
    read answered from `_newest` (one round trip every NEWEST_TTL_S instead of 2-3 a recall)."""

    def __init__(self, conn: PgConnection) -> None:
        self.conn, self.pg, self.storage = conn, conn.pg, conn.storage

    def execute(self, sql: str, params: Any = ()) -> Any:
        if sql != fts.NEWEST_ID_SQL:
            return self.conn.execute(sql, params)
        where = str(getattr(self.storage, "url", "") or id(self.conn))
        now = time.monotonic()
        hit = _newest.get(where)
        if hit is None or now - hit[1] >= NEWEST_TTL_S:
            hit = (int(self.conn.execute(sql).fetchall()[0][0]), now)
            _newest[where] = hit
        return _Rows([(hit[0],)])


def doc_count(conn: PgConnection, word: str, limit: int) -> int:
    """How many active memories contain `word`, exactly up to `limit`; above it, some number > limit."""
    cache = _counts.setdefault(str(getattr(conn.storage, "url", "") or id(conn)), {})
    now = time.monotonic()
    hit = cache.get(word)
    if hit is not None and now - hit[2] < fts.COUNT_TTL_S and (hit[0] <= hit[1] or hit[1] >= limit):
        return hit[0]
    if len(cache) >= fts.COUNT_CACHE_MAX:
        cache.clear()
    row = conn.pg.execute(
        "SELECT count(*) FROM (SELECT 1 FROM memories WHERE archived_at IS NULL "
        "AND text_search @@ plainto_tsquery('muninn', %s) LIMIT %s) c", (word, limit + 1)).fetchone()
    count = int(row[0]) if row else 0
    cache[word] = (count, limit, now)
    return count


def forget_counts() -> None:
    _counts.clear()
    _newest.clear()


def count_at_once(conn: PgConnection, words: list[str], limit: int) -> None:
    """Count the words not counted yet in one statement (a round trip each was 3-4 per recall),
    into the cache that doc_count answers from."""
    cache = _counts.setdefault(str(getattr(conn.storage, "url", "") or id(conn)), {})
    now = time.monotonic()
    wanted = [w for w in dict.fromkeys(words)
              if not ((hit := cache.get(w)) is not None and now - hit[2] < fts.COUNT_TTL_S
                      and (hit[0] <= hit[1] or hit[1] >= limit))]
    if len(wanted) < 2:
        return  # doc_count reads a single word itself
    if len(cache) + len(wanted) >= fts.COUNT_CACHE_MAX:
        cache.clear()
    one = ("(SELECT count(*) FROM (SELECT 1 FROM memories WHERE archived_at IS NULL "
           "AND text_search @@ plainto_tsquery('muninn', %s) LIMIT %s) c)")
    row = conn.pg.execute(f"SELECT {', '.join([one] * len(wanted))}".encode(),
                          [value for w in wanted for value in (w, limit + 1)]).fetchone()
    assert row is not None
    for word, count in zip(wanted, row, strict=True):
        cache[word] = (int(count), limit, now)


def searched_words(conn: PgConnection, words: list[str]) -> list[str]:
    if len(words) > 1:
        count_at_once(conn, words, fts.common_limit(conn))
    return fts.selective(conn, words, count=doc_count)


def fts_candidates(conn: PgConnection, query: str, keys: list[str], limit: int,
                   as_of: float | None) -> KeywordHits:
    sized: Any = _SizeOnce(conn)
    words = searched_words(sized, fts.tokens(query))
    if not words or not keys:
        return KeywordHits()
    common_limit = fts.common_limit(sized)
    common = max(doc_count(conn, w, common_limit) for w in words) > common_limit
    tsquery = " || ".join(["plainto_tsquery('muninn', %s)"] * len(words))
    since = " AND m.created_at <= %s" if as_of is not None else ""
    params: list[Any] = [*words, keys, *words, *([as_of] if as_of is not None else [])]
    bound = ""
    if common:
        if as_of is None:  # a recall as of a past moment has no "newest memories" to cut at
            bound = " AND m.id > %s"
            params.append(fts.newest_visible_id(conn, keys) - fts.COMMON_WINDOW)  # the viewer's newest, as on SQLite
        bound += " ORDER BY m.id DESC LIMIT %s"
        params.append(fts.COMMON_HITS)
    params.append(limit)
    # The match is written out in `hits`, not read from `q`: from a CTE the planner cannot see
    # the words and guesses 500 matches for any of them, so it led with the GIN index for a word
    # in 40 % of memories (a 42k-entry bitmap: 10-30 ms) where walking the newest ids was 5 ms.
    # Never a prepared statement: psycopg prepares a statement after its 5th run, and PostgreSQL
    # then may settle on one generic plan for every viewer and word, while whether the GIN match,
    # the newest ids or the (vis_key, id) index should lead depends on these very values.
    # Planning each time costs ~0.3 ms; the generic plan cost a busy viewer 40 ms (issue 13).
    rows = conn.pg.execute(
        f"WITH q AS (SELECT {tsquery} AS query), "
        "hits AS (SELECT m.id, m.text_search FROM memories m "
        f"WHERE m.archived_at IS NULL AND m.vis_key = ANY(%s) AND m.text_search @@ ({tsquery}){since}{bound}) "
        "SELECT h.id, -ts_rank_cd(h.text_search, q.query) AS score FROM hits h, q "
        "ORDER BY score ASC, h.id DESC LIMIT %s".encode(), params, prepare=False).fetchall()
    # score: negated so that lower is better, as bm25's (ranking.keyword_winner_first compares them)
    found = KeywordHits(Candidate(int(row[0]), fts_rank=rank, fts_score=float(row[1]))
                        for rank, row in enumerate(rows, start=1))
    found.searched = words  # the name re-rank needs them: not chosen a second time (subqueries.py)
    return found
