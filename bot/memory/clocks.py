"""The two clocks of a memory: when it was learned, and when what it tells happens.

A memory's `created_at` is when it was said (learned-at). `happens_on` is the calendar date of
the event it tells, when it names one: "tomorrow I fly to Rome", said on 4 March 2026, happens on
2026-03-05. It is stored as ISO 8601 text: one date, or an interval of dates
("2026-03-09/2026-03-15" for "next week"), read in the server's time zone (MUNINN_TIMEZONE).

`spans` reads the date phrases of a text against the day it was said, deterministically:

    today, tonight, tomorrow, yesterday, the day after tomorrow, the day before yesterday
    on Friday, this Friday, next Friday, last Friday, this weekend, next weekend, last weekend
    this/next/last week, month, year
    in 3 days, in two weeks, 3 days ago, two months ago, a year from now
    2026-03-05, 5 March 2026, March 5, 2026, 5 March, March 5, in March, March 2026

The choices, where English is ambiguous: a week starts on Monday; "next Friday" is the
Friday of next week and "last Friday" the latest Friday before today; a bare weekday or
date without a year ("on Friday", "5 March", "in March") is the next one in a plan and the
latest one in something past (`lean`), and both when the tense is unknown (a question);
"N weeks ago" is the seven days around that day, "N months ago" that calendar month, "N
years ago" that calendar year.
"""
from __future__ import annotations

import calendar
import re
from dataclasses import dataclass
from datetime import date, datetime, timedelta, tzinfo
from typing import Iterator

FUTURE = "future"
PAST = "past"

MONTHS = ("january", "february", "march", "april", "may", "june", "july", "august", "september", "october",
          "november", "december")
MONTH_ABBREVIATIONS = {name[:3]: i + 1 for i, name in enumerate(MONTHS)} | {"sept": 9}
WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
NUMBERS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
           "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "a couple of": 2, "a few": 3,
           "couple of": 2, "few": 3}
MAX_COUNT = 1000           # "in 5000 days" is not a date anyone means
MAX_SPAN_DAYS = 3660       # a stored interval longer than ten years is refused

_MONTH = r"(" + "|".join(MONTHS) + r"|jan|feb|mar|apr|jun|jul|aug|sept|sep|oct|nov|dec)\.?"
_DAY = r"(\d{1,2})(?:st|nd|rd|th)?"
_YEAR = r"((?:19|20)\d\d)"
_COUNT = r"(\d{1,4}|" + "|".join(sorted((re.escape(w) for w in NUMBERS), key=len, reverse=True)) + r")"
_UNIT = r"(day|week|month|year)s?"
_WEEKDAY = r"(" + "|".join(WEEKDAYS) + r")(s?)"


def _rx(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern, re.IGNORECASE)


# Longest forms first; each match is blanked out so that "5 March 2026" is not read again as "March".
_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("iso", _rx(r"\b(\d{4})-(\d{2})-(\d{2})\b")),
    ("dmy", _rx(rf"\b{_DAY}\s+(?:of\s+)?{_MONTH},?\s+{_YEAR}\b")),
    ("mdy", _rx(rf"\b{_MONTH}\s+{_DAY},?\s+{_YEAR}\b")),
    ("my", _rx(rf"\b{_MONTH},?\s+{_YEAR}\b")),
    ("dm", _rx(rf"\b(?:the\s+)?{_DAY}\s+(?:of\s+)?{_MONTH}\b(?!\s*\d)")),
    ("md", _rx(rf"\b{_MONTH}\s+{_DAY}\b(?!\d|:)")),
    ("day after", _rx(r"\bthe\s+day\s+after\s+tomorrow\b")),
    ("day before", _rx(r"\bthe\s+day\s+before\s+yesterday\b")),
    ("relative day", _rx(r"\b(today|tonight|tomorrow|yesterday|this\s+(?:morning|afternoon|evening))\b")),
    ("ago", _rx(rf"\b{_COUNT}\s+{_UNIT}\s+(ago|from\s+now|back)\b")),
    ("in", _rx(rf"\b(?:in|within)\s+{_COUNT}\s+{_UNIT}(?:'s)?(?:\s+time)?\b")),
    ("weekend", _rx(r"\b(this|next|last|coming|past)\s+weekend\b|\b(?:the|on\s+the)\s+weekend\b")),
    ("period", _rx(r"\b(this|next|last|coming|past)\s+(week|month|year)\b")),
    ("weekday", _rx(rf"\b(?:(this\s+coming|this|next|last|coming|past|on|every|each)\s+)?{_WEEKDAY}\b")),
    ("month", _rx(rf"\b(in|since|during|until|by|last|this|next|early|late|mid|of)\s+{_MONTH}\b")),
)
# What every date phrase above (and recall/dates.py's) holds, at the start of a word where it is a
# word: a digit, a month's or a weekday's first letters, a relative day, or a unit. A text without
# any is read no further (most questions name no date, and the patterns are many scans of it).
_ANY_DATE = _rx(r"\d|\b(?:jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec|mon|tue|wed|thu|fri|sat|sun|today|"
                r"tonight|tomorrow|yesterday|morning|afternoon|evening|day|week|month|year)")


def may_name_dates(text: str) -> bool:
    """False when `text` cannot hold a date phrase of this module's or recall/dates.py's (True
    does not mean it does)."""
    return _ANY_DATE.search(text) is not None


# Words that tell a statement's tense, for a bare weekday or date ("on Friday", "5 March").
_FUTURE_WORDS = _rx(r"\b(will|won't|shall|going\s+to|gonna|plans?|planning|planned|scheduled|intends?|hopes?|"
                    r"wants?|upcoming|next|tomorrow|soon|is\s+\w+ing|are\s+\w+ing|has\s+an?|have\s+an?)\b|'ll\b")
_PAST_WORDS = _rx(r"\b(was|were|went|did|had|ago|last|yesterday|used\s+to|got|came|saw|met|made|took|gave)\b|"
                  r"\b\w{3,}ed\b")


@dataclass(frozen=True, order=True)
class Span:
    """The days from `first` to `last`, both included (one day when they are equal)."""
    first: date
    last: date

    @classmethod
    def day(cls, when: date) -> "Span":
        """One day."""
        return cls(when, when)

    @classmethod
    def month(cls, year: int, month: int) -> "Span":
        """A calendar month."""
        return cls(date(year, month, 1), date(year, month, calendar.monthrange(year, month)[1]))

    @classmethod
    def year(cls, year: int) -> "Span":
        """A calendar year."""
        return cls(date(year, 1, 1), date(year, 12, 31))

    def iso(self) -> str:
        """As stored: "2026-03-05", or "2026-03-09/2026-03-15" for several days."""
        return self.first.isoformat() if self.first == self.last else f"{self.first.isoformat()}/{self.last.isoformat()}"

    def covers(self, when: date) -> bool:
        """Whether `when` falls in the span."""
        return self.first <= when <= self.last

    def overlaps(self, other: "Span") -> bool:
        """Whether the two spans share a day."""
        return self.first <= other.last and other.first <= self.last

    def text(self) -> str:
        """For people and the model: "5 Mar 2026", or "9 Mar 2026 to 15 Mar 2026"."""
        one = f"{self.first.day} {self.first:%b} {self.first.year}"
        if self.first == self.last:
            return one
        return f"{one} to {self.last.day} {self.last:%b} {self.last.year}"


def parse(value: object) -> Span | None:
    """A stored or model-given date ("2026-03-05", "2026-03-09/2026-03-15") as a Span; None for
    anything else (a bad value is dropped, never raised: it came from a model or an old row)."""
    if not isinstance(value, str) or not 10 <= len(value.strip()) <= 21:
        return None
    parts = value.strip().split("/")
    try:
        days = [date.fromisoformat(part.strip()) for part in parts] if len(parts) <= 2 else []
    except ValueError:
        return None
    if not days or any(len(part.strip()) != 10 for part in parts):
        return None
    first, last = days[0], days[-1]
    if last < first or (last - first).days > MAX_SPAN_DAYS:
        return None
    return Span(first, last)


def check(value: object) -> str | None:
    """`value` as a memory's `happens_on` (its canonical ISO text), None for none; ValueError
    for a value that is not a date or an interval of dates."""
    if value is None:
        return None
    span = parse(value)
    if span is None:
        raise ValueError("happens_on must be a date (YYYY-MM-DD) or an interval of dates (YYYY-MM-DD/YYYY-MM-DD)")
    return span.iso()


def local_day(ts: float, tz: tzinfo) -> date:
    """The calendar date of unix time `ts` in `tz`."""
    return datetime.fromtimestamp(ts, tz).date()


def add_months(when: date, months: int) -> date:
    """`when` moved by whole months, its day clamped to the month's length (31 Jan + 1 = 28/29 Feb)."""
    index = when.year * 12 + when.month - 1 + months
    year, month = divmod(index, 12)
    return date(year, month + 1, min(when.day, calendar.monthrange(year, month + 1)[1]))


def lean_of(text: str) -> str:
    """Whether a statement looks ahead (a plan) or back (something done), for a bare weekday or date."""
    if _FUTURE_WORDS.search(text):
        return FUTURE
    return PAST if _PAST_WORDS.search(text) else FUTURE


def _month_number(name: str) -> int:
    name = name.lower().rstrip(".")
    return MONTHS.index(name) + 1 if name in MONTHS else MONTH_ABBREVIATIONS[name[:4] if name == "sept" else name[:3]]


def _count(word: str) -> int:
    word = " ".join(word.lower().split())
    return int(word) if word.isdigit() else NUMBERS[word]


def _week(when: date) -> Span:
    monday = when - timedelta(days=when.weekday())
    return Span(monday, monday + timedelta(days=6))


def _shift(today: date, count: int, unit: str) -> Span:
    """The span `count` units away from today (negative: back): a day, the week around the
    day, a calendar month or a calendar year."""
    if unit == "day":
        return Span.day(today + timedelta(days=count))
    if unit == "week":
        middle = today + timedelta(days=7 * count)
        return Span(middle - timedelta(days=3), middle + timedelta(days=3))
    if unit == "month":
        moved = add_months(today, count)
        return Span.month(moved.year, moved.month)
    return Span.year(today.year + count)


def _choices(future: Span | None, past: Span | None, lean: str | None) -> list[Span]:
    """The reading of an ambiguous date by the lean: the next one, the last one, or both."""
    if lean == FUTURE:
        return [future] if future else []
    if lean == PAST:
        return [past] if past else []
    return [s for s in (past, future) if s is not None]


def _dated(today: date, month: int, day: int | None, lean: str | None) -> list[Span]:
    """A date or month without a year: the next and the last one."""
    def make(year: int) -> Span | None:
        try:
            return Span.day(date(year, month, day)) if day is not None else Span.month(year, month)
        except ValueError:  # 30 February, 31 April
            return None
    this = make(today.year)
    if this is None and day is not None and month == 2 and day == 29:
        # 29 February: the nearest leap years
        future = next((s for y in range(today.year, today.year + 8) if (s := make(y)) and s.last >= today), None)
        past = next((s for y in range(today.year, today.year - 8, -1) if (s := make(y)) and s.first <= today), None)
        return _choices(future, past, lean)
    if this is None:
        return []
    future = this if this.last >= today else make(today.year + 1)
    past = this if this.first <= today else make(today.year - 1)
    return _choices(future, past, lean)


def _weekday(today: date, word: str | None, name: str, lean: str | None) -> list[Span]:
    target = WEEKDAYS.index(name.lower())
    word = " ".join((word or "").lower().split())
    ahead = (target - today.weekday()) % 7             # 0: today
    coming = today + timedelta(days=ahead)
    previous = today - timedelta(days=(today.weekday() - target) % 7 or 7)
    if word == "next":
        return [Span.day(_week(today).first + timedelta(days=7 + target))]
    if word in ("last", "past"):
        return [Span.day(previous)]
    if word in ("this coming", "coming"):
        return [Span.day(coming)]
    if word == "this" and lean != PAST:
        return [Span.day(coming)]
    return _choices(Span.day(coming), Span.day(previous), lean)


def _weekend(today: date, word: str | None) -> Span:
    saturday = _week(today).first + timedelta(days=5)
    step = {"next": 1, "last": -1, "past": -1}.get((word or "this").lower(), 0)
    saturday += timedelta(days=7 * step)
    return Span(saturday, saturday + timedelta(days=1))


def _period(today: date, word: str, unit: str) -> Span:
    step = {"next": 1, "coming": 1, "last": -1, "past": -1}.get(word.lower(), 0)
    if unit == "week":
        week = _week(today)
        return Span(week.first + timedelta(days=7 * step), week.last + timedelta(days=7 * step))
    if unit == "month":
        moved = add_months(today.replace(day=1), step)
        return Span.month(moved.year, moved.month)
    return Span.year(today.year + step)


CALENDAR_FORMS = frozenset({"iso", "dmy", "mdy", "my", "dm", "md", "month"})
_VERBS = ("may", "march", "mar")  # months that are also verbs: only capitalised ("we march 3 miles")


def _read(form: str, groups: tuple, today: date, lean: str | None) -> list[Span]:
    month_word = next((g for g in groups if isinstance(g, str) and g.lower().rstrip(".") in _VERBS), None)
    if form in CALENDAR_FORMS and month_word is not None and not month_word[0].isupper():
        return []
    if form == "iso":
        return [Span.day(date(int(groups[0]), int(groups[1]), int(groups[2])))]
    if form == "dmy":
        return [Span.day(date(int(groups[2]), _month_number(groups[1]), int(groups[0])))]
    if form == "mdy":
        return [Span.day(date(int(groups[2]), _month_number(groups[0]), int(groups[1])))]
    if form == "my":
        return [Span.month(int(groups[1]), _month_number(groups[0]))]
    if form == "dm":
        return _dated(today, _month_number(groups[1]), int(groups[0]), lean)
    if form == "md":
        return _dated(today, _month_number(groups[0]), int(groups[1]), lean)
    if form == "day after":
        return [Span.day(today + timedelta(days=2))]
    if form == "day before":
        return [Span.day(today - timedelta(days=2))]
    if form == "relative day":
        word = groups[0].lower()
        shift = {"tomorrow": 1, "yesterday": -1}.get(word, 0)
        return [Span.day(today + timedelta(days=shift))]
    if form == "ago":
        count = _count(groups[0])
        if count > MAX_COUNT:
            return []
        back = groups[2].lower() in ("ago", "back")
        return [_shift(today, -count if back else count, groups[1].lower())]
    if form == "in":
        count = _count(groups[0])
        return [] if count > MAX_COUNT else [_shift(today, count, groups[1].lower())]
    if form == "weekend":
        return [_weekend(today, groups[0])]
    if form == "period":
        return [_period(today, groups[0], groups[1].lower())]
    if form == "weekday":
        if groups[2] or (groups[0] or "").lower() in ("every", "each"):
            return []  # "on Fridays", "every Friday": a habit, not a date
        return _weekday(today, groups[0], groups[1], lean)
    preposition, name = groups  # month
    word = preposition.lower()
    month = _month_number(name)
    if word == "next":  # the first one after this month
        return [Span.month(today.year + (month <= today.month), month)]
    if word == "last":  # the latest one before this month
        return [Span.month(today.year - (month >= today.month), month)]
    if word == "this":
        return [Span.month(today.year, month)]
    return _dated(today, month, None, lean)


def spans(text: str, today: date, lean: str | None = None, *, calendar_dates: bool = True
          ) -> Iterator[tuple[int, Span]]:
    """The dates `text` names, read against `today`, each with where it starts in the text.
    `lean`: FUTURE or PAST for a bare weekday or date ("on Friday"), None for both readings.
    `calendar_dates` False: only the relative phrases (the calendar dates are blanked unread)."""
    if not may_name_dates(text):
        return
    for form, pattern in _PATTERNS:
        for match in pattern.finditer(text) if calendar_dates or form not in CALENDAR_FORMS else ():
            try:
                found = _read(form, match.groups(), today, lean)
            except (ValueError, OverflowError, KeyError):  # 2026-02-31, a year past 9999
                continue
            for span in found:
                yield match.start(), span
        text = pattern.sub(lambda m: " " * len(m.group(0)), text)


def without_dates(text: str) -> str:
    """`text` with every date phrase blanked out ("Tomorrow, I fly" -> "        , I fly")."""
    for _, pattern in _PATTERNS:
        text = pattern.sub(lambda m: " " * len(m.group(0)), text)
    return text


def event_date(text: str, said_at: float, tz: tzinfo) -> Span | None:
    """When what a statement (a fact) tells happens, read from its words against the day it was
    said in `tz`: the first date it names, None when it names none."""
    found = sorted(spans(text, local_day(said_at, tz), lean_of(text)), key=lambda item: item[0])
    return found[0][1] if found else None


def question_dates(text: str, now: float, tz: tzinfo, *, calendar_dates: bool = True) -> list[Span]:
    """The dates a question names, relative ones resolved against `now` in `tz`, both readings
    of an ambiguous one ("on Friday": the last and the next). `calendar_dates`: as for `spans`."""
    found = spans(text, local_day(now, tz), calendar_dates=calendar_dates)
    return list(dict.fromkeys(span for _, span in sorted(found, key=lambda item: item[0])))
