"""PostgreSQL's keyword step, with SQLite's rules for common words (bot/memory/fts.py).

Which words are searched: fts.selective's rule (a word in too many memories is left out
while rarer ones are there), on counts taken here from the GIN index, capped with LIMIT and
cached per database for a while; a word the planner's statistics call very common is not
counted, its estimate stands in (ESTIMATE_MARGIN: where the choice can differ from SQLite's).
How much is ranked: when a searched word is common (over
fts.common_limit), only the newest fts.COMMON_HITS visible matches among the newest
fts.COMMON_WINDOW memories are ranked, as on SQLite; `ts_rank_cd` over every visible match
of a word in 30 % of all memories was the keyword step's cost in a busy channel (issue 13).
"""
from __future__ import annotations

import json
import time
from typing import Any

from bot.memory import fts, removals
from bot.memory.postgres.connection import PgConnection
from bot.memory.postgres.index_state import INDEX_STATE_SQL, index_state_of
from bot.memory.retrieval import Candidate, KeywordHits
from bot.memory.vectors import IndexInfo

# Per database URL: word -> (count up to its limit, that limit, when counted); as fts._counts.
_counts: dict[str, dict[str, tuple[int, int, float]]] = {}
# Per database URL: (max(id), when read). fts's common-word rule takes max(id) as the size of
# the database; a few seconds old only widens the newest-memories window.
_newest: dict[str, tuple[int, float]] = {}
NEWEST_TTL_S = 5.0


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
    """How many active memories contain `word`, exactly up to `limit`; above it, some number > limit
    (for a word the statistics call very common, their estimate: `count_at_once`)."""
    cache = _counts.setdefault(_database(conn), {})
    known = _cached(cache, word, limit, time.monotonic())
    if known is not None:
        return known
    count_at_once(conn, [word], limit)
    return cache[word][0]


def forget_counts(conn: PgConnection | None = None, removed: int | None = None) -> None:
    """Memories left `conn`'s database: as fts.forget_counts (FORGET_SLACK: the common words'
    counts may stay), else its counts, the statistics' estimates and the newest id go (conn
    None: every database's)."""
    if conn is None:
        fts.reset_slack([*_counts, *_estimates])
        for cache in (_counts, _newest, _estimates):
            cache.clear()
        return
    database = _database(conn)
    if fts.slack_left(database, removed):
        fts.keep_common_counts(_counts.get(database, {}))
        return
    for cache in (_counts, _newest, _estimates):
        cache.pop(database, None)


# A word whose estimate (the planner's statistics: the share of memories holding its stem in
# ANALYZE's sample, times the table's rows) is over ESTIMATE_MARGIN x the common limit is common
# without a count: counting it was a scan of its whole GIN entry, up to COMMON_EXACT when a query
# held only common words (13-47 ms at 100k, the typical class's tail: issue 13). Its estimate
# stands in for the exact count that orders common words (fts.selective); capped at COMMON_EXACT
# + 1 (past it words tie and the longer wins, as on SQLite). Rarer words, words of several stems
# and databases never analysed are counted as before. ANALYZE samples 30,000 rows: a word in
# 2 x 1,500 memories of 100k is estimated within a few per cent, far above the limit.
ESTIMATE_MARGIN = 2
# Per database URL: (stem -> estimated memories holding it, when read); read again after
# fts.COUNT_TTL_S (autovacuum's ANALYZE renews the statistics as the table changes).
_estimates: dict[str, tuple[dict[str, int], float]] = {}
_STATS = ("SELECT s.most_common_elems::text::text[], s.most_common_elem_freqs, c.reltuples, "
          "(SELECT a.null_frac FROM pg_stats a WHERE a.schemaname = n.nspname AND a.tablename = c.relname "
          "AND a.attname = 'archived_at'), "
          "(SELECT count(*) FROM memories WHERE archived_at IS NULL) FROM pg_class c "
          "JOIN pg_namespace n ON n.oid = c.relnamespace JOIN pg_stats s ON s.schemaname = n.nspname "
          "AND s.tablename = c.relname AND s.attname = 'text_search' WHERE c.oid = 'memories'::regclass")
# ANALYZE samples every row, archived ones too, while the counts (and the GIN index's partial
# use) are of active memories: with more than STATS_DRIFT of the sampled rows archived then
# (archived_at's null_frac), or fewer active memories now than (1 - STATS_DRIFT) x the rows it saw
# (a mass delete or archive since), the estimates would call words common that are not: none are
# used then, every word is counted. The active memories are counted (the partial index
# memories_active_vis, once per fts.COUNT_TTL_S), not taken from pg_stat_user_tables'
# n_mod_since_analyze: every recall's touch is an UPDATE there, which would turn the estimates
# off in a live bot long before autovacuum's ANALYZE (10 % of the rows changed).
STATS_DRIFT = 0.05
# One row per word: its stems, and its count up to the limit unless it is one stem estimated as
# common (a CASE branch not taken is never run).
_WORD_ROW = ("SELECT %(i{n})s::int, w.stems, CASE WHEN cardinality(w.stems) = 1 AND w.stems[1] = ANY(%(common)s) "
             "THEN NULL ELSE (SELECT count(*) FROM (SELECT 1 FROM memories WHERE archived_at IS NULL "
             "AND text_search @@ plainto_tsquery('muninn', %(w{n})s) LIMIT %(limit)s) c) END "
             "FROM (SELECT tsvector_to_array(to_tsvector('muninn', %(w{n})s)) AS stems) w")


def estimates(conn: PgConnection) -> dict[str, int]:
    """The most common stems of memories.text_search and how many memories hold each, by the
    statistics (empty before the first ANALYZE and while they are off: STATS_DRIFT), read at most
    every fts.COUNT_TTL_S per database."""
    where, now = _database(conn), time.monotonic()
    hit = _estimates.get(where)
    if hit is None or now - hit[1] >= fts.COUNT_TTL_S:
        row = conn.pg.execute(_STATS).fetchone()
        found: dict[str, int] = {}
        rows = max(float(row[2] or 0), 0.0) if row is not None else 0.0
        if (row is not None and row[0] is not None and row[1] is not None
                and 1.0 - float(row[3] if row[3] is not None else 1.0) <= STATS_DRIFT
                and float(row[4] or 0) >= (1.0 - STATS_DRIFT) * rows):
            found = {stem: round(share * rows) for stem, share in zip(row[0], row[1], strict=False)}
        hit = (found, now)
        _estimates[where] = hit
    return hit[0]


def count_at_once(conn: PgConnection, words: list[str], limit: int) -> None:
    """Count the words not counted yet in one statement (a round trip each was 3-4 per recall),
    into the cache that doc_count answers from; a word the statistics estimate as very common
    is not counted (ESTIMATE_MARGIN)."""
    cache = _counts.setdefault(_database(conn), {})
    now = time.monotonic()
    wanted = [w for w in dict.fromkeys(words) if _cached(cache, w, limit, now) is None]
    if not wanted:
        return
    if len(cache) + len(wanted) >= fts.COUNT_CACHE_MAX:
        cache.clear()
    estimated = estimates(conn)
    floor = ESTIMATE_MARGIN * fts.common_limit(conn, newest_id(conn))
    params: dict[str, Any] = {"common": [stem for stem, n in estimated.items() if n >= floor], "limit": limit + 1}
    for n, word in enumerate(wanted):
        params[f"i{n}"], params[f"w{n}"] = n, word
    # Prepared after a few runs (psycopg), so planned once for any word: right for what is counted
    # now, words under ESTIMATE_MARGIN x the limit (the GIN entry first). Before the estimates a
    # generic plan also counted the most common words from the GIN side, which the newest rows
    # did faster.
    sql = " UNION ALL ".join(f"({_WORD_ROW.format(n=n)})" for n in range(len(wanted))) + " ORDER BY 1"
    rows = conn.pg.execute(sql.encode(), params).fetchall()
    for word, (_, stems, count) in zip(wanted, rows, strict=True):
        if count is None:  # one stem, estimated as common
            cache[word] = (min(estimated[stems[0]], fts.COMMON_EXACT + 1), fts.COMMON_EXACT, now)
        else:
            cache[word] = (int(count), limit, now)


def searched_words(conn: PgConnection, words: list[str], limit: int | None = None) -> list[str]:
    limit = fts.common_limit(conn, newest_id(conn)) if limit is None else limit
    if len(words) > 1:
        count_at_once(conn, words, limit)
        found = [w for w in words if doc_count(conn, w, limit) > 0]
        if found and all(doc_count(conn, w, limit) > limit for w in found):
            # only common words: fts.selective orders them by counts up to COMMON_EXACT (those
            # not estimated: counted here at once, not one statement each)
            count_at_once(conn, found, fts.COMMON_EXACT)
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


def keyword_step(conn: PgConnection, query: str, keys: list[str], limit: int,
                 as_of: float | None) -> tuple[KeywordHits, tuple[IndexInfo | None, bool] | None]:
    """The keyword hits, and the vector index's state (INDEX_STATE_SQL) read in the same statement:
    the recall's fts step needs it next, and a statement of its own was a round trip per recall.
    The state is None when no statement ran (no word to search, no key)."""
    common_limit = fts.common_limit(conn, newest_id(conn))
    words = searched_words(conn, fts.tokens(query), common_limit)
    if not words or not keys:
        return KeywordHits(), None
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
    # The last row, id NULL, carries the index state (INDEX_STATE_SQL): one round trip less.
    rows = conn.pg.execute(
        f"(SELECT h.id, -{score} AS score, NULL::text FROM ({hits}) h ORDER BY score ASC, h.id DESC LIMIT %s) "
        f"UNION ALL (SELECT NULL, NULL, ({INDEX_STATE_SQL}))".encode(),
        [*score_params, *hit_params, limit], prepare=False).fetchall()
    state = json.loads(rows.pop()[2] or "{}")
    # memories other processes removed: their words' counts go, for the next recall (removals.py)
    removals.observe(_database(conn), state.get(removals.KEY), lambda removed: forget_counts(conn, removed))
    # score: negated so that lower is better, as bm25's (ranking.keyword_winner_first compares them)
    found = KeywordHits(Candidate(int(row[0]), fts_rank=rank, fts_score=float(row[1]))
                        for rank, row in enumerate(rows, start=1))
    found.searched = words  # the name re-rank needs them: not chosen a second time (subqueries.py)
    return found, index_state_of(state)


def fts_candidates(conn: PgConnection, query: str, keys: list[str], limit: int,
                   as_of: float | None) -> KeywordHits:
    return keyword_step(conn, query, keys, limit, as_of)[0]
