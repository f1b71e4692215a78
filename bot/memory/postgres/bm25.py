"""PostgreSQL's keyword score: BM25 over each memory's tsvector, a word counted once per memory.

ts_rank_cd (cover density), the score before, knows neither how rare a word is nor how long
a memory is: a long memory holding a question's commoner words many times outranked the short
one holding its rarest word, and on long conversations the keyword path found little
(docs/performance.md has the measurements). Here each searched
word a memory holds adds its inverse document frequency (from the word counts the keyword step
takes anyway; the database's size is its newest id, as for the common-word rule), and the sum
is scaled by the memory's length in distinct words against the average of the newest
memories, as BM25 does. A word's repeats within one memory are not counted: memories are short,
and reading positions out of the tsvector in SQL cost more than it told.
"""
from __future__ import annotations

import time
from typing import Any

from bot.memory.postgres.connection import PgConnection
from bot.memory.recall.bm25 import K1, B, idf

__all__ = ["B", "K1", "idf", "average_length", "score_sql"]
AVERAGE_SAMPLE = 2000   # the newest active memories whose lengths give the average
AVERAGE_TTL_S = 600.0
# Per database URL: (average length in distinct words, when measured).
_averages: dict[str, tuple[float, float]] = {}


def average_length(conn: PgConnection, database: str) -> float:
    """The newest active memories' average tsvector length, measured at most every AVERAGE_TTL_S."""
    now = time.monotonic()
    hit = _averages.get(database)
    if hit is None or now - hit[1] >= AVERAGE_TTL_S:
        row = conn.pg.execute("SELECT avg(length(text_search)) FROM (SELECT text_search FROM memories "
                              "WHERE archived_at IS NULL ORDER BY id DESC LIMIT %s) newest",
                              (AVERAGE_SAMPLE,)).fetchone()
        hit = (max(1.0, float(row[0])) if row and row[0] is not None else 1.0, now)
        _averages[database] = hit
    return hit[0]


def score_sql(words: list[str], counts: dict[str, int], memories: int, average: float) -> tuple[str, list[Any]]:
    """The SQL of the BM25 score of `h.text_search` for `words` (higher is better), and its parameters."""
    held = " + ".join(["CASE WHEN h.text_search @@ plainto_tsquery('muninn', %s) THEN %s ELSE 0 END"] * len(words))
    params: list[Any] = []
    for word in words:
        params += [word, idf(counts.get(word, 1), memories)]
    scale = "%s / (1 + %s * (1 - %s + %s * length(h.text_search) / %s))"
    return f"(({held}) * {scale})", [*params, K1 + 1, K1, B, B, average]
