"""Turning any user text into an FTS5 MATCH expression that cannot raise.

Only `\\w+` runs survive (so quotes, AND/OR/NOT/NEAR, `*`, `^`, `:`, brackets and
emoji are gone), stop words are dropped, duplicates removed, the count capped, and
each token is wrapped in double quotes and OR'd. Checked safe against a large corpus
of hostile queries. Returns None when nothing searchable is left.
"""
from __future__ import annotations

import time
import weakref
from dataclasses import dataclass
from typing import Any

import apsw

from bot.memory.recall import bm25, keywords
from bot.memory.recall.words import tokens
from bot.memory.sql import removals


def quote(token: str) -> str:
    """One FTS5 string token: double quotes around it, inner quotes doubled."""
    return '"' + token.replace('"', '""') + '"'


def selective(conn: Any, words: list[str], *, limit: int | None = None) -> list[str]:
    """keywords.selective with FTS5's counts."""
    return keywords.selective(conn, words, doc_counts, limit=limit)


def match_expression(text: str, conn=None) -> str | None:
    """The OR of the searchable words; given a connection, the very common ones are left out."""
    words = tokens(text)
    if conn is not None:
        words = selective(conn, words)
    if not words:
        return None
    return " OR ".join(quote(w) for w in words)


# Two ways to find a viewer's keyword hits. Visible-first reads the viewer's whole visible set
# from the (vis_key, id) index and probes each keyword match against it: right when the words
# are common. Match-first runs the MATCH alone and checks each match's key (MATCH_CHECK_INDEX):
# right when the words are rare, since a viewer in a busy channel sees tens of thousands of
# memories (listing them costs far more than checking a few hundred matches). The
# plan with fewer rows to visit wins: the matches are counted per word (capped, cached) and
# the visible set only up to that many. (Weighing a match as several visible ids, as the costs of a
# seek and of a step along the index suggest, made no measurable difference.)
MATCH_CHECK_INDEX = "memories_id_vis"  # (id, vis_key, archived_at): SQLite migration 12


@dataclass(frozen=True)
class KeywordPlan:
    """What the keyword path searches for one query: the words kept (`selective`) and the CTE
    defining `hits(id, relevance)` with its parameters (None: nothing is searchable)."""
    words: list[str]
    hits: tuple[str, list] | None


def plan(conn, text: str, keys: list[str], as_of: float | None) -> KeywordPlan:
    """The words searched for `text` (the name re-rank needs them: subqueries.py) and the CTE
    defining `hits(id, relevance)` (bm25: lower is better) among the active memories under
    `keys`, with its parameters (None when nothing is searchable).
    `max(id)` is read once here (it sets both the common limit and the window)."""
    # memories other processes removed since the last plan: their words' counts go (removals.py);
    # the counter and max(id) in one statement (each statement hands the GIL over)
    removed, newest = conn.execute(f"SELECT (SELECT value FROM meta WHERE key = ?), ({keywords.NEWEST_ID_SQL})",
                                   (removals.KEY,)).fetchall()[0]
    removals.observe(keywords._database(conn), removed, lambda removed: keywords.forget_counts(conn, removed))
    limit = keywords.common_limit(conn, newest)
    words = selective(conn, tokens(text), limit=limit)
    if not words:
        return KeywordPlan(words, None)
    expression = " OR ".join(quote(w) for w in words)
    where = f"vis_key IN ({','.join('?' * len(keys))})"
    since = " AND created_at <= ?" if as_of is not None else ""
    counts = [doc_count(conn, w, limit) for w in words]
    matches = sum(counts)
    extra = [as_of] if as_of is not None else []
    # A count past the limit is only a lower bound (the word may be in half of all memories):
    # then only the newest keywords.COMMON_HITS visible matches among the keywords.COMMON_WINDOW memories up to the
    # viewer's newest are ranked (FTS5 walks the matches newest first from the window's start and stops there),
    # found from the FTS side for a viewer who sees much of the window (a busy channel: few
    # matches walked per hit), from the visible set otherwise (cheaper for a heavy DM user).
    common = max(counts) > limit
    # The score (SCORER) takes each word's count from here rather than walking the word's whole
    # doclist every query as bm25() does: the counts selective() cached, a common word's counted
    # exactly up to keywords.COMMON_EXACT.
    exact = [doc_count(conn, w, keywords.COMMON_EXACT) if n > limit else n for w, n in zip(words, counts, strict=True)]
    relevance, scored = f"{SCORER}(memories_fts{', ?' * len(words)})", exact
    register_scorer(conn)
    window: list = []      # (start,): memories after it
    fts_window: list = []  # (start, end): FTS5 seeks to `end` and walks down to `start`
    if common:
        if as_of is None:  # a recall as of a past moment has no "newest memories" to cut at
            end = keywords.newest_visible_id(conn, keys)
            window, fts_window = [end - keywords.COMMON_WINDOW], [end - keywords.COMMON_WINDOW, end]
        dense = f"{where} AND id > ?" if window else where
        match_first = visible_at_least(conn, dense, [*keys, *window], keywords.DENSE_VISIBLE) > keywords.DENSE_VISIBLE
        tail = f" ORDER BY memories_fts.rowid DESC LIMIT {keywords.COMMON_HITS})"
    else:
        match_first = matches <= visible_at_least(conn, where, keys, matches)
        tail = ")"
    in_window = " AND memories_fts.rowid > ? AND memories_fts.rowid <= ?" if window else ""
    if match_first:
        # Each match's key is read from the small (id, vis_key, archived_at) index, one seek,
        # not from its row in memories (a few rows a page: a page read per match after any write
        # emptied the reader's page cache). The `+` keeps SQLite from seeking once per key.
        # A recall as of a past moment needs created_at: that reads the row.
        check = "memories" if as_of is not None else f"memories INDEXED BY {MATCH_CHECK_INDEX}"
        cte = (f"hits AS MATERIALIZED (SELECT memories_fts.rowid AS id, {relevance} AS relevance "
               f"FROM memories_fts JOIN {check} ON memories.id = memories_fts.rowid "
               f"WHERE memories_fts MATCH ?{in_window} AND +memories.{where} AND memories.archived_at IS NULL"
               + since.replace("created_at", "memories.created_at") + tail)
        return KeywordPlan(words, (cte, [*scored, expression, *fts_window, *keys, *extra]))
    cte = (f"visible(id) AS MATERIALIZED (SELECT id FROM memories WHERE {where} AND archived_at IS NULL{since}"
           + (" AND id > ?" if window else "") + "), "
           f"hits AS MATERIALIZED (SELECT rowid AS id, {relevance} AS relevance FROM memories_fts "
           f"WHERE memories_fts MATCH ?{in_window.replace('memories_fts.rowid', 'rowid')} AND +rowid IN visible"
           + tail.replace("memories_fts.rowid", "rowid"))
    return KeywordPlan(words, (cte, [*keys, *extra, *window, *scored, expression, *fts_window]))


# BM25 with each searched word counted once per memory, as PostgreSQL's keyword score
# (bot/memory/postgres/bm25.py). FTS5's own bm25() counts a word's every occurrence, so a long
# memory repeating a question's commoner words outranked the short one holding its rarest word.
SCORER = "muninn_bm25"
_scorer_registered: weakref.WeakSet = weakref.WeakSet()


def once_bm25(api: apsw.FTS5ExtensionApi, *documents: int) -> float:
    """The current row's BM25 score, negated (lower is better, as bm25()'s), phrase i being in
    `documents[i]` memories: the inverse document frequencies of the phrases it holds, each once,
    scaled by its length in tokens against the average. A count above keywords.COMMON_EXACT is a
    lower bound: that word weighs a little more than its share, and it is the only word searched
    (keywords.selective keeps one common word alone)."""
    stats = api.aux_data
    if stats is None:  # once per query: everything but the row's phrases and length
        rows = max(api.row_count, 1)
        average_length = api.column_total_size(-1) / rows or 1.0
        weights = tuple(enumerate(-bm25.idf(n, rows) * (bm25.K1 + 1) for n in documents))
        stats = api.aux_data = (weights, 1 + bm25.K1 * (1 - bm25.B), bm25.K1 * bm25.B / average_length)
    weights, fixed, per_token = stats
    if len(weights) == 1:
        held = weights[0][1]  # the row matched the only phrase
    else:
        # called for every match, holding the GIL: one attribute lookup, a plain loop (a list
        # comprehension is a call of its own); the same sum in the same order as sum() makes
        columns = api.phrase_columns
        held = 0.0
        for phrase, weight in weights:
            if columns(phrase):
                held += weight
    return held / (fixed + per_token * api.column_size(-1))


def register_scorer(conn) -> None:
    """Make SCORER callable on `conn` (db.connect does it for every connection it opens;
    plan() for any other)."""
    if conn not in _scorer_registered:
        conn.register_fts5_function(SCORER, once_bm25)
        _scorer_registered.add(conn)


def visible_at_least(conn, where: str, keys: list[str], cap: int) -> int:
    """How many active memories are under `keys`, counted up to `cap` (+1) only."""
    return conn.execute(f"SELECT count(*) FROM (SELECT 1 FROM memories WHERE {where} AND archived_at IS NULL "
                        "LIMIT ?)", (*keys, cap + 1)).fetchall()[0][0]


_COUNT_SQL = "(SELECT count(*) FROM (SELECT 1 FROM memories_fts WHERE memories_fts MATCH ? LIMIT ?))"


def doc_count(conn, word: str, limit: int) -> int:
    """How many memories contain `word`, exactly up to `limit`; above it, some number > limit."""
    return doc_counts(conn, [word], limit)[word]


def doc_counts(conn, words: list[str], limit: int) -> dict[str, int]:
    """doc_count of each of `words`: the cached ones from the cache, the others counted in one
    statement (a query's new words were a statement each, and each statement hands the GIL
    over between the read connections' threads)."""
    cache = keywords._counts.setdefault(keywords._database(conn), {})
    now = time.monotonic()
    out: dict[str, int] = {}
    for word in words:
        hit = cache.get(word)
        if hit is not None and now - hit[2] < keywords.COUNT_TTL_S and (hit[0] <= hit[1] or hit[1] >= limit):
            out[word] = hit[0]
    missing = [word for word in dict.fromkeys(words) if word not in out]
    if missing:
        if len(cache) + len(missing) > keywords.COUNT_CACHE_MAX:
            cache.clear()
        row = conn.execute("SELECT " + ", ".join([_COUNT_SQL] * len(missing)),
                           [value for word in missing for value in (quote(word), limit + 1)]).fetchall()[0]
        for word, count in zip(missing, row, strict=True):
            cache[word] = (count, limit, now)
            out[word] = count
    return out
