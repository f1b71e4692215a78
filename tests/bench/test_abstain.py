"""bench/abstain.py's arithmetic: the signals of a question, the AUC, the floor chosen within its budget."""
from __future__ import annotations

import math

import pytest

from bench import abstain


class _Counts(abstain.Counts):
    def __init__(self, turns: list[str]):
        self.df = {"c": abstain.Counter(w for text in turns for w in abstain.words(text))}
        self.n = {"c": len(turns)}


def _row(conversation: str, dataset: str, score: float, *, evidence: bool, r10: float = 1.0,
         category: object = "x") -> dict:
    return {"conversation": conversation, "dataset": dataset, "category": category if evidence else "abstention",
            "evidence": ["t"] if evidence else [], "r10": r10, "signals": {"s": score}}


def test_auc_counts_pairs_and_halves_ties():
    assert abstain.auc([3.0, 4.0], [1.0, 2.0]) == 1.0
    assert abstain.auc([1.0], [2.0]) == 0.0
    assert abstain.auc([1.0, 2.0], [1.0]) == 0.75
    assert math.isnan(abstain.auc([], [1.0]))


def test_the_floor_stops_where_the_budget_would_be_spent():
    rows = [_row("a", "beam", v, evidence=True) for v in (0.2, 0.5, 0.6, 0.7)] + [
        _row("a", "beam", 0.1, evidence=False), _row("a", "beam", 0.3, evidence=False)]
    # emptying the 0.2 question costs a quarter of the R@10: over any small budget
    assert abstain.choose_floor(rows, "s", 0.01) == pytest.approx(0.1)
    assert abstain.choose_floor(rows, "s", 0.3) == pytest.approx(0.3)  # the 0.2 one may go, the 0.5 one not
    cv = abstain.floor_cv(rows + [_row("b", "beam", 0.9, evidence=True), _row("b", "beam", 0.05, evidence=False)],
                          "s", 0.01)
    # each conversation is judged by the floor of the other: a's (just above 0.1) empties b's 0.05 question,
    # b's (just above 0.05) none of a's
    assert cv["floors"] == {"a": pytest.approx(0.05), "b": pytest.approx(0.1)}
    assert cv["none_injected"]["beam:abstention"] == pytest.approx(1 / 3, abs=1e-4)  # rounded to 4 places
    assert cv["r10_lost"]["beam"] == 0.0


def test_a_question_whose_rare_words_the_memories_hold_is_covered():
    counts = _Counts(["Alice adopted a cat named Rex", "Bob likes tea", "Bob likes coffee", "the weather is nice"])
    row = {"conversation": "c", "question": "What colour is Alice's cat?",
           "recalled": [{"text": "Alice adopted a cat named Rex", "cosine": 0.7, "fts_score": -3.0},
                        {"text": "Bob likes tea", "cosine": 0.2, "fts_score": None}]}
    found = abstain.signals(row, counts)
    assert found["best_cosine"] == 0.7 and found["gap"] == pytest.approx(0.5)
    assert 0.0 < found["cover_best"] < 1.0   # "colour" is not in it, "alice" and "cat" are
    assert found["unseen"] < 0.0 and found["keyword_best"] == 3.0  # "colour" was never said at all
    assert found["target"] == 0.5            # not a number, date or place asked
