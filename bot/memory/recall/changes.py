"""A question about a value as it stands, and a newer memory saying that value changed (for newer.py).

People tell a value once ("my Zotero library has 45 sources") and later say it changed, in
other words ("I've added 52 sources to my Zotero library", "the call is rescheduled to April
22"): the two rarely share enough words to look like the same sentence with a value changed
(newer.disagree). When the question asks for a value as it stands now ("How many sources are
in my Zotero library?", "When is my call scheduled?"), the newer of two recalled memories
goes first when, in one of its sentences, it says that what the question asks about changed
to a value ("increased to 7", "now reached 165", "rescheduled to March 22"), and the older has
a sentence about the same thing holding a value. "About the same thing": at least ASKED_SHARED
of the question's own words in each of the two sentences.

Not for a question about a time or a span ("What did I say...", "How many days between..."):
there the older memory may be the one asked for. English wording only, like the date reading
(dates.py) and the tense test (bot/memory/clocks.py).
"""
from __future__ import annotations

import re

from bot.memory.writing.rules import all_words, value_tokens

ASKED_SHARED = 2
_SENTENCE = re.compile(r"(?<=[.!?;])\s+|\n+")
# Words that ask rather than say what about ("what specific ...", "can you tell me ...")
_ASKING = frozenset(all_words(
    "specific specifically tell share could would can describe detail details kind type mention mentioned "
    "say said ask asked give gave provide explain discuss discussed exactly particular many much"))
_VALUE_QUESTION = re.compile(r"^\s*(how (many|much)|what|when|which)\b", re.I)
# a time or a span the question is about: what was said then, or between two moments, may be the answer
_NOT_AS_IT_STANDS = re.compile(r"\b(did|was|were|had|ever|before|initially|originally|previously|used to|"
                               r"between|since|until)\b", re.I)
_MONTHS = "january|february|march|april|may|june|july|august|september|october|november|december"
_DAYS = "monday|tuesday|wednesday|thursday|friday|saturday|sunday"
# a change said with its new value, a few words apart at most
_CHANGED_TO = re.compile(r"\b(now|new|increased|decreased|improved|reached|raised|lowered|dropped|extended|adjusted|"
                         r"moved|moving|rescheduled|changed|updated|grown|grew|boosted|added|total of)\b"
                         rf"(\W+\w+){{0,6}}?\W+(to\W+)?(\$?\d|{_MONTHS}|{_DAYS})", re.I)


def asked_words(question: str) -> frozenset[str] | None:
    """The question's own words when it asks for a value as it stands; None for any other question."""
    if not _VALUE_QUESTION.search(question) or _NOT_AS_IT_STANDS.search(question):
        return None
    asked = frozenset(all_words(question) - _ASKING)
    return asked if len(asked) >= ASKED_SHARED else None


def _sentences(text: str) -> list[str]:
    return [s for s in _SENTENCE.split(text) if s]


def says_changed(newer: str, asked: frozenset[str]) -> bool:
    """Whether a sentence of `newer` says that what the question asks about changed to a value."""
    if not _CHANGED_TO.search(newer):  # most memories say no change at all: no sentence to read
        return False
    return any(_CHANGED_TO.search(s) and len(all_words(s) & asked) >= ASKED_SHARED for s in _sentences(newer))


def holds_value(older: str, asked: frozenset[str]) -> bool:
    """Whether a sentence of `older` is about what the question asks and holds a value (a number or name)."""
    return any(len(all_words(s) & asked) >= ASKED_SHARED and value_tokens(s) for s in _sentences(older))


def changed(older: str, newer: str, asked: frozenset[str]) -> bool:
    """Whether `newer` says that the value `older` holds, of what the question asks, changed."""
    return says_changed(newer, asked) and holds_value(older, asked)
