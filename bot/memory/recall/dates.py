"""Dates named in a question ("on 7 July, 2023", "in August", "in May 2023"), to be matched
against when memories were stored: a memory from the named day or month is likely what
the question is about (ranking.final_order lifts it). Only explicit calendar dates are
read; relative ones ("last week") and weekdays are not.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, tzinfo

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


def _month(name: str) -> int:
    return MONTHS.index(name.lower().rstrip(".")) + 1


def hints(text: str) -> list[DateHint]:
    """The calendar dates named in `text`, most specific first."""
    found: list[DateHint] = []
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
    return list(dict.fromkeys(found))
