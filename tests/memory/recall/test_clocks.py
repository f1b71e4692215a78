"""Recall and the two clocks: relative dates in the question (bot/memory/recall/dates.py, happens.py)
and newer before older where two memories disagree (newer.py). Real engine and database on both
backends, the fake Ollama for embeddings."""
from __future__ import annotations

from datetime import UTC, date, datetime
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bot.memory.clocks import Span
from bot.memory.engine import Engine
from bot.memory.recall import changes, newer
from bot.memory.recall.dates import DateHint, SpanHint, hints
from bot.memory.recall.words import tokens
from bot.memory.records import NewMemory
from bot.memory.scope import Viewer
from bot.memory.storage import storage_of
from bot.memory.writing import rules
from bot.memory.writing.rules import content_words

DAY = 86400.0
NOW = datetime(2026, 3, 4, 18, tzinfo=UTC).timestamp()   # Wednesday 4 March 2026, evening
ME = Viewer(user_id=7, dm=True)

pytestmark = pytest.mark.usefixtures("backend")


def mine(text: str, *, at: float, happens: str | None = None) -> NewMemory:
    return NewMemory(text, "personal", owner_id=7, created_at=at, happens_on=happens)


def test_relative_dates_of_a_question_are_days_in_the_server_time_zone():
    assert hints("what did I do yesterday?", NOW, UTC) == [SpanHint.of(Span.day(date(2026, 3, 3)))]
    assert hints("what's on Friday?", NOW, UTC) == [SpanHint.of(Span.day(date(2026, 2, 27))),
                                                    SpanHint.of(Span.day(date(2026, 3, 6)))]
    assert hints("what happened two months ago", NOW, UTC) == [SpanHint.of(Span(date(2026, 1, 1), date(2026, 1, 31)))]
    assert hints("anything last week?", NOW, UTC) == [SpanHint.of(Span(date(2026, 2, 23), date(2026, 3, 1)))]
    # 18:00 UTC on the 4th is already the 5th in Tokyo
    assert hints("what did I do yesterday?", NOW, ZoneInfo("Asia/Tokyo")) == [SpanHint.of(Span.day(date(2026, 3, 4)))]
    # a calendar date stays as it was; without the moment only calendar dates are read
    assert hints("what did I do in March?", NOW, UTC) == [DateHint(3)]
    assert hints("what did I do yesterday?") == []


def test_a_named_date_matches_a_happens_span():
    assert DateHint(3).overlaps(Span(date(2026, 2, 27), date(2026, 3, 2)))
    assert DateHint(3, 5, 2026).overlaps(Span.day(date(2026, 3, 5)))
    assert not DateHint(3, 5, 2025).overlaps(Span.day(date(2026, 3, 5)))
    assert not DateHint(2, 29).overlaps(Span.day(date(2026, 2, 28)))
    assert SpanHint.of(Span.day(date(2026, 3, 6))).overlaps(Span(date(2026, 3, 2), date(2026, 3, 8)))


async def test_what_did_i_do_yesterday_finds_yesterday_s_memory(engine: Engine):
    # the same three memories for two people, said on other days: the date decides, not the words
    days = {7: (7, 1, 0), 8: (1, 7, 0)}
    found = {}
    for owner, (swim, hike, cook) in days.items():
        ids = [await engine.remember(NewMemory(text, "personal", owner_id=owner, created_at=NOW - ago * DAY - 3600))
               for text, ago in (("Alice went swimming at the lake with Bo", swim),
                                 ("Alice went hiking in the hills", hike), ("Alice cooked pasta for dinner", cook))]
        result = await engine.recall("what did I do yesterday?", Viewer(user_id=owner, dm=True), as_of=NOW, touch=False)
        assert len(result.ids) == 3
        found[owner] = ids.index(result.ids[0])
    assert found == {7: 1, 8: 0}   # hiking for the first, swimming for the second


async def test_what_is_on_friday_finds_the_event_told_earlier(engine: Engine):
    # told on Monday, about Friday; nothing else is about Friday
    dentist = await engine.remember(mine("Alice has a dentist appointment", at=NOW - 2 * DAY, happens="2026-03-06"))
    meeting = await engine.remember(mine("Alice has a team meeting", at=NOW - 2 * DAY, happens="2026-03-10"))
    other = await engine.remember(mine("Alice has a new bicycle", at=NOW - DAY))
    assert (await engine.recall("what do I have on Friday?", ME, as_of=NOW, touch=False)).ids[0] == dentist
    assert (await engine.recall("what do I have next Tuesday?", ME, as_of=NOW, touch=False)).ids[0] == meeting
    found = await engine.recall("what do I have?", ME, as_of=NOW, touch=False)
    assert set(found.ids) == {dentist, meeting, other}


async def test_a_trip_next_week_is_found_by_the_day_it_spans(fts_engine: Engine):
    trip = await fts_engine.remember(mine("Alice travels to Rome", at=NOW - 5 * DAY, happens="2026-03-09/2026-03-15"))
    visit = await fts_engine.remember(mine("Alice travels to Lyon", at=NOW - 4 * DAY))
    assert (await fts_engine.recall("where do I travel", ME, as_of=NOW, touch=False)).ids[0] == visit
    assert (await fts_engine.recall("where do I travel on Thursday next week? next Thursday", ME,
                                    as_of=NOW, touch=False)).ids[0] == trip


async def test_the_newer_of_two_disagreeing_memories_goes_first(fts_engine: Engine):
    oslo = await fts_engine.remember(mine("Alice lives in Oslo, Norway", at=NOW - 200 * DAY))
    bergen = await fts_engine.remember(mine("Alice lives in Bergen, Norway", at=NOW - 10 * DAY))
    other = await fts_engine.remember(mine("Alice lives with two cats", at=NOW - 5 * DAY))
    result = await fts_engine.recall("does Alice live in Oslo?", ME, as_of=NOW, touch=False)
    assert result.ids[:2] == [bergen, oslo]   # by keywords alone Oslo led
    reasons = {r.memory.id: r.candidate.reason() for r in result.memories}
    assert reasons[oslo]["outdated_by"] == bergen
    assert "outdated_by" not in reasons[bergen] and "outdated_by" not in reasons.get(other, {})


async def test_two_things_done_and_dated_questions_keep_their_order(fts_engine: Engine):
    tom = await fts_engine.remember(mine("Alice went hiking with Tom in Nordmarka", at=NOW - 30 * DAY))
    ann = await fts_engine.remember(mine("Alice went hiking with Ann", at=NOW - 2 * DAY))
    result = await fts_engine.recall("hiking with Tom in Nordmarka", ME, as_of=NOW, touch=False)
    assert result.ids[:2] == [tom, ann]
    assert all("outdated_by" not in r.candidate.reason() for r in result.memories)
    oslo = await fts_engine.remember(mine("Alice lives in Oslo, Norway", at=NOW - 40 * DAY))
    bergen = await fts_engine.remember(mine("Alice lives in Bergen, Norway", at=NOW - DAY))
    # the question asks about a time: what was said then leads
    result = await fts_engine.recall("where did Alice live in Oslo two months ago?", ME, as_of=NOW, touch=False)
    assert result.ids.index(oslo) < result.ids.index(bergen)


async def test_a_supersede_link_puts_the_newer_first(fts_engine: Engine):
    acme = await fts_engine.remember(mine("Alice works as an engineer at Acme", at=NOW - 90 * DAY))
    initech = await fts_engine.remember(mine("Alice started a new job as engineer", at=NOW - 3 * DAY))
    assert (await fts_engine.recall("Alice engineer Acme", ME, as_of=NOW, touch=False)).ids[:2] == [acme, initech]
    await fts_engine.write(lambda conn: storage_of(conn).add_link(conn, acme, initech, "superseded_by", now=NOW))
    result = await fts_engine.recall("Alice engineer Acme", ME, as_of=NOW, touch=False)
    assert result.ids[:2] == [initech, acme]
    assert result.memories[1].candidate.outdated_by == initech


def said(memory_id: int, text: str, at: float, owner: int = 7, scope: str = "personal") -> newer.Said:
    return newer.Said(memory_id, text, scope, owner if scope == "personal" else None, 70, at)


@pytest.mark.parametrize("a, b, expected", [
    ("Alice lives in Oslo", "Alice lives in Bergen", True),
    ("Alice's favourite colour is blue", "Alice's favourite colour is green", True),
    ("The quiz starts at 9", "The quiz starts at 10", True),
    ("Alice works at Acme", "Alice works at Acme as a nurse", False),     # an addition
    ("Alice likes pizza", "Alice likes hiking", False),                   # two likings
    ("Alice has a dog named Rex", "Alice has a cat named Tom", False),
    ("Alice went hiking with Tom", "Alice went hiking with Ann", False),  # two events
    ("Alice lives in Oslo", "Alice lives in Oslo", False),
])
def test_what_disagrees(a, b, expected):
    assert newer.disagree(said(1, a, 1.0), said(2, b, 2.0)) is expected


def test_other_subjects_never_disagree():
    assert not newer.disagree(said(1, "Alice lives in Oslo", 1.0, owner=7), said(2, "Alice lives in Bergen", 2.0, owner=8))
    assert not newer.disagree(said(1, "The quiz starts at 9", 1.0, scope="room"),
                              said(2, "The quiz starts at 10", 2.0))


def test_content_words_are_kept_across_recalls_within_a_bound():
    texts = ["Alice lives in Oslo", "Alice lives in Bergen", "The quiz starts at 9", "The quiz starts at 10"]
    for text in texts:
        assert newer.words_of(text) == frozenset(content_words(text))
    assert newer.words_of(texts[3]) is newer.words_of(texts[3])  # read once
    info = newer.words_of.cache_info()
    assert info.maxsize == newer.WORDS_KEPT and info.currsize <= newer.WORDS_KEPT  # never past the bound


def test_stems_are_kept_within_a_bound():
    for text in ["Alice lives in Oslo", "Bob lived there, living well", "Alice lives in Oslo"]:
        assert content_words(text) == {rules._stem(word) for word in tokens(text)}
    info = rules._kept_stem.cache_info()
    assert info.hits and info.maxsize == rules.STEMS_KEPT and info.currsize <= rules.STEMS_KEPT
    assert content_words("lives living lived") == {"liv"}


def test_words_too_unequal_in_number_never_disagree():
    short, long = "Alice lives in Oslo", "Alice lives in Bergen with her two cats, a dog and three goldfish"
    assert not newer.disagree(said(1, short, 1.0), said(2, long, 2.0))
    assert newer.disagree(said(1, short, 1.0), said(2, "Alice lives in Bergen", 2.0))


def _disagree_with_sets(a: newer.Said, b: newer.Said) -> bool:
    """newer.disagree as sets say it, for the check below."""
    if a.subject != b.subject or not a.words - b.words or not b.words - a.words:
        return False
    shared = rules.jaccard(set(a.words), set(b.words))
    if shared < newer.SHARED or (a.past and b.past):
        return False
    if rules.values_conflict(a.text, b.text):
        return True
    return (shared >= newer.SHARED_WORDS and len(a.words - b.words) <= newer.CHANGED
            and len(b.words - a.words) <= newer.CHANGED)


WORDS = st.sampled_from(["Alice", "lives", "lived", "in", "Oslo", "Bergen", "blue", "green", "quiz", "at", "9", "10",
                         "went", "hiking", "with", "Tom", "Ann", "will", "the", "cat", "dog", "Acme", "nurse"])


@settings(max_examples=500, deadline=None)
@given(st.lists(WORDS, max_size=6), st.lists(WORDS, max_size=3), st.lists(WORDS, max_size=3))
def test_disagree_answers_as_the_sets_do(shared, only_a, only_b):
    """Near texts (a common part, a few words of their own, either possibly none)."""
    a, b = said(1, " ".join(shared + only_a), 1.0), said(2, " ".join(only_b + shared), 2.0)
    assert newer.disagree(a, b) is _disagree_with_sets(a, b)


async def test_an_event_on_the_named_date_is_found_without_a_shared_word(fts_engine: Engine):
    dentist = await fts_engine.remember(mine("Alice has a dentist appointment", at=NOW - 2 * DAY, happens="2026-03-06"))
    lunch = await fts_engine.remember(mine("Alice had lunch with Bo on Friday", at=NOW - 6 * DAY))
    trip = await fts_engine.remember(mine("Alice travels to Rome", at=NOW - 9 * DAY, happens="2026-03-02/2026-03-08"))
    await fts_engine.remember(mine("Alice visits the zoo", at=NOW - DAY, happens="2026-03-20"))
    # someone else's event that day, a forgotten one, and one told after the question: never
    await fts_engine.remember(NewMemory("Bob has a dentist appointment", "personal", owner_id=8, created_at=NOW - DAY,
                                        happens_on="2026-03-06"))
    gone = await fts_engine.remember(mine("Alice has a haircut", at=NOW - DAY, happens="2026-03-06"))
    await fts_engine.write(lambda conn: storage_of(conn).archive(conn, gone, "test", now=NOW))
    await fts_engine.remember(mine("Alice has a concert", at=NOW + DAY, happens="2026-03-06"))
    result = await fts_engine.recall("what do I have on Friday?", ME, as_of=NOW, touch=False)
    assert set(result.ids) == {dentist, lunch, trip} and result.ids[0] == dentist
    assert (await fts_engine.recall("what do I have?", ME, as_of=NOW, touch=False)).ids == []  # no word, no date


async def test_a_value_said_to_have_changed_goes_first_when_asked_as_it_stands(fts_engine: Engine):
    # the two share too few words to be one sentence with a value changed (newer.disagree)
    then = await fts_engine.remember(mine("Zotero library: 45 sources", at=NOW - 40 * DAY))
    since = await fts_engine.remember(mine("I've added more papers and now my Zotero library holds 52 sources in total, "
                                           "tagged by theme", at=NOW - 5 * DAY))
    result = await fts_engine.recall("How many sources are in my Zotero library?", ME, as_of=NOW, touch=False)
    assert result.ids[:2] == [since, then]
    assert result.memories[1].candidate.outdated_by == since
    # asked about what was said, the older keeps its place (by keywords alone it leads)
    result = await fts_engine.recall("How many sources did my Zotero library have?", ME, as_of=NOW, touch=False)
    assert result.ids[:2] == [then, since]
    assert all(r.candidate.outdated_by is None for r in result.memories)


async def test_a_changed_value_keeps_its_place_with_the_setting_off(make_settings):
    async with Engine(make_settings("", MUNINN_CHANGED_VALUE_FIRST="false")) as engine:
        then = await engine.remember(mine("Zotero library: 45 sources", at=NOW - 40 * DAY))
        since = await engine.remember(mine("I've added more papers and now my Zotero library holds 52 sources in "
                                           "total, tagged by theme", at=NOW - 5 * DAY))
        result = await engine.recall("How many sources are in my Zotero library?", ME, as_of=NOW, touch=False)
        assert result.ids[:2] == [then, since]
        assert all(r.candidate.outdated_by is None for r in result.memories)


@pytest.mark.parametrize("question, older, newer_text, expected", [
    ("How many sources are in my Zotero library?", "My Zotero library has 45 sources",
     "I've added 52 sources to my Zotero library", True),
    ("When is my Zoom call with the creative director scheduled?",
     "I have a Zoom call with the creative director on April 21 at 3 PM",
     "My Zoom call with the creative director is rescheduled to April 22 at 11 AM", True),
    ("What is my weekly word count target?", "I wrote 1,200 words of my essay today",
     "My weekly word count target was adjusted to 1,350 words", False),          # the older is not about it
    ("What is my weekly word count target?", "My weekly word count target is 1,200 words",
     "I met my weekly word count target again, great week", False),              # no value changed
    ("How many days are there between my call and my deadline?", "My call with the director is on April 21",
     "The call with the director moved to April 22", False),                     # a span between two moments
    ("What did I say my Zotero library held?", "My Zotero library has 45 sources",
     "I've added 52 sources to my Zotero library", False),                       # what was said then
])
def test_what_counts_as_a_change_of_the_asked_value(question, older, newer_text, expected):
    asked = changes.asked_words(question)
    assert (asked is not None and changes.changed(older, newer_text, asked)) is expected
