"""The quick look before the date patterns (clocks.may_name_dates): a text it turns away holds no
date phrase of bot/memory/clocks.py or bot/memory/recall/dates.py, so skipping their scans
changes no question's dates."""
from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bot.memory import clocks
from bot.memory.recall import dates

NOW = datetime(2026, 3, 4, 18, tzinfo=UTC).timestamp()
PATTERNS = [pattern for _, pattern in (*clocks._PATTERNS, *dates._PATTERNS)]
PIECES = ["the", "of", "in", "on", "last", "next", "this", "coming", "past", "ago", "from now", "back", "within",
          "a couple of", "few", "two", "ten", "5", "21st", "2023", "1999", "2026-03-04", ",", ".", " ", "  ",
          "Jan", "Sept.", "march", "MAY", "July", "december", "Friday", "sundays", "monday", "today", "Tonight",
          "tomorrow", "yesterday", "morning", "evening", "weekend", "week", "weeks", "month", "years", "days",
          "day after", "day before", "Mid", "early", "since", "until", "every", "each", "'s", "time",
          "ſept", "İn", "K", "hello", "cat", "pizza", "alice", "lives", "bergen", "wed", "sat", "de", "é"]


def named(text: str) -> bool:
    return any(pattern.search(text) for pattern in PATTERNS)


def test_every_kind_of_date_phrase_passes_the_look():
    for text in ["on 2026-03-04", "5 March 2026", "March 5, 2026", "in May 2023", "the 3rd of June",
                 "June 3", "the day after tomorrow", "the day before yesterday", "this afternoon",
                 "two weeks ago", "in 3 days' time", "next weekend", "last month", "on Friday",
                 "every Sunday", "since September", "what did I do yesterday?", "two days ago",
                 "a few days from now", "within ten days", "a couple of years back", "this year"]:
        assert named(text), text
        assert clocks.may_name_dates(text), text


def test_a_question_without_date_words_is_turned_away_and_names_no_date():
    for text in ["what is my favourite pizza", "where does Alice live", "tell me about the cat", ""]:
        assert not clocks.may_name_dates(text)
        assert not named(text)
        assert dates.hints(text, NOW, UTC) == []
        assert clocks.question_dates(text, NOW, UTC) == []


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(PIECES), min_size=1, max_size=8), st.lists(st.sampled_from([" ", "", ", "]),
                                                                           min_size=8, max_size=8))
def test_whatever_a_pattern_finds_passes_the_look(words, gaps):
    text = "".join(word + gap for word, gap in zip(words, gaps, strict=False))
    if named(text):
        assert clocks.may_name_dates(text), text


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=40))
def test_any_text_a_pattern_finds_passes_the_look(text):
    if named(text):
        assert clocks.may_name_dates(text), text
