"""Dates named in a question ("on 7 July, 2023", "in August", "in May 2023", and relative to
when it is asked: "yesterday", "last week", "on Friday", "two months ago"), to be matched
against a memory's two clocks: when it was stored (ranking.final_order lifts a memory from the
named day or month) and when what it tells happens (happens.py lifts those too).

Relative dates are read in the server's time zone (MUNINN_TIMEZONE) against the moment of the
question (bot/memory/clocks.py); an ambiguous weekday ("on Friday") names both the last and the
next one.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, tzinfo

from bot.memory import clocks

MONTHS = ("january", "february", "march", "april", "may", "june", "july", "august", "september", "october",
          "november", "december")
_MONTH = "(" + "|".join(MONTHS) + r")\.?"
_DAY = r"(\d{1,2})(?:st|nd|rd|th)?"
_YEAR = r"((?:19|20)\d\d)"
# Longest forms first; each match is blanked out so "7 July, 2023" is not read again as "July".
_PATTERNS = (
    ("dmy", re.compile(rf"\b{_DAY}\s+(?:of\s+)?{_MONTH},?\s+{_YEAR}\b", re.IGNORECASE)),
    ("mdy", re.compile(rf"\b{_MONTH}\s+{_DAY},?\s+{_YEAR}\b", re.IGNORECASE)),
    ("dm", re.compile(rf"\b{_DAY}\s+(?:of\s+)?{_MONTH}\b(?!\s*\d)", re.IGNORECASE)),
    ("md", re.compile(rf"\b{_MONTH}\s+{_DAY}\b(?!\d)", re.IGNORECASE)),
    ("my", re.compile(rf"\b{_MONTH},?\s+{_YEAR}\b", re.IGNORECASE)),
    ("m", re.compile(rf"\b(?:(in|of|since|during|until|by|last|this|next|early|late|mid)\s+)?{_MONTH}\b", re.IGNORECASE)),
)


@dataclass(frozen=True)
class DateHint:
    """A calendar date named in a question: a month, with the day and the year when named."""
    month: int
    day: int | None = None
    year: int | None = None

    def covers(self, ts: float, tz: tzinfo) -> bool:
        """Whether unix time `ts`, read in `tz`, falls on this date (in this month, for a month alone)."""
        moment = datetime.fromtimestamp(ts, tz)
        return (moment.month == self.month and (self.day is None or moment.day == self.day)
                and (self.year is None or moment.year == self.year))

    def overlaps(self, span: clocks.Span) -> bool:
        """Whether any day of `span` (a memory's happens_on) falls on this date."""
        for year in range(span.first.year, span.last.year + 1):
            if self.year is not None and year != self.year:
                continue
            try:
                named = (clocks.Span.day(date(year, self.month, self.day)) if self.day is not None
                         else clocks.Span.month(year, self.month))
            except ValueError:  # 29 February of a common year
                continue
            if named.overlaps(span):
                return True
        return False


@dataclass(frozen=True)
class SpanHint(DateHint):
    """A relative date of a question, resolved to days: "yesterday", "last week", "on Friday"."""
    first: date = date.min
    last: date = date.min

    @classmethod
    def of(cls, span: clocks.Span) -> "SpanHint":
        """The hint for these days."""
        return cls(month=span.first.month, first=span.first, last=span.last)

    @property
    def span(self) -> clocks.Span:
        """The days it names."""
        return clocks.Span(self.first, self.last)

    def covers(self, ts: float, tz: tzinfo) -> bool:
        """Whether unix time `ts`, read in `tz`, falls on one of these days."""
        return self.span.covers(datetime.fromtimestamp(ts, tz).date())

    def overlaps(self, span: clocks.Span) -> bool:
        """Whether `span` (a memory's happens_on) shares a day with these days."""
        return self.span.overlaps(span)


def _month(name: str) -> int:
    return MONTHS.index(name.lower().rstrip(".")) + 1


def hints(text: str, now: float | None = None, tz: tzinfo = UTC) -> list[DateHint]:
    """The calendar dates named in `text`, most specific first, then (when `now` is given) its
    relative dates resolved against `now` in `tz`."""
    if not clocks.may_name_dates(text):
        return []
    found: list[DateHint] = []
    if now is not None:
        try:
            found += [SpanHint.of(span) for span in clocks.question_dates(text, now, tz, calendar_dates=False)]
        except (ValueError, OverflowError, OSError):  # a moment no calendar holds: calendar dates only
            pass
    for form, pattern in _PATTERNS:
        for match in pattern.finditer(text):
            groups = match.groups()
            if form == "dmy":
                hint = DateHint(_month(groups[1]), int(groups[0]), int(groups[2]))
            elif form == "mdy":
                hint = DateHint(_month(groups[0]), int(groups[1]), int(groups[2]))
            elif form == "dm":
                hint = DateHint(_month(groups[1]), int(groups[0]))
            elif form == "md":
                hint = DateHint(_month(groups[0]), int(groups[1]))
            elif form == "my":
                hint = DateHint(_month(groups[0]), year=int(groups[1]))
            else:
                preposition, name = groups
                # "may"/"march" alone are usually verbs: only "in May", "since March"...
                if name.lower() in ("may", "march") and not (preposition and name[0].isupper()):
                    continue
                hint = DateHint(_month(name))
            if hint.day is not None and not 1 <= hint.day <= 31:
                continue
            found.append(hint)
        text = pattern.sub(lambda m: " " * len(m.group(0)), text)
    relative: list[DateHint] = [hint for hint in found if isinstance(hint, SpanHint)]
    return list(dict.fromkeys([hint for hint in found if not isinstance(hint, SpanHint)] + relative))
