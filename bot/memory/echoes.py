"""Whether a text repeats a person's words: a distinctive run of them, or a rare word they used.

/memory forget-all (bot/memory/sql/forgetting.py) empties every reply of Muninn's, anywhere,
that does: a channel summary for someone else, an answer quoting them. The rules, on the words
of a text (its `\\w+` runs, NFKC-casefolded, in order; "common" words are recall's stop words,
bot/memory/recall/words.py):
- a distinctive run: three consecutive words of theirs of which at least two are not common
  ("game night is", "cat zorblax loves"; not "i think that", "in the morning", "going to be");
- a rare word: a word of theirs that is not common, has at least four characters (or three with
  a digit in it: a PIN's "4711", never "the"), and that nobody else wrote in any message the
  history holds (`seen_elsewhere`): "zorblax", "sertraline", their street's name.
A reply that was only near their words in meaning is not found here; the replies written while
their messages were in the conversation are found by `reply_context` instead.
"""
from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field
from typing import Iterable

from bot.memory.recall.words import STOP_WORDS

_WORD = re.compile(r"\w+", re.UNICODE)
_ASCII_WORD = re.compile(r"\w+", re.ASCII)
RUN = 3               # words in a distinctive run
RUN_UNCOMMON = 2      # of which at least this many are not common
RARE_MIN_CHARS = 4    # a rare word's length at least (RARE_MIN_CHARS - 1 with a digit in it)


def words(text: str) -> list[str]:
    """The words of a text, in order: `\\w+` runs of its NFKC-casefolded form."""
    if text.isascii():  # the same words, sooner: forget-all reads the whole history
        return _ASCII_WORD.findall(text.lower())
    return _WORD.findall(unicodedata.normalize("NFKC", text).casefold())


def _uncommon(word: str) -> bool:
    return word not in STOP_WORDS and word.replace("_", "") != ""


def _may_be_rare(word: str) -> bool:
    shortest = RARE_MIN_CHARS - 1 if any(ch.isdigit() for ch in word) else RARE_MIN_CHARS
    return _uncommon(word) and len(word) >= shortest


def runs(said: list[str]) -> Iterable[tuple[str, ...]]:
    """Every RUN consecutive words of `said`."""
    return (tuple(said[i:i + RUN]) for i in range(len(said) - RUN + 1))


@dataclass
class TheirWords:
    """A person's words, as forget-all looks for them in Muninn's replies (the module says how)."""
    runs: set[tuple[str, ...]] = field(default_factory=set)
    rare: set[str] = field(default_factory=set)   # candidates until `seen_elsewhere` rules some out

    @classmethod
    def of(cls, texts: Iterable[str]) -> TheirWords:
        """Their distinctive runs and rare-word candidates, from everything they said."""
        found = cls()
        for text in texts:
            said = words(text)
            found.runs.update(run for run in runs(said) if sum(map(_uncommon, run)) >= RUN_UNCOMMON)
            found.rare.update(word for word in said if _may_be_rare(word))
        return found

    def __bool__(self) -> bool:
        return bool(self.runs or self.rare)

    def seen_elsewhere(self, text: str) -> None:
        """Someone else wrote `text`: its words are not rare (they are not this person's alone)."""
        if self.rare:
            self.rare.difference_update(words(text))

    def found_in(self, text: str) -> tuple[bool, set[str]]:
        """Whether `text` holds one of their distinctive runs, and which of their rare-word
        candidates it holds (rare or not is known once every other message was seen)."""
        said = words(text)
        return any(run in self.runs for run in runs(said)), self.rare.intersection(said)

    def repeated_in(self, text: str) -> bool:
        """Whether `text` holds a distinctive run of theirs or one of their rare words."""
        run, rare = self.found_in(text)
        return run or bool(rare)
