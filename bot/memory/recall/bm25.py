"""BM25's constants and word weight, shared by both backends' keyword scores.

Both count a searched word once per memory (sqlite/fts.py's scorer, postgres/bm25.py): memories
are short, and counting repeats let a long memory holding a question's commoner words many
times outrank the short one holding its rarest word.
"""
from __future__ import annotations

import math

K1 = 1.2    # BM25's usual constants (FTS5's bm25() uses the same)
B = 0.75


def idf(count: int, memories: int) -> float:
    """BM25's inverse document frequency of a word found in `count` of `memories` memories
    (Lucene's form: never negative, so a word in most memories still adds a little)."""
    memories = max(memories, count)
    return math.log(1.0 + (memories - count + 0.5) / (count + 0.5))
