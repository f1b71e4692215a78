"""How memories are told apart when they are written: the same fact again, a changed value,
the same subject, the clearest of near-duplicates. Pure functions; the SQL that applies them is
in `facts.py` and `upkeep.py` beside this.

Cosine alone cannot tell "Alice lives in Oslo" from "Alice lives in Bergen" (MiniLM puts
them closer than some true paraphrases), so a cosine duplicate must also pass the value
guard: the two texts may not each carry a number or name the other lacks.
"""
from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from functools import lru_cache
from typing import AbstractSet, Sequence

from bot.memory.recall.words import STOP_WORDS, tokens
from bot.memory.records import Memory, NewMemory

NEAR_JACCARD = 0.7        # two sentences with this share of content words say the same thing
UPDATE_CANDIDATES = 5     # older memories shown to the LLM for one new fact
LINK_NEIGHBOURS = 5       # semantic links made for one memory at most
DUPLICATE_NEIGHBOURS = 5
# One search of a new fact's own key serves the duplicate check, the update candidates and
# the semantic links (and the planning search is reused by the write when no vector changed).
FACT_NEIGHBOURS = max(DUPLICATE_NEIGHBOURS, UPDATE_CANDIDATES, LINK_NEIGHBOURS)

_WORD = re.compile(r"\w+", re.UNICODE)
_NUMBER_WORDS = {w: str(i) for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
    "sixteen seventeen eighteen nineteen twenty".split())}


# -- text comparison (pure) --------------------------------------------------

def normalise(text: str) -> str:
    """Case-, accent- and punctuation-insensitive form for exact-duplicate checks."""
    text = unicodedata.normalize("NFKD", text.casefold())
    text = "".join(ch for ch in text if not unicodedata.combining(ch))
    return " ".join(_WORD.findall(text))


def value_tokens(text: str) -> set[str]:
    """The parts of a fact that carry its value: numbers (digits or words) and names."""
    out: set[str] = set()
    for token in _WORD.findall(text):
        low = token.casefold()
        if low in _NUMBER_WORDS:
            out.add(_NUMBER_WORDS[low])
        elif any(ch.isdigit() for ch in token):
            out.add("".join(ch for ch in token if ch.isdigit()))
        elif token[0].isupper() and low not in STOP_WORDS:
            out.add(_stem(low))   # Friday ~ Fridays
    return out


def values_conflict(a: str, b: str) -> bool:
    """True when each text has a number or name the other lacks: a substitution such as
    Oslo -> Bergen or Friday -> Saturday, never a mere addition (Oslo -> Oslo, Norway)."""
    va, vb = value_tokens(a), value_tokens(b)
    return bool(va - vb) and bool(vb - va)


def _stem(word: str) -> str:
    """Crude English stem, enough to match live/lives/lived/living."""
    for suffix in ("ing", "ed", "s"):
        if len(word) > len(suffix) + 2 and word.endswith(suffix):
            word = word[:-len(suffix)]
            break
    return word[:-1] if len(word) > 3 and word.endswith("e") else word


# Each word's stem, kept: a community's words recur, and recall stems the words of every
# candidate it compares (recall/newer.py, recall/changes.py).
STEMS_KEPT = 1 << 16
_kept_stem = lru_cache(maxsize=STEMS_KEPT)(_stem)


def content_words(text: str) -> set[str]:
    """The stemmed searchable words of a text."""
    return {_kept_stem(word) for word in tokens(text)}


def all_words(text: str) -> set[str]:
    """The stemmed words of a text but stop words, all of them (content_words keeps the first few)."""
    return {_kept_stem(word) for word in _WORD.findall(text.lower()) if word not in STOP_WORDS}


def jaccard(a: AbstractSet[str], b: AbstractSet[str]) -> float:
    """Jaccard similarity of two word sets (1.0 for two empty ones)."""
    return len(a & b) / len(a | b) if a or b else 1.0


def near_text(a: str, b: str, threshold: float = NEAR_JACCARD) -> bool:
    """Same sentence up to wording: equal when normalised, or most content words shared
    without a changed value."""
    if normalise(a) == normalise(b):
        return True
    return jaccard(content_words(a), content_words(b)) >= threshold and not values_conflict(a, b)


@dataclass(frozen=True)
class UpdateDecision:
    """What the LLM said about one new fact, as memory ids."""
    same: tuple[int, ...] = ()
    replaces: tuple[int, ...] = ()


def same_subject(a: Memory | NewMemory, b: Memory | NewMemory) -> bool:
    """Whether two memories are about the same subject: the same owner, the same room, or both global."""
    if a.scope != b.scope:
        return False
    if a.scope == "personal":
        return a.owner_id == b.owner_id
    if a.scope == "room":
        return a.channel_id == b.channel_id
    return True


CLEAR_TEXT_CHARS = 300       # longer originals are not "clear": a summary is preferred


def clearest(memories: Sequence[Memory]) -> Memory:
    """Without an LLM, the original to keep: the most informative text that is still short,
    the newest on a tie (it is the most current)."""
    short = [m for m in memories if len(m.text) <= CLEAR_TEXT_CHARS]
    if not short:
        return min(memories, key=lambda m: (len(m.text), -m.created_at, -m.id))
    return max(short, key=lambda m: (len(m.text), m.created_at, m.id))
