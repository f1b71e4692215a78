"""bot/memory/clocks.py: date phrases read against the day they were said, in the server's time zone."""
from __future__ import annotations

from datetime import UTC, date, datetime
from zoneinfo import ZoneInfo

import pytest

from bot.memory import clocks
from bot.memory.clocks import FUTURE, PAST, Span

WED = date(2026, 3, 4)  # a Wednesday


def read(text: str, today: date = WED, lean: str | None = None) -> list[str]:
    return [span.iso() for _, span in sorted(clocks.spans(text, today, lean), key=lambda item: item[0])]


@pytest.mark.parametrize("text, lean, expected", [
    ("tomorrow I fly to Rome", None, ["2026-03-05"]),
    ("Tomorrow!", None, ["2026-03-05"]),
    ("yesterday", None, ["2026-03-03"]),
    ("today", None, ["2026-03-04"]),
    ("tonight we play", None, ["2026-03-04"]),
    ("this evening", None, ["2026-03-04"]),
    ("the day after tomorrow", None, ["2026-03-06"]),
    ("the day before yesterday", None, ["2026-03-02"]),
    ("on Friday", FUTURE, ["2026-03-06"]),
    ("on Friday", PAST, ["2026-02-27"]),
    ("on Friday", None, ["2026-02-27", "2026-03-06"]),     # a question: both readings
    ("on Wednesday", FUTURE, ["2026-03-04"]),              # today is one
    ("on Wednesday", PAST, ["2026-02-25"]),
    ("this Friday", None, ["2026-03-06"]),
    ("this coming Monday", None, ["2026-03-09"]),
    ("next Friday", None, ["2026-03-13"]),                 # the Friday of next week
    ("next Monday", None, ["2026-03-09"]),
    ("last Friday", None, ["2026-02-27"]),
    ("last Wednesday", None, ["2026-02-25"]),
    ("every Friday", None, []),                            # a habit, not a date
    ("on Fridays", None, []),
    ("next week", None, ["2026-03-09/2026-03-15"]),
    ("last week", None, ["2026-02-23/2026-03-01"]),
    ("this week", None, ["2026-03-02/2026-03-08"]),
    ("this weekend", None, ["2026-03-07/2026-03-08"]),
    ("last weekend", None, ["2026-02-28/2026-03-01"]),
    ("next month", None, ["2026-04-01/2026-04-30"]),
    ("last month", None, ["2026-02-01/2026-02-28"]),
    ("last year", None, ["2025-01-01/2025-12-31"]),
    ("in 3 days", None, ["2026-03-07"]),
    ("in three days", None, ["2026-03-07"]),
    ("in a couple of days", None, ["2026-03-06"]),
    ("3 days ago", None, ["2026-03-01"]),
    ("a week ago", None, ["2026-02-22/2026-02-28"]),       # the seven days around that day
    ("in two weeks", None, ["2026-03-15/2026-03-21"]),
    ("two months ago", None, ["2026-01-01/2026-01-31"]),   # that calendar month
    ("a year ago", None, ["2025-01-01/2025-12-31"]),
    ("two days from now", None, ["2026-03-06"]),
    ("in 5000 days", None, []),
    ("2026-03-10", None, ["2026-03-10"]),
    ("2026-02-31", None, []),
    ("5 March 2026", None, ["2026-03-05"]),
    ("March 5th, 2026", None, ["2026-03-05"]),
    ("the 5th of March", FUTURE, ["2026-03-05"]),
    ("on 1 March", FUTURE, ["2027-03-01"]),                # passed this year: next year's
    ("on 1 March", PAST, ["2026-03-01"]),
    ("Dec 24", FUTURE, ["2026-12-24"]),
    ("Dec 24", PAST, ["2025-12-24"]),
    ("in March 2027", None, ["2027-03-01/2027-03-31"]),
    ("in June", FUTURE, ["2026-06-01/2026-06-30"]),
    ("in June", PAST, ["2025-06-01/2025-06-30"]),
    ("next June", None, ["2026-06-01/2026-06-30"]),
    ("last March", None, ["2025-03-01/2025-03-31"]),
    ("you may march in may", None, []),                    # verbs
    ("we march 3 miles", None, []),
    ("in May", FUTURE, ["2026-05-01/2026-05-31"]),
    ("May 5", FUTURE, ["2026-05-05"]),
    ("at 5:30", None, []),
    ("Alice lives in Oslo.", None, []),
])
def test_phrases(text, lean, expected):
    assert read(text, lean=lean) == expected


def test_month_arithmetic_clamps_the_day():
    assert clocks.add_months(date(2026, 1, 31), 1) == date(2026, 2, 28)
    assert clocks.add_months(date(2024, 3, 31), -1) == date(2024, 2, 29)
    assert clocks.add_months(date(2026, 1, 15), -2) == date(2025, 11, 15)
    assert read("a month ago", today=date(2026, 3, 31)) == ["2026-02-01/2026-02-28"]


def test_leap_day_without_a_year_is_the_nearest_leap_year():
    assert read("on 29 February", today=date(2026, 3, 4), lean=FUTURE) == ["2028-02-29"]
    assert read("on 29 February", today=date(2026, 3, 4), lean=PAST) == ["2024-02-29"]


def test_the_tense_decides_a_bare_weekday():
    assert clocks.lean_of("Alice has a dentist appointment on Friday.") == FUTURE
    assert clocks.lean_of("Alice will fly to Rome on Friday.") == FUTURE
    assert clocks.lean_of("Alice went hiking on Friday.") == PAST
    assert clocks.lean_of("Alice visited her aunt on Friday.") == PAST


def test_the_day_is_the_server_time_zone_s():
    # 23:30 in New York on 1 Nov 2026 is already 2 Nov in UTC
    said = datetime(2026, 11, 2, 4, 30, tzinfo=UTC).timestamp()
    assert clocks.event_date("Alice flies tomorrow.", said, ZoneInfo("America/New_York")) == Span.day(date(2026, 11, 2))
    assert clocks.event_date("Alice flies tomorrow.", said, UTC) == Span.day(date(2026, 11, 3))
    # 00:30 in Tokyo is the day before in UTC
    said = datetime(2026, 3, 3, 15, 30, tzinfo=UTC).timestamp()
    assert clocks.question_dates("what did I do yesterday?", said, ZoneInfo("Asia/Tokyo")) == [
        Span.day(date(2026, 3, 3))]


def test_days_not_seconds_across_a_daylight_saving_change():
    oslo = ZoneInfo("Europe/Oslo")
    # late on the Saturday before the clocks go forward (29 Mar 2026, a 23-hour day)
    said = datetime(2026, 3, 28, 23, 45, tzinfo=oslo).timestamp()
    assert clocks.event_date("Alice runs a race tomorrow.", said, oslo) == Span.day(date(2026, 3, 29))
    assert clocks.event_date("Alice rests the day after tomorrow.", said, oslo) == Span.day(date(2026, 3, 30))
    # just after midnight following the 23-hour day: "yesterday" is that day, not two days back
    asked = datetime(2026, 3, 30, 0, 15, tzinfo=oslo).timestamp()
    assert clocks.question_dates("what did I do yesterday", asked, oslo) == [Span.day(date(2026, 3, 29))]
    # and the 25-hour day in autumn (25 Oct 2026)
    asked = datetime(2026, 10, 25, 23, 59, tzinfo=oslo).timestamp()
    assert clocks.question_dates("and tomorrow?", asked, oslo) == [Span.day(date(2026, 10, 26))]


def test_the_first_date_a_statement_names_is_its_event():
    said = datetime(2026, 3, 4, 12, tzinfo=UTC).timestamp()
    assert clocks.event_date("Alice flies to Rome tomorrow and back next week.", said, UTC) == Span.day(date(2026, 3, 5))
    assert clocks.event_date("Alice lives in Oslo.", said, UTC) is None


@pytest.mark.parametrize("value, expected", [
    ("2026-03-05", "2026-03-05"),
    (" 2026-03-09/2026-03-15 ", "2026-03-09/2026-03-15"),
    ("2026-03-05/2026-03-05", "2026-03-05"),
    ("2026-3-5", None), ("tomorrow", None), ("2026-03-15/2026-03-09", None), ("2026-02-30", None),
    ("2000-01-01/2030-01-01", None), ("", None), (None, None), (20260305, None), ("2026-03-05/x/y", None),
])
def test_parse_takes_dates_and_intervals_only(value, expected):
    span = clocks.parse(value)
    assert (span.iso() if span else None) == expected


def test_check_refuses_what_is_not_a_date_in_one_line():
    assert clocks.check(None) is None
    assert clocks.check("2026-03-05") == "2026-03-05"
    with pytest.raises(ValueError, match="happens_on must be a date"):
        clocks.check("next Friday")


def test_span_text_for_people():
    assert Span.day(date(2026, 3, 5)).text() == "5 Mar 2026"
    assert Span(date(2026, 3, 9), date(2026, 3, 15)).text() == "9 Mar 2026 to 15 Mar 2026"
