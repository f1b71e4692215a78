"""A second keyword query for the names the first one left out: a name AND any other word.

The keyword path ORs the question's words and leaves out words found in many memories
(fts.selective, a speed rule counted over the whole database). A person's name is such a
word wherever that person talks a lot, yet it is what separates "what did Caroline paint?"
from a busy room's other talk about painting (the benchmark's shared-world protocol), and
in multi-hop questions what the second piece of evidence shares with the
first. So for each name of the question (a capitalised word inside the sentence, not a
month or weekday) that the plain query left out, the keyword hits holding the name form a
second list (in their order), fused into the keyword list by Reciprocal Rank Fusion before
the keyword list meets the vector list (retrieval.fuse): a hit that has the name and the
words climbs over one that has only the words. A name the plain query searched already
counts there; querying it again only pushed the named person's lines over the answer
when the question names the wrong person (it lowered the hybrid MRR of LoCoMo's adversarial
questions, most when every name was queried, less when only the left-out ones were).
"""
from __future__ import annotations

import re

from bot.memory.connection import Connection
from bot.memory.recall import words
from bot.memory.recall.dates import MONTHS
from bot.memory.recall.retrieval import Candidate
from bot.memory.storage import storage_of

# Chosen on LoCoMo dev: the name list's weight against the
# plain keyword list's 1.0, both at RRF k = ENTITY_K.
ENTITY_WEIGHT = 0.5
ENTITY_K = 3.0
MAX_NAMES = 3
_WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_NOT_NAMES = frozenset((*MONTHS, *_WEEKDAYS))
_WORD = re.compile(r"\b([^\W\d_]+)(?:['’]s)?\b")  # any script: Zoë, José, Øyvind, McKenzie


def names(question: str) -> list[str]:
    """Capitalised words after the first word of each sentence, lowercased, without
    possessives, stop words, months and weekdays; at most MAX_NAMES, in order."""
    found: dict[str, None] = {}
    for sentence in re.split(r"[.!?]\s+", question):
        for match in _WORD.finditer(sentence):
            word = match.group(1)
            if not (word[0].isupper() and any(c.islower() for c in word[1:])):
                continue  # a name is capitalised, not all capitals
            if match.start() == len(sentence) - len(sentence.lstrip()):
                continue  # the sentence's first word is capitalised anyway
            word = word.lower()
            if word not in words.STOP_WORDS and word not in _NOT_NAMES:
                found.setdefault(word, None)
    return list(found)[:MAX_NAMES]


def name_hits(conn: Connection, question: str, hits: list[Candidate]) -> list[Candidate]:
    """Of the plain keyword hits (already scoped and dated, each holding a searched word), those
    whose text holds a name of the question that the plain query left out, in their order.
    The texts are read by id, cheaper than an FTS5 `name AND (words)` query over the whole
    index and far cheaper than one limited to the hits' rowids (FTS5 evaluates the
    whole MATCH for each rowid of an IN list), for the same ranking."""
    mentioned = names(question)
    if not hits or not mentioned:
        return []
    # the words the keyword path searched, as it chose them (retrieval.KeywordHits), else asked again
    known = getattr(hits, "searched", None)
    searched = set(known if known is not None else storage_of(conn).searched_words(conn, words.tokens(question)))
    people = {p for p in mentioned if p not in searched}  # only names the plain query left out
    if not people:
        return []
    ids = [h.memory_id for h in hits]
    rows = conn.execute(f"SELECT id, text FROM memories WHERE id IN ({','.join('?' * len(ids))})", ids)
    named = re.compile(r"\b(?:" + "|".join(map(re.escape, sorted(people))) + r")\b", re.IGNORECASE)
    holding = {memory_id for memory_id, text in rows if named.search(str(text))}
    return [Candidate(h.memory_id, fts_rank=rank, fts_score=h.fts_score)
            for rank, h in enumerate((h for h in hits if h.memory_id in holding), start=1)]


def fuse_keyword_lists(plain: list[Candidate], named: list[Candidate], limit: int, *,
                       weight: float = ENTITY_WEIGHT, k: float = ENTITY_K) -> list[Candidate]:
    """One keyword list from the plain query's and the name query's: RRF of the two ranks,
    renumbered 1..n (`fts_rank`); a memory keeps the plain query's BM25 score when it has one
    (keyword_winner_first compares those)."""
    if not named or weight <= 0:
        return plain
    score: dict[int, float] = {}
    best: dict[int, Candidate] = {}
    for hit in plain:
        score[hit.memory_id] = 1.0 / (k + (hit.fts_rank or 0))
        best[hit.memory_id] = hit
    for hit in named:
        score[hit.memory_id] = score.get(hit.memory_id, 0.0) + weight / (k + (hit.fts_rank or 0))
        best.setdefault(hit.memory_id, hit)
    order = sorted(score, key=lambda memory_id: -score[memory_id])[:limit]  # ties: the plain list's order
    return [Candidate(memory_id, fts_rank=rank, fts_score=best[memory_id].fts_score)
            for rank, memory_id in enumerate(order, start=1)]
