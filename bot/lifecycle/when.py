"""When an extracted fact happens: its event date, resolved against the time its message was sent.

"Tomorrow I fly to Rome", sent on 4 March 2026, becomes "Alice flies to Rome." happening on
2026-03-05. The words decide first, deterministically (bot/memory/clocks.py), in the server's
time zone (MUNINN_TIMEZONE): a date the fact's own text names; else a date named in the sentence
of the author's message the fact was taken from (the model often writes "Alice flies to Rome."
and leaves "tomorrow" out); else the date the model gave in its answer's `when`, already checked
(facts.check_fact: a value that is not a date is left out). A fact that names no date has none:
"Alice lives in Oslo" is not an event.
"""
from __future__ import annotations

import re
import time
from datetime import tzinfo
from typing import Sequence

from bot.conversation.exchange import Exchange
from bot.memory import clocks
from bot.memory.writing import rules

SOURCE_SUPPORT = 0.5   # share of the fact's content words its source clause must hold
_SENTENCE = re.compile(r"(?<=[.!?;])\s+|\n+")
# Clauses of a sentence: "I live in Oslo and fly to Rome tomorrow" tells two facts, one dated.
_CLAUSE = re.compile(r",\s*|\s+(?:and|but|while|then|so)\s+", re.IGNORECASE)


def sent_on(exchange: Exchange, tz: tzinfo) -> str:
    """When a message was sent, as the extraction prompt shows it: "Wed 2026-03-04" ("" when unknown)."""
    if exchange.created_at is None:
        return ""
    try:
        day = clocks.local_day(exchange.created_at, tz)
    except (ValueError, OverflowError, OSError):
        return ""
    return f"{day:%a} {day.isoformat()}"


def said_at(own: Sequence[Exchange]) -> float:
    """When the author's messages were sent: the latest known time, else now."""
    return max((e.created_at for e in own if e.created_at is not None), default=time.time())


def from_source(fact_text: str, own: Sequence[Exchange], tz: tzinfo, names: Sequence[str] = ()) -> str | None:
    """The date named in the clause of the author's messages that the fact was taken from: the
    clause holding most of the fact's content words (its subject's name left out); a clause
    that is only a date ("Tomorrow, I fly to Rome") dates the clause after it."""
    name_words: set[str] = set()
    for name in names:
        name_words |= rules.content_words(name)
    wanted = rules.content_words(fact_text) - name_words
    if not wanted:
        return None
    for exchange in reversed(own):
        sent = exchange.created_at or said_at(own)
        for sentence in _SENTENCE.split(exchange.user_message or ""):
            carried: clocks.Span | None = None
            for clause in _CLAUSE.split(sentence):
                found = clocks.event_date(clause, sent, tz)
                if found is not None and not rules.content_words(clocks.without_dates(clause)):
                    carried = found
                    continue
                found, carried = found or carried, None
                if found is not None and len(wanted & rules.content_words(clause)) / len(wanted) >= SOURCE_SUPPORT:
                    return found.iso()
    return None


def happens_on(fact_text: str, model_when: str | None, own: Sequence[Exchange], tz: tzinfo,
               names: Sequence[str] = ()) -> str | None:
    """The fact's event date as stored (ISO date or interval), or None (see the module doc)."""
    try:
        named = clocks.event_date(fact_text, said_at(own), tz)
        if named is not None:
            return named.iso()
        return from_source(fact_text, own, tz, names) or model_when
    except (ValueError, OverflowError, OSError):  # a damaged message time: the fact keeps no date
        return model_when
