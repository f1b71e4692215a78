"""The baseline both quality protocols compare against: plain porter BM25 over the turns, no
decay, no touch, no scope machinery beyond a filter on each turn's group."""
from __future__ import annotations

from typing import Iterable, Sequence

import apsw

from bot.memory import records
from bot.memory.sqlite import fts


class Bm25Index:
    """Rows are (group, external_id, created_at, text); a question is asked of some groups
    (a conversation, or the visibility keys an asker sees), optionally as of a time."""

    def __init__(self, rows: Iterable[tuple[str, str, float, str]]):
        self.conn = apsw.Connection(":memory:")
        self.conn.execute("CREATE VIRTUAL TABLE t USING fts5(grp UNINDEXED, external_id UNINDEXED, "
                          "created_at UNINDEXED, text, tokenize = 'porter unicode61 remove_diacritics 2')")
        with self.conn:
            self.conn.executemany("INSERT INTO t VALUES (?, ?, ?, ?)",
                                  [(group, eid, created, records.clean_text(text)) for group, eid, created, text in rows])

    def ask(self, question: str, groups: Sequence[str], limit: int, as_of: float | None = None) -> list[str]:
        expression = fts.match_expression(question)
        if expression is None:
            return []
        marks = ",".join("?" * len(groups))
        return [row[0] for row in self.conn.execute(
            f"SELECT external_id FROM t WHERE t MATCH ? AND grp IN ({marks}) AND (? IS NULL OR created_at <= ?) "
            "ORDER BY bm25(t) LIMIT ?", (expression, *groups, as_of, as_of, limit))]
