"""bench/update_relation.py's reordering: the newer of a pair just above the older, and the update order read back."""
from __future__ import annotations

from bench import update_relation


def test_the_newer_moves_just_above_the_older_and_only_when_below_it():
    said_at = {"a": 1.0, "b": 2.0, "c": 3.0, "d": 4.0}.__getitem__
    moved, done = update_relation.move_newer_up(["a", "b", "c", "d"], [("a", "c"), ("b", "d")], said_at)
    assert moved == ["c", "a", "d", "b"] and done == [("a", "c"), ("b", "d")]
    # a newer already above its older is left where it is, and not counted
    moved, done = update_relation.move_newer_up(["c", "a", "b"], [("a", "c")], said_at)
    assert moved == ["c", "a", "b"] and done == []


def test_the_update_order_needs_both_turns_found():
    row = {"original": ["a"], "updated": ["c"]}
    assert update_relation.updated_above(["c", "a"], row) is True
    assert update_relation.updated_above(["a", "b", "c"], row) is False
    assert update_relation.updated_above(["a", "b"], row) is None
    assert update_relation.updates_of(row) == {("a", "c")}
