"""PostgreSQL's keyword step, with the rules for common words both backends share (recall/keywords.py).

Which words are searched: keywords.selective's rule (a word in too many memories is left out
while rarer ones are there), on counts taken here from the GIN index, capped with LIMIT and
cached per database for a while; a word the planner's statistics put in ESTIMATE_MIN memories
or more is not counted, its estimate stands in (where the choice can differ from SQLite's).
How much is ranked: when a searched word is common (over
shared.common_limit), only the newest shared.COMMON_HITS visible matches among the newest
shared.COMMON_WINDOW memories are ranked, as on SQLite; scoring every visible match of a very
common word dominated the keyword step's cost in a busy channel. The score: bm25.py.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

import psycopg

from bot.memory.postgres import bm25
from bot.memory.postgres.connection import PgConnection
from bot.memory.postgres.index_state import INDEX_STATE_SQL, index_state_of
from bot.memory.recall import keywords as shared
from bot.memory.recall.retrieval import Candidate, KeywordHits
from bot.memory.recall.words import tokens
from bot.memory.sql import removals
from bot.memory.vectors.index import IndexInfo

log = logging.getLogger(__name__)

# Per database URL: word -> (count up to its limit, that limit, when counted); as shared._counts.
_counts: dict[str, dict[str, tuple[int, int, float]]] = {}
# Per database URL: (max(id), when read). fts's common-word rule takes max(id) as the size of
# the database; a few seconds old only widens the newest-memories window.
_newest: dict[str, tuple[int, float]] = {}
NEWEST_TTL_S = 5.0


def _database(conn: PgConnection) -> str:
    return str(getattr(conn.storage, "url", "") or id(conn))


def newest_id(conn: PgConnection) -> int:
    """shared.newest_id, read at most every NEWEST_TTL_S per database (it was 2-3 round trips a recall)."""
    where, now = _database(conn), time.monotonic()
    hit = _newest.get(where)
    if hit is None or now - hit[1] >= NEWEST_TTL_S:
        row = conn.pg.execute(shared.NEWEST_ID_SQL).fetchone()
        hit = (int(row[0]) if row else 0, now)
        _newest[where] = hit
    return hit[0]


def _cached(cache: dict[str, tuple[int, int, float]], word: str, limit: int, now: float) -> int | None:
    """A count still good for `limit`: young enough, and exact or counted at least that far."""
    hit = cache.get(word)
    if hit is not None and now - hit[2] < shared.COUNT_TTL_S and (hit[0] <= hit[1] or hit[1] >= limit):
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
    """Memories left `conn`'s database: as shared.forget_counts (FORGET_SLACK: the common words'
    counts may stay), else its counts, the statistics' estimates and the newest id go (conn
    None: every database's)."""
    if conn is None:
        shared.reset_slack([*_counts, *_estimates])
        with _refresh_lock:
            for where in _estimates:
                _generation[where] = _generation.get(where, 0) + 1
            for cache in (_counts, _newest, _estimates):
                cache.clear()
        return
    database = _database(conn)
    if shared.slack_left(database, removed):
        shared.keep_common_counts(_counts.get(database, {}))
        return
    with _refresh_lock:
        _generation[database] = _generation.get(database, 0) + 1
        for cache in (_counts, _newest, _estimates):
            cache.pop(database, None)


# A word the planner's statistics put in ESTIMATE_MIN memories or more is not counted: its
# estimate stands in for the count (keywords.selective orders words by it and weighs it against
# MATCH_BUDGET), capped at COMMON_EXACT + 1 (past it words tie and the longer wins, as on
# SQLite). Counting was a scan of the word's GIN entry up to the limit (1,501 at 100k), or up to
# COMMON_EXACT when a query held only common words (the slow tail of a typical recall's keyword
# step); words of 500-1,500 memories were the count statement's remaining cost. Rarer words,
# words of several stems and databases never analysed are counted. The statistics (PostgreSQL
# migration 14) are of active memories only and sample 120,000 rows: at 100k every row, so the
# estimates are the counts as of the last ANALYZE (scaled to the active memories now); past it they
# come from a sample: close, not exact. Near MATCH_BUDGET or the common limit a word's class can
# therefore differ from SQLite's. Statistics taken while an import was under way described another
# table: `muninn import` ANALYZEs at its end (storage.refresh_statistics).
ESTIMATE_MIN = 250
# Per database URL: (stem -> estimated active memories holding it, when read). Read again
# after shared.COUNT_TTL_S (autovacuum's ANALYZE renews the statistics as the table changes) in
# the background (`refresh_estimates` on the engine's loader thread): a recall uses the last
# read and never waits for one (inside a recall, the read made one recall per 10 minutes much
# slower, the more so the bigger the database). Until the first read, and while the statistics
# are off, every word is counted.
_estimates: dict[str, tuple[dict[str, int], float, str]] = {}  # + the stems not counted (_array)
_refreshing: dict[str, float] = {}  # database -> when its read was handed to the loader
_generation: dict[str, int] = {}    # database -> estimates dropped so far (forget_counts)
_refresh_lock = threading.Lock()
REFRESH_STUCK_S = 60.0  # a read handed over this long ago never ran (its engine closed): hand it again
# The statistics of `CASE WHEN archived_at IS NULL THEN text_search END` (migration 14): archived
# memories are NULL there, so the stems' shares are of active memories (a bot that archives
# skewed the column's own statistics, which sample every row), and reltuples x (1 - null_frac)
# is how many were active at the last ANALYZE. The active memories now are counted (the partial
# index memories_active_vis): a mass delete or archive since the ANALYZE (fewer active now than
# (1 - STATS_DRIFT) x then) would make the estimates call words common that are not: none are
# used then. Not pg_stat_user_tables' n_mod_since_analyze: every recall's touch is an UPDATE
# there, and an archive is an UPDATE alike. The count is off the recall (background), once
# per shared.COUNT_TTL_S.
STATS_DRIFT = 0.05
_STATS = ("SELECT e.most_common_elems::text::text[], e.most_common_elem_freqs, e.null_frac, c.reltuples, "
          "(SELECT count(*) FROM memories WHERE archived_at IS NULL) FROM pg_class c "
          "JOIN pg_stats_ext_exprs e ON e.schemaname = c.relnamespace::regnamespace::name AND e.tablename = c.relname "
          "AND e.statistics_name = 'memories_active_words' WHERE c.oid = 'memories'::regclass AND NOT e.inherited")
# One row per word: its stems, and its count up to the limit unless it is one stem estimated at
# ESTIMATE_MIN or more (a CASE branch not taken is never run).
_WORD_ROW = ("SELECT %(i{n})s::int, w.stems, CASE WHEN cardinality(w.stems) = 1 AND w.stems[1] = ANY(%(common)s::text[]) "
             "THEN NULL ELSE (SELECT count(*) FROM (SELECT 1 FROM memories WHERE archived_at IS NULL "
             "AND text_search @@ plainto_tsquery('muninn', %(w{n})s) LIMIT %(limit)s) c) END "
             "FROM (SELECT tsvector_to_array(to_tsvector('muninn', %(w{n})s)) AS stems) w")


def read_estimates(conn: PgConnection) -> dict[str, int]:
    """The statistics' most common stems of active memories and how many hold each now: each stem's
    share of the memories at the last ANALYZE times the active memories now (the shares of a bot
    that grew since hold; the counts of then were too low by its growth). Empty before the first
    ANALYZE and while they are off (STATS_DRIFT)."""
    row = conn.pg.execute(_STATS).fetchone()
    if row is None or row[0] is None or row[1] is None:
        return {}
    active_then = max(float(row[3] or 0), 0.0) * (1.0 - float(row[2] or 0.0))
    active_now = float(row[4] or 0)
    if active_now < (1.0 - STATS_DRIFT) * active_then:
        return {}
    return {stem: round(share * active_now) for stem, share in zip(row[0], row[1], strict=False)}


def _array(values: list[str]) -> str:
    """A PostgreSQL array literal of `values`, each quoted: the count statement takes the stems
    not counted (thousands at 1,000,000 memories) as one text parameter; psycopg's dump of a list
    that long (type by type, element by element) took longer than the statement itself."""
    return "{" + ",".join('"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' for v in values) + "}"


def refresh_estimates(conn: PgConnection) -> dict[str, int]:
    """Read the estimates now and keep them for every connection to `conn`'s database (unless
    forget_counts dropped them meanwhile: this read may predate what made them wrong)."""
    where = _database(conn)
    generation = _generation.get(where, 0)
    try:
        found = read_estimates(conn)
        not_counted = _array([stem for stem, n in found.items() if n >= ESTIMATE_MIN])
        with _refresh_lock:
            if _generation.get(where, 0) == generation:
                _estimates[where] = (found, time.monotonic(), not_counted)
        return found
    finally:
        with _refresh_lock:
            _refreshing.pop(where, None)


def _refresh_later(conn: PgConnection) -> bool:
    """Have the engine's loader thread read the estimates (on a connection of its own); False
    when there is no loader (no engine: the caller reads them itself)."""
    cache = getattr(conn.storage, "vector_cache", None)
    background = getattr(cache, "background", None)
    if background is None:
        return False
    where, now = _database(conn), time.monotonic()
    with _refresh_lock:
        if now - _refreshing.get(where, -REFRESH_STUCK_S) < REFRESH_STUCK_S:
            return True
        _refreshing[where] = now

    def job(loader: Any) -> None:
        try:
            refresh_estimates(loader)
        except psycopg.Error as exc:  # counted exactly until a later read works
            log.warning("could not read the keyword statistics: %s", exc)
    try:
        background(job)
    except RuntimeError:  # the engine is closing: its loader takes no more jobs
        with _refresh_lock:
            _refreshing.pop(where, None)
        return False
    return True


def estimates(conn: PgConnection) -> dict[str, int]:
    """The last estimates read for `conn`'s database; when they are older than shared.COUNT_TTL_S (or
    none were read yet) a new read is started in the background, or done here without a loader."""
    return _last_estimates(conn)[0]


def _last_estimates(conn: PgConnection) -> tuple[dict[str, int], float, str]:
    where = _database(conn)
    hit = _estimates.get(where)
    if hit is None or time.monotonic() - hit[1] >= shared.COUNT_TTL_S:
        if not _refresh_later(conn):
            refresh_estimates(conn)
            hit = _estimates.get(where, hit)
    return hit if hit is not None else ({}, 0.0, "{}")


def count_at_once(conn: PgConnection, words: list[str], limit: int) -> None:
    """Count the words not counted yet in one statement (a round trip each was 3-4 per recall),
    into the cache that doc_count answers from; a word the statistics put in ESTIMATE_MIN
    memories or more is not counted: its estimate stands in."""
    cache = _counts.setdefault(_database(conn), {})
    now = time.monotonic()
    wanted = [w for w in dict.fromkeys(words) if _cached(cache, w, limit, now) is None]
    if not wanted:
        return
    if len(cache) + len(wanted) >= shared.COUNT_CACHE_MAX:
        cache.clear()
    estimated, _, not_counted = _last_estimates(conn)
    params: dict[str, Any] = {"common": not_counted, "limit": limit + 1}
    for n, word in enumerate(wanted):
        params[f"i{n}"], params[f"w{n}"] = n, word
    # Prepared after a few runs (psycopg), so planned once for any word: right for what is counted
    # now, words under ESTIMATE_MIN (the GIN entry first). Before the estimates a generic plan
    # also counted the most common words from the GIN side, which the newest rows did faster.
    sql = " UNION ALL ".join(f"({_WORD_ROW.format(n=n)})" for n in range(len(wanted))) + " ORDER BY 1"
    rows = conn.pg.execute(sql.encode(), params).fetchall()
    for word, (_, stems, count) in zip(wanted, rows, strict=True):
        if count is None:  # one stem, estimated
            cache[word] = (min(estimated[stems[0]], shared.COMMON_EXACT + 1), shared.COMMON_EXACT, now)
        else:
            cache[word] = (int(count), limit, now)


def searched_words(conn: PgConnection, words: list[str], limit: int | None = None) -> list[str]:
    """Which of `words` the keyword path searches (keywords.selective with this backend's cached counts,
    several words counted per statement); `limit`: shared.common_limit, when the caller has it already."""
    limit = shared.common_limit(conn, newest_id(conn)) if limit is None else limit
    if len(words) > 1:
        count_at_once(conn, words, limit)
        found = [w for w in words if doc_count(conn, w, limit) > 0]
        if found and all(doc_count(conn, w, limit) > limit for w in found):
            # only common words: keywords.selective orders them by counts up to COMMON_EXACT (those
            # not estimated: counted here at once, not one statement each)
            count_at_once(conn, found, shared.COMMON_EXACT)
    return shared.selective(conn, words, lambda c, ws, cap: {w: doc_count(c, w, cap) for w in ws}, limit=limit)


def _tsquery(words: list[str]) -> str:
    return " || ".join(["plainto_tsquery('muninn', %s)"] * len(words))


def keyword_step(conn: PgConnection, query: str, keys: list[str], limit: int,
                 as_of: float | None) -> tuple[KeywordHits, tuple[IndexInfo | None, bool] | None]:
    """The keyword hits, and the vector index's state (INDEX_STATE_SQL) read in the same statement:
    the recall's fts step needs it next, and a statement of its own was a round trip per recall.
    The state is None when no statement ran (no word to search, no key)."""
    common_limit = shared.common_limit(conn, newest_id(conn))
    words = searched_words(conn, tokens(query), common_limit)
    if not words or not keys:
        return KeywordHits(), None
    counts = {w: doc_count(conn, w, common_limit) for w in words}
    match = _tsquery(words)
    since = " AND m.created_at <= %s" if as_of is not None else ""
    after: list[Any] = [as_of] if as_of is not None else []
    if max(counts.values()) > common_limit:
        # A common word: the newest COMMON_HITS visible matches, walked newest first per visibility
        # key in the (vis_key, id) index that carries text_search (migration 11; `id > 0` selects
        # it), so only the viewer's own rows are matched and no heap page is read. The longest
        # memories' words do not fit that index: they have one of their own (migration 23), walked
        # beside it, the split spelled as the indexes' predicates so the planner uses both. Walking all ids
        # matched the tsvectors of every other viewer's memories in the window, per recall (slow in
        # a busy channel under load). The window ends at the viewer's newest memory, as on SQLite
        # (shared.newest_visible_id), read in the same statement (one seek per key).
        window = ""
        if as_of is None:  # a recall as of a past moment has no "newest memories" to cut at
            window = (" AND m.id > (SELECT coalesce(max((SELECT max(n.id) FROM memories n WHERE n.vis_key = v.key "
                      "AND n.archived_at IS NULL)), 0) FROM unnest(%s::text[]) v(key)) - %s")
            after = [keys, shared.COMMON_WINDOW]
        # The long memories' walk matches with `IS TRUE`, which no index can serve: else the planner
        # may read every match of the common word in the key from the word index (a bitmap of
        # thousands of rows, each one's tsvector cast to text for the length test) to find the
        # few long memories its own small index walks newest first.
        def newest(size: str, matched: str) -> str:
            return ("(SELECT m.id, m.text_search FROM memories m WHERE m.vis_key = k.key AND m.archived_at IS NULL "
                    f"AND m.id > 0 AND octet_length(m.text_search::text) {size}{window}{since} "
                    f"AND {matched} ORDER BY m.id DESC LIMIT %s)")
        hits = (f"SELECT w.id, w.text_search FROM unnest(%s::text[]) k(key) CROSS JOIN LATERAL "
                f"({newest('<= 1500', f'm.text_search @@ ({match})')} "
                f"UNION ALL {newest('> 1500', f'(m.text_search @@ ({match})) IS TRUE')}) w ORDER BY w.id DESC LIMIT %s")
        one_walk = [*after, *words, shared.COMMON_HITS]
        hit_params = [keys, *one_walk, *one_walk, shared.COMMON_HITS]
    else:
        # The match is written out here, not read from a CTE: from a CTE the planner cannot see
        # the words and guesses 500 matches for any of them, so it led with the GIN index for a
        # very common word (a bitmap of much of the table) where walking the newest ids was far faster.
        hits = (f"SELECT m.id, m.text_search FROM memories m WHERE m.archived_at IS NULL AND m.vis_key = ANY(%s) "
                f"AND m.text_search @@ ({match}){since}")
        hit_params = [keys, *words, *after]
    score, score_params = bm25.score_sql(words, counts, newest_id(conn), bm25.average_length(conn, _database(conn)))
    # Never a prepared statement: psycopg prepares a statement after its 5th run, and PostgreSQL
    # then may settle on one generic plan for every viewer and word, while whether the GIN match,
    # the newest ids or the (vis_key, id) index should lead depends on these very values.
    # Planning each time costs little; the generic plan cost a busy viewer far more.
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
    """The keyword hits of `keyword_step`, without the index state."""
    return keyword_step(conn, query, keys, limit, as_of)[0]
