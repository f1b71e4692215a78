"""Can recall see which memory updates which? Candidate update relations, measured on BEAM and LoCoMo.

    .venv/bin/python -m bench.update_relation

BEAM's knowledge-update questions say which message holds the original information and
which the update ("my Zotero library has 45 sources" ... "I've added 52 sources to my Zotero
library"); bench.quality reports how often hybrid recall ranks the update above the original.
Newer-before-older (bot/memory/recall/newer.py) only sees supersede links and the same
sentence with a value changed, which BEAM's free-form messages never are. This asks whether
any relation between two recalled memories would see BEAM's updates without seeing updates
everywhere: LoCoMo dev and BEAM dev are asked as bench.quality asks them (hybrid, the day
after), then each candidate relation is applied to each question's top 10 (an older and a
newer memory of the same owner that the relation pairs: the newer moves just above the
older; nothing leaves the top 10, so R@10 cannot change). For each, printed per data set:
how many moves it makes, how many of them put a real update above its original, the
knowledge-update order reached, and the MRR before and after with the questions it hurt
and helped. A relation worth building fires on updates and rarely elsewhere.

The relations (each over the question's content words, writing.rules.content_words):
- `topic`: the two share at least WORDS of the question's words, at least SHARE of those
  either holds, and their mutual cosine is at least COSINE (the same subject).
- `topic+values`: and each holds a number or name the other lacks (writing.rules.values_conflict).
- `sentence`: the sentences of each that hold most of the question's words share at least
  WORDS of them, and each of those sentences has a number the other lacks (a value changed
  where the question points).
- `sentence-now`: `sentence`, unless either sentence tells something done (clocks.lean_of:
  two things done are both true, as newer.py holds).
- `cue`: `topic`, and the newer says it changes something ("now", "new", "moved to",
  "increased", "no longer", ...).
"""
from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import re
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from bot.memory import clocks
from bot.memory.writing.rules import content_words, values_conflict

from . import beam, quality
from .embed_server import EmbedServerProcess

SENTENCE = re.compile(r"(?<=[.!?;])\s+|\n+")
NUMBER = re.compile(r"\b\d+(?:[.,]\d+)?%?")
CHANGE = re.compile(r"\b(now|new|newly|updated?|changed?|moved?|increased?|decreased?|grown|grew|reached|raised|"
                    r"lowered|dropped|instead|no longer|anymore|rescheduled|switched|revised|latest|currently)\b", re.I)
GRID = {"cosine": (0.4, 0.5, 0.6), "share": (0.5, 0.75), "words": (2, 3)}


class Turns:
    """Every turn's text, content words, place in time and unit vector (the mean of its parts')."""

    def __init__(self, corpus: quality.Corpus, vectors: dict):
        self.text: dict[str, str] = {}
        self.order: dict[str, int] = {}
        parts: dict[str, list[np.ndarray]] = {}
        for sid, records in corpus.records.items():
            ids, matrix = vectors["turns"][sid]
            row = dict(zip(ids, matrix, strict=True))
            for r in records:
                turn = beam.turn_of(r["external_id"])
                self.text[turn] = (self.text.get(turn, "") + " " + r["text"]).strip()
                self.order.setdefault(turn, len(self.order))
                parts.setdefault(turn, []).append(row[r["external_id"]])
        self.vector = {t: (m := np.mean(v, axis=0)) / np.linalg.norm(m) for t, v in parts.items()}
        self.words = {t: frozenset(content_words(text)) for t, text in self.text.items()}

    def focus(self, turn: str, asked: frozenset[str]) -> tuple[str, frozenset[str]]:
        """The sentence of `turn` holding most of the question's words, and those words."""
        best, found = "", frozenset()
        for sentence in SENTENCE.split(self.text[turn]):
            words = frozenset(content_words(sentence)) & asked
            if len(words) > len(found):
                best, found = sentence, words
        return best, found


Relation = Callable[[Turns, frozenset, str, str], bool]


def relations(cosine: float, share: float, words: int) -> dict[str, Relation]:
    """The candidate relations at one setting (older, newer: two turns of one conversation)."""
    def topic(t: Turns, asked: frozenset, old: str, new: str) -> bool:
        a, b = asked & t.words[old], asked & t.words[new]
        both = len(a & b)
        return both >= words and both / max(1, len(a | b)) >= share and float(t.vector[old] @ t.vector[new]) >= cosine

    def with_values(t: Turns, asked: frozenset, old: str, new: str) -> bool:
        return topic(t, asked, old, new) and values_conflict(t.text[old], t.text[new])

    def sentence(t: Turns, asked: frozenset, old: str, new: str) -> bool:
        (said_old, a), (said_new, b) = t.focus(old, asked), t.focus(new, asked)
        both = len(a & b)
        if both < words or both / max(1, len(a | b)) < share:
            return False
        numbers_old, numbers_new = set(NUMBER.findall(said_old)), set(NUMBER.findall(said_new))
        return bool(numbers_old - numbers_new) and bool(numbers_new - numbers_old)

    def sentence_now(t: Turns, asked: frozenset, old: str, new: str) -> bool:
        if not sentence(t, asked, old, new):
            return False
        return not any(clocks.lean_of(t.focus(turn, asked)[0]) == clocks.PAST for turn in (old, new))

    def cue(t: Turns, asked: frozenset, old: str, new: str) -> bool:
        return topic(t, asked, old, new) and bool(CHANGE.search(t.text[new]))
    return {"topic": topic, "topic+values": with_values, "sentence": sentence, "sentence-now": sentence_now, "cue": cue}


def mrr(ranked: list[str], evidence: set[str]) -> float:
    """1 / the rank of the first evidence in the top 10 (0 without)."""
    return next((1.0 / i for i, turn in enumerate(ranked[:10], start=1) if turn in evidence), 0.0)


def move_newer_up(order: list[str], pairs: list[tuple[str, str]], when: Callable[[str], float]
                  ) -> tuple[list[str], list[tuple[str, str]]]:
    """`order` with the newer of each (older, newer) pair moved just above the older, the newest
    last, and the pairs that moved something."""
    moved, done = list(order), []
    for old, new in sorted(pairs, key=lambda pair: when(pair[1])):
        at_old, at_new = moved.index(old), moved.index(new)
        if at_new > at_old:
            moved.insert(at_old, moved.pop(at_new))
            done.append((old, new))
    return moved, done


def updated_above(order: list[str], row: dict) -> bool | None:
    """Whether the question's updated turn ranks above its original in `order` (None: not both there)."""
    first = {kind: min((order.index(t) for t in row.get(kind, []) if t in order), default=None)
             for kind in ("original", "updated")}
    if first["original"] is None or first["updated"] is None:
        return None
    return first["updated"] < first["original"]


def updates_of(row: dict) -> set[tuple[str, str]]:
    """The question's (original, updated) turn pairs."""
    return {(o, u) for o in row.get("original", []) for u in row.get("updated", [])}


def apply(relation: Relation, turns: Turns, rows: list[dict], asks: list[dict]) -> dict:
    """The relation over every question's top 10: moves (on updates and not), order, MRR."""
    moves = on_updates = hurt = helped = both = above = 0
    before = after = 0.0
    asked_rows = [(r, q) for r, q in zip(rows, asks, strict=False) if "injected" not in r and r["category"] != 5]
    for row, q in asked_rows:
        asked = frozenset(content_words(q["question"]))
        top = list(row["ranked"][:10])
        pairs = []
        for x, y in itertools.combinations(top, 2):
            old, new = (x, y) if turns.order[x] < turns.order[y] else (y, x)
            if relation(turns, asked, old, new):
                pairs.append((old, new))
        order, done = move_newer_up(top, pairs, turns.order.__getitem__)
        moves += len(done)
        on_updates += len(set(done) & updates_of(row))
        evidence = set(row["evidence"])
        was, now = mrr(top, evidence), mrr(order, evidence)
        before, after = before + was, after + now
        hurt, helped = hurt + (now < was), helped + (now > was)
        first = updated_above(order, row)
        if first is not None:
            both += 1
            above += first
    n = max(1, len(asked_rows))
    return {"moves": moves, "on_updates": on_updates, "elsewhere": moves - on_updates,
            "updated_first": f"{above}/{both}" if both else "-", "mrr": [round(before / n, 4), round(after / n, 4)],
            "hurt": hurt, "helped": helped}


async def asked(corpora: dict[str, quality.Corpus], url: str, env: dict) -> dict:
    """Each data set's hybrid rows (bench.quality's protocol, the day after) and its turns."""
    out = {}
    for name, corpus in corpora.items():
        with tempfile.TemporaryDirectory() as tmp:
            results = await quality.evaluate_corpus(corpus, url, env, ("hybrid",), 10, {"+1d": 1.0}, keep_rows=True)
            vectors = await quality.embed_corpus(corpus, Path(tmp) / "turns.db", url, env)
        out[name] = (results["+1d"]["hybrid"]["rows"], Turns(corpus, vectors))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="candidate update relations: do they see BEAM's updates only?")
    parser.add_argument("--data", default=str(quality.DATA))
    parser.add_argument("--beam", default=None)
    parser.add_argument("--out", default=str(quality.RESULTS / "update-relation.json"))
    args = parser.parse_args(argv)
    corpora = {"beam": quality.Corpus.beam(beam.folder(args.beam)),
               "locomo": quality.Corpus(json.loads(Path(args.data).read_text()))}
    env = dict(quality.ENGINE_ENV)
    quality.RESULTS.mkdir(parents=True, exist_ok=True)
    with EmbedServerProcess("minilm", cache=str(quality.EMBED_CACHE)) as url:
        found = asyncio.run(asked(corpora, url, env))
    results = []
    print("relation       cosine share words | BEAM: moves (on updates) updated-first MRR before->after hurt/helped"
          " | LoCoMo: moves MRR before->after hurt/helped")
    for cosine, share, words in itertools.product(*GRID.values()):
        for name, relation in relations(cosine, share, words).items():
            cells = {ds: apply(relation, turns, rows, corpora[ds].asks) for ds, (rows, turns) in found.items()}
            results.append({"relation": name, "cosine": cosine, "share": share, "words": words} | cells)
            b, lo = cells["beam"], cells["locomo"]
            print(f"{name:<14} {cosine:>6} {share:>5} {words:>5} | {b['moves']:>5} ({b['on_updates']:>2}) "
                  f"{b['updated_first']:>6} {b['mrr'][0]:.3f}->{b['mrr'][1]:.3f} {b['hurt']:>3}/{b['helped']:<3}"
                  f" | {lo['moves']:>5} {lo['mrr'][0]:.3f}->{lo['mrr'][1]:.3f} {lo['hurt']:>3}/{lo['helped']:<3}")
    Path(args.out).write_text(json.dumps(results, indent=2))
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
