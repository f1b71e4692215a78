"""Which of a question's words the keyword path searches, on either backend: words too common to
be worth their cost are left out while a rarer one is there; and the cache of words' document
counts both backends keep (counted up to a limit, dropped as memories leave).
"""
from __future__ import annotations

import threading
from typing import Any, Callable

Counts = Callable[[Any, list[str], int], dict[str, int]]  # (conn, words, limit) -> each word's count up to limit

# A word found in more than COMMON_SHARE of all memories (and in at least COMMON_MIN_DOCS)
# is left out of the search: its BM25 weight is near zero, yet every row it matches must
# be joined and scope-checked, which made the keyword path grow with the whole database
# instead of with what the viewer can see. The KEEP_RAREST rarest words
# that occur at all always stay, so a query of common words still finds something (a word
# found nowhere must not take that place). `max(id)` stands in for the number of memories:
# it costs nothing, and overcounting only makes pruning more cautious.
COMMON_SHARE = 0.05
COMMON_MIN_DOCS = 500
KEEP_RAREST = 2
# Each match costs a few microseconds (bm25 reads its row's statistics; the scope check seeks
# its key), so a word in more than COMMON_MIN_DOCS memories joins only while the matches stay
# under this: a word in 3 % of 100k memories carries little BM25 weight and 3,000 rows of work.
# Small databases (LoCoMo: 1,451 turns) never reach it.
MATCH_BUDGET = 1500
COMMON_HITS = 1000
DENSE_VISIBLE = 5000
# A query of only common words keeps the rarest of them, counted exactly up to COMMON_EXACT
# (above it they tie, and the longest wins), and looks for it among the newest COMMON_WINDOW
# memories only. Scanning a word's whole doclist (most memories, for the commonest words) cost even a
# small viewer dearly and grows with the database; within the window it is bounded.
# A word that common carries almost no BM25 weight: the vector path finds the older memories.
COMMON_EXACT = 20_000
COMMON_WINDOW = 20_000


def selective(conn: Any, words: list[str], counts: Counts, *, limit: int | None = None) -> list[str]:
    """`words` without those too common to be worth searching: the rarest first; a word in more
    than COMMON_MIN_DOCS memories only while the matches so far stay within MATCH_BUDGET (the
    KEEP_RAREST rarest always stay); never a word in more than COMMON_SHARE of all memories
    while a rarer one is there. `counts` counts words' memories, each up to a limit (the
    backend's: FTS5's doc_counts, PostgreSQL's tsvector counts); `limit`: common_limit(conn),
    when the caller has it already."""
    if len(words) <= 1:
        return words
    limit = common_limit(conn) if limit is None else limit
    frequency = counts(conn, words, limit)
    kept: set[str] = set()
    matches = 0
    for rank, word in enumerate(sorted((w for w in words if 0 < frequency[w] <= limit), key=lambda w: frequency[w])):
        if rank >= KEEP_RAREST and frequency[word] > COMMON_MIN_DOCS and matches + frequency[word] > MATCH_BUDGET:
            break
        kept.add(word)
        matches += frequency[word]
    if not kept:
        # Only common words occur: keep the rarest, so the query still finds something (counted
        # exactly up to COMMON_EXACT, once per word and cached; past that, the longest).
        found = [w for w in words if frequency[w] > 0]
        exact = counts(conn, found, COMMON_EXACT)
        common = sorted(found, key=lambda w: (exact[w], -len(w)))
        kept = set(common[:1])
    return [w for w in words if w in kept or frequency[w] == 0]


def common_limit(conn, newest: int | None = None) -> int:
    """Above this many documents a word is common. Also where counting stops: a word above
    MATCH_BUDGET can only be kept as one of the rarest, so counting further buys nothing (and
    a count is as costly as the search it saves). `newest`: newest_id(conn), if read already."""
    total = newest_id(conn) if newest is None else newest
    return int(min(max(COMMON_SHARE * total, COMMON_MIN_DOCS), max(MATCH_BUDGET, COMMON_MIN_DOCS)))


def newest_visible_id(conn, keys: list[str]) -> int:
    """The newest active id under `keys`, one seek per key in the partial index of active
    memories (without `archived_at IS NULL` SQLite scans the table). The
    common-word window ends here, not at the database's newest memory: a viewer whose memories
    are all older than the last COMMON_WINDOW stored (a quiet DM in a busy bot) would otherwise
    find none of them by a common word (bench.quality's crowded world)."""
    seeks = " UNION ALL ".join(
        "SELECT (SELECT max(id) FROM memories WHERE vis_key = ? AND archived_at IS NULL) AS newest" for _ in keys)
    return int(conn.execute(f"SELECT coalesce(max(newest), 0) FROM ({seeks})", keys).fetchall()[0][0])


NEWEST_ID_SQL = "SELECT coalesce(max(id), 0) FROM memories"  # postgres/keywords.py memoises this statement


def newest_id(conn) -> int:
    """The highest memory id (0 when there is none); it stands in for the number of memories."""
    return int(conn.execute(NEWEST_ID_SQL).fetchall()[0][0])


# Common words' counts stay cached while fewer than FORGET_SLACK memories have left a database
# since its counts were all dropped: a count at most that many too high makes a word in more than
# COMMON_MIN_DOCS memories look a little more common (its class changes only within FORGET_SLACK
# of the common limit, 500 or more), for COUNT_TTL_S at most. Rarer words' counts go at once: a
# word whose only memory left would keep count 1 and be searched alone as the rarest word.
# Maintenance archives faded memories one at a time; each archive dropped every count, and the
# next recalls counted their common words again (a scan of thousands of entries each).
FORGET_SLACK = 50
_slack_lock = threading.Lock()
_removed_since_forget: dict[str, int] = {}  # per database: memories gone since its counts were dropped


def slack_left(database: str, removed: int | None) -> bool:
    """Whether `database`'s common words' counts may stay now that `removed` more memories left
    it (None: no). False resets its tally: the caller drops all its counts."""
    with _slack_lock:
        total = _removed_since_forget.get(database, 0) + (removed if removed is not None else FORGET_SLACK)
        if total < FORGET_SLACK:
            _removed_since_forget[database] = total
            return True
        _removed_since_forget.pop(database, None)
        return False


def reset_slack(databases: list[str]) -> None:
    """Start these databases' tallies again (their counts were all dropped)."""
    with _slack_lock:
        for database in databases:
            _removed_since_forget.pop(database, None)


def keep_common_counts(cache: dict[str, tuple[int, int, float]]) -> None:
    """Drop the counts of words in COMMON_MIN_DOCS memories or fewer (cheap to count again) from
    one database's cache; the common ones stay (FORGET_SLACK)."""
    for word, hit in list(cache.items()):  # list(): recalls on other threads add counts meanwhile
        if hit[0] <= COMMON_MIN_DOCS:
            cache.pop(word, None)


def forget_counts(conn, removed: int | None = None) -> None:
    """Memories left `conn`'s database: a word counted as common may not be any more (on any
    connection: recalls count on the read connections). `removed`: how many left; the common
    words' counts stay while FORGET_SLACK is not reached (None: all go now). conn None: every
    database's counts go."""
    if conn is None:
        reset_slack(list(_counts))
        _counts.clear()
        return
    database = _database(conn)
    if slack_left(database, removed):
        keep_common_counts(_counts.get(database, {}))
    else:
        _counts.pop(database, None)


# Document counts, counted up to the limit only (a full count of a common word costs as much
# as searching it) and kept for a while: they change slowly. Shared by all connections to one
# database file (an engine's readers and its writer): a word is counted once, not per reader.
_counts: dict[str, dict[str, tuple[int, int, float]]] = {}
COUNT_TTL_S = 600.0
COUNT_CACHE_MAX = 50_000


def _database(conn) -> str:
    return conn.filename or str(id(conn))


database_of = _database  # the name other modules key this database's counts by (removals.py)
