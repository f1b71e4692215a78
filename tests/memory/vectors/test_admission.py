"""Which cold keys the vector cache admits: the second miss within the window, not the first."""
from __future__ import annotations

from bot.memory.vectors import admission
from bot.memory.vectors.admission import SecondHit


def test_a_key_is_admitted_on_its_second_miss_within_the_window():
    hits = SecondHit(60.0)
    assert not hits.admit("p:1", now=0.0)
    assert not hits.admit("p:2", now=1.0)
    assert hits.admit("p:1", now=30.0)
    assert not hits.admit("p:1", now=31.0)  # admitted once: its next miss starts over


def test_a_miss_older_than_the_window_counts_as_a_first_one():
    hits = SecondHit(60.0)
    assert not hits.admit("p:1", now=0.0)
    assert not hits.admit("p:1", now=61.0)
    assert hits.admit("p:1", now=100.0)


def test_without_a_window_every_miss_is_admitted():
    """SQLite's source names no window: its cold keys load on their first miss, as before."""
    hits = SecondHit(0.0)
    assert hits.admit("p:1", now=0.0) and hits.admit("p:1", now=0.0)


def test_the_oldest_misses_are_forgotten_first(monkeypatch):
    monkeypatch.setattr(admission, "REMEMBERED_MAX", 2)
    hits = SecondHit(60.0)
    for i, key in enumerate(("a", "b", "c")):
        assert not hits.admit(key, now=float(i))
    assert not hits.admit("a", now=3.0)  # forgotten: a first miss again
    assert hits.admit("c", now=4.0)
    hits.clear()
    assert not hits.admit("a", now=5.0)
