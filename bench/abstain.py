"""Can recall tell a question without evidence from one with? Signals measured, thresholds cross-validated.

    .venv/bin/python -m bench.abstain                 # ask both data sets, then analyse
    .venv/bin/python -m bench.abstain --rows FILE     # analyse rows saved by an earlier run

The LoCoMo dev split and BEAM's development chats are imported and asked as bench.quality
asks them (hybrid, the day after, touch on for questions with evidence), plus the questions
without evidence: BEAM's abstention questions (their subject was discussed, the detail asked
for never was) and each conversation asked 20 of the other data set's questions ("foreign":
never discussed). For every question the recalled memories are kept with their texts,
cosines and keyword scores. Then each candidate signal is computed per question from what
recall returned (and, for the word signals, the conversation's word counts, as the keyword
index holds them):

- `best_cosine`, `top3_cosine`: the relevance floor's signal and its mean-of-three variant;
- `gap`: the best cosine minus the fifth's (a question with an answer has one that stands out);
- `cover_best`: the share of the question's rare-word mass (IDF-weighted content words) held
  by the single recalled memory holding most of it; `cover_union`: by all the recalled ones;
- `unseen`: the share of that mass in words the conversation never used (negated: higher is
  more evidence-like, as every signal here);
- `target`: whether the question asks for a number, a date, a name or a place ("how many",
  "when", "who", "where") and a recalled memory holds one (1), the question asks something
  else (0.5), or none does (0);
- `keyword_best`: the best keyword score (BM25, higher better) among the recalled.

For each signal: the AUC against questions with evidence, separately for abstention and
foreign questions (0.5: no signal); then a floor chosen by leaving one conversation out over
both data sets (13 folds): on the other twelve, the highest floor whose R@10 cost on questions
with evidence is at most the budget (0.01) on each data set; scored on the one left out (the
share of its questions without evidence emptied, its R@10 lost). Per-question rows go to
bench/results/abstain-rows.json; they hold the data sets' texts: never commit them.

The same rows answer the knowledge-update question: for BEAM's knowledge-update questions,
which of the original and the updated turn recall ranked first, and how candidate orderings
applied on top of recall's own (newer first when the question asks for a value as it stands
and the two share its words, when they were said days apart, when the newer has a change
word, and the product's relation, bot/memory/recall/changes.py) move updates and non-updates
(bench.update_relation's bookkeeping: the newer moved just above the older). With the
product's relation on (MUNINN_CHANGED_VALUE_FIRST), its row moves nothing: recall did it.
"""
from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import re
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np

from bot.memory.engine import Engine
from bot.memory.recall import changes
from bot.memory.recall.words import STOP_WORDS
from bot.memory.scope import Viewer
from bot.memory.writing.rules import _stem, value_tokens

from . import beam, quality, update_relation
from .embed_server import EmbedServerProcess

WORD = re.compile(r"\w+")
# Words of a question that ask, not say what about: never evidence of a subject
ASKING = frozenset(_stem(w) for w in """
specific specifically tell share could would can describe detail details kind type mention mentioned say said
ask asked give gave provide explain discuss discussed exactly particular""".split())
BUDGET = 0.01
INJECT = 5  # the bot's recall limit: what a prompt would get
TARGET = re.compile(r"^\s*(how (many|much|long|often|old)|when|what (time|date|day|year|month)|who|whom|whose|where|"
                    r"which (city|country|place|person|day|date))\b", re.I)


def words(text: str) -> set[str]:
    """Every stemmed word of a text but stop words (no cap: coverage counts them all)."""
    return {_stem(w) for w in WORD.findall(text.lower()) if w not in STOP_WORDS}


class Counts:
    """Each conversation's document frequencies over its turns (a turn = one document)."""

    def __init__(self, corpus: quality.Corpus):
        self.df: dict[str, Counter] = {}
        self.n: dict[str, int] = {}
        for sid, records in corpus.records.items():
            texts: dict[str, str] = {}
            for r in records:
                turn = beam.turn_of(r["external_id"])
                texts[turn] = texts.get(turn, "") + " " + r["text"]
            self.df[sid] = Counter(w for text in texts.values() for w in words(text))
            self.n[sid] = len(texts)

    def idf(self, sid: str, word: str) -> float:
        """BM25's IDF of `word` in conversation `sid` (an unseen word the highest)."""
        n, df = self.n[sid], self.df[sid].get(word, 0)
        return math.log(1.0 + (n - df + 0.5) / (df + 0.5))


def signals(row: dict, counts: Counts) -> dict[str, float]:
    """The candidate signals of one question (higher = more like a question with evidence)."""
    top = row["recalled"][:INJECT]
    cosines = sorted((c["cosine"] for c in top if c["cosine"] is not None), reverse=True) or [0.0]
    asked = words(row["question"]) - ASKING
    weight = {w: counts.idf(row["conversation"], w) for w in asked}
    mass = sum(weight.values()) or 1.0
    held = [words(c["text"]) for c in top]
    union = set().union(*held) if held else set()
    unseen = sum(v for w, v in weight.items() if counts.df[row["conversation"]].get(w, 0) == 0)
    wants = bool(TARGET.search(row["question"]))
    holds = any(value_tokens(c["text"]) for c in top)
    keyword = [-c["fts_score"] for c in top if c["fts_score"] is not None]
    return {"best_cosine": cosines[0], "top3_cosine": float(np.mean(cosines[:3])),
            "gap": cosines[0] - cosines[min(len(cosines), INJECT) - 1],
            "cover_best": max((sum(weight[w] for w in asked & h) for h in held), default=0.0) / mass,
            "cover_union": sum(weight[w] for w in asked & union) / mass,
            "unseen": -unseen / mass,
            "target": (1.0 if holds else 0.0) if wants else 0.5,
            "keyword_best": max(keyword, default=0.0)}


def auc(positive: list[float], negative: list[float]) -> float:
    """The chance a positive (with evidence) scores above a negative (ties half)."""
    if not positive or not negative:
        return float("nan")
    pos, neg = np.asarray(positive), np.asarray(negative)
    return float(((pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum())
                 / (len(pos) * len(neg)))


def floor_cv(rows: list[dict], name: str, budget: float = BUDGET) -> dict:
    """Leave one conversation out over both data sets: on the other conversations, the highest
    floor on `name` whose R@10 cost on questions with evidence is <= `budget` on each data set
    (a question under the floor gets nothing, so loses its R@10); scored on the one left out."""
    conversations = sorted({r["conversation"] for r in rows})
    folds = {}
    emptied: Counter = Counter()
    seen: Counter = Counter()
    lost = {ds: 0.0 for ds in ("locomo", "beam")}
    asked_n = {ds: 0 for ds in ("locomo", "beam")}
    for held in conversations:
        train = [r for r in rows if r["conversation"] != held]
        floor = choose_floor(train, name, budget)
        test = [r for r in rows if r["conversation"] == held]
        for r in test:
            under = r["signals"][name] < floor
            if r["evidence"]:
                if r["category"] != 5:
                    lost[r["dataset"]] += r["r10"] if under else 0.0
                    asked_n[r["dataset"]] += 1
            else:
                kind = f"{r['dataset']}:{r['category']}"
                emptied[kind] += under
                seen[kind] += 1
        folds[held] = round(floor, 4)
    return {"floors": folds, "none_injected": {k: round(emptied[k] / seen[k], 4) for k in sorted(seen)},
            "r10_lost": {ds: round(lost[ds] / asked_n[ds], 4) for ds in lost if asked_n[ds]}}


def choose_floor(rows: list[dict], name: str, budget: float) -> float:
    """The highest floor on signal `name` costing at most `budget` R@10 on each data set's questions with evidence."""
    asked = [r for r in rows if r["evidence"] and r["category"] != 5]
    by_set: dict[str, list[dict]] = {}
    for r in asked:
        by_set.setdefault(r["dataset"], []).append(r)
    values = sorted({r["signals"][name] for r in rows})
    best = -math.inf
    for value in values:  # a floor just above `value`: every question at or under it is emptied
        floor = np.nextafter(value, math.inf)
        if all(sum(r["r10"] for r in group if r["signals"][name] < floor) / len(group) <= budget
               for group in by_set.values()):
            best = float(floor)
        else:
            break
    return best


def logistic(x: np.ndarray, y: np.ndarray, steps: int = 2000, rate: float = 0.5, l2: float = 0.01) -> np.ndarray:
    """Weights (bias last) of a logistic regression by gradient descent, on standardised columns."""
    xb = np.hstack([x, np.ones((len(x), 1))])
    w = np.zeros(xb.shape[1])
    balance = np.where(y == 1, 0.5 / max(1, y.sum()), 0.5 / max(1, (1 - y).sum()))  # both classes weigh the same
    for _ in range(steps):
        p = 1.0 / (1.0 + np.exp(-xb @ w))
        w -= rate * (xb.T @ ((p - y) * balance) + l2 * np.r_[w[:-1], 0.0])
    return w


def combine(rows: list[dict], names: list[str]) -> None:
    """Add signal `combined`: each conversation's questions scored by a logistic regression of all
    the other signals (evidence or not) fitted on the other conversations (leave one out)."""
    x = np.asarray([[r["signals"][n] for n in names] for r in rows], dtype=float)
    y = np.asarray([1.0 if r["evidence"] else 0.0 for r in rows])
    keep = np.asarray([r["category"] != 5 for r in rows])
    for held in {r["conversation"] for r in rows}:
        mine = np.asarray([r["conversation"] == held for r in rows])
        train = ~mine & keep
        mean, std = x[train].mean(axis=0), x[train].std(axis=0) + 1e-9
        w = logistic((x[train] - mean) / std, y[train])
        scores = np.hstack([(x[mine] - mean) / std, np.ones((mine.sum(), 1))]) @ w
        for r, value in zip((r for r, m in zip(rows, mine, strict=True) if m), scores, strict=True):
            r["signals"]["combined"] = float(value)


def report_signals(rows: list[dict]) -> dict:
    """AUC per signal and kind of question without evidence, and the cross-validated floor."""
    combine(rows, list(rows[0]["signals"]))
    names = list(rows[0]["signals"])
    asked = [r for r in rows if r["evidence"] and r["category"] != 5]
    out: dict = {}
    kinds = sorted({f"{r['dataset']}:{r['category']}" for r in rows if not r["evidence"]})
    print(f"\n{'signal':<14} " + " ".join(f"{k:>17}" for k in kinds) + "   AUC vs questions with evidence (same data set)")
    for name in names:
        cells = {}
        for kind in kinds:
            ds, cat = kind.split(":")
            pos = [r["signals"][name] for r in asked if r["dataset"] == ds]
            neg = [r["signals"][name] for r in rows if not r["evidence"] and r["dataset"] == ds and r["category"] == cat]
            cells[kind] = round(auc(pos, neg), 3)
        half = {}
        for kind in kinds:  # the floor emptying half of this kind: what it costs questions with evidence
            ds, cat = kind.split(":")
            mine = sorted(r["signals"][name] for r in rows if not r["evidence"] and r["dataset"] == ds
                          and r["category"] == cat)
            floor = np.nextafter(mine[max(0, math.ceil(len(mine) / 2) - 1)], math.inf)
            group = [r for r in asked if r["dataset"] == ds]
            half[kind] = {"evidence_emptied": round(sum(r["signals"][name] < floor for r in group) / len(group), 3),
                          "r10_lost": round(sum(r["r10"] for r in group if r["signals"][name] < floor) / len(group), 3)}
        out[name] = {"auc": cells, "half": half, "cv": floor_cv(rows, name)}
        print(f"{name:<14} " + " ".join(f"{cells[k]:>17}" for k in kinds) + "   to empty half: R@10 lost "
              + " ".join(f"{half[k]['r10_lost']:.3f}" for k in kinds))
    print(f"\nfloor chosen leaving one conversation out (cost <= {BUDGET} R@10 on each data set), held-out results:")
    for name in names:
        cv = out[name]["cv"]
        print(f"{name:<14} emptied {json.dumps(cv['none_injected'])}  R@10 lost {json.dumps(cv['r10_lost'])}"
              f"  floors {sorted(set(cv['floors'].values()))}")
    return out


CHANGE = re.compile(r"\b(now|new|newly|updated?|changed?|moved?|moving|increased?|decreased?|grown|grew|reached|raised|"
                    r"lowered|dropped|instead|no longer|anymore|rescheduled|switched|revised|latest|currently|"
                    r"adjusted|extended|recently|added)\b", re.I)


def update_report(rows: list[dict]) -> dict:
    """Knowledge-update order, and candidate orderings: which pairs of a top 10 each would
    flip (newer above older), on updates and elsewhere, and the MRR they leave (applied on top
    of the order recall gave: with the product's own relation on, that order has it already)."""
    def shares(row: dict, old: dict, new: dict, least: int = 2) -> bool:
        asked = words(row["question"]) - ASKING
        both = asked & words(old["text"]) & words(new["text"])
        return len(both) >= least and bool(value_tokens(old["text"])) and bool(value_tokens(new["text"]))

    def present(row: dict, old: dict, new: dict) -> bool:
        return changes.asked_words(row["question"]) is not None and shares(row, old, new)

    def apart(days: float) -> Callable[[dict, dict, dict], bool]:
        return lambda row, old, new: present(row, old, new) and new["created_at"] - old["created_at"] >= days * 86400

    def cue(row: dict, old: dict, new: dict) -> bool:
        return present(row, old, new) and bool(CHANGE.search(new["text"]))

    def said_changed(row: dict, old: dict, new: dict) -> bool:
        asked = changes.asked_words(row["question"])
        return asked is not None and changes.changed(old["text"], new["text"], asked)

    relations: dict[str, Callable[[dict, dict, dict], bool]] = {
        "shared words >= 2, values both": lambda row, old, new: shares(row, old, new),
        "and the question asks a value as it stands": present,
        **{f"and said >= {d} days apart": apart(d) for d in (1, 7)},
        "and the newer has a change word": cue,
        "the product's: changes.changed": said_changed}
    out = {}
    asked = [r for r in rows if r["evidence"] and r["category"] != 5]
    print("\nrelation (newer just above older in a top 10)   BEAM moves (on updates)  updated first  BEAM MRR"
          "   LoCoMo moves  LoCoMo MRR")
    for name, relation in {"none": lambda *_: False, **relations}.items():
        cells = {}
        for ds in ("beam", "locomo"):
            moves = on_updates = both = above = 0
            before = after = 0.0
            mine = [r for r in asked if r["dataset"] == ds]
            for row in mine:
                top = {c["turn"]: c for c in row["recalled"]}
                order = list(top)[:10]
                pairs = []
                for x, y in itertools.combinations(order, 2):
                    old, new = (x, y) if (top[x]["created_at"], x) < (top[y]["created_at"], y) else (y, x)
                    if relation(row, top[old], top[new]):
                        pairs.append((old, new))
                said_at = {turn: cell["created_at"] for turn, cell in top.items()}
                moved, done = update_relation.move_newer_up(order, pairs, said_at.__getitem__)
                moves += len(done)
                on_updates += len(set(done) & update_relation.updates_of(row))
                evidence = set(row["evidence"])
                before += update_relation.mrr(order, evidence)
                after += update_relation.mrr(moved, evidence)
                first = update_relation.updated_above(moved, row)
                if first is not None:
                    both += 1
                    above += first
            n = max(1, len(mine))
            cells[ds] = {"moves": moves, "on_updates": on_updates, "updated_first": f"{above}/{both}",
                         "mrr": [round(before / n, 4), round(after / n, 4)]}
        out[name] = cells
        b, lo = cells["beam"], cells["locomo"]
        print(f"{name:<46} {b['moves']:>6} ({b['on_updates']:>2}) {b['updated_first']:>14}  "
              f"{b['mrr'][0]:.3f}->{b['mrr'][1]:.3f} {lo['moves']:>12}  {lo['mrr'][0]:.3f}->{lo['mrr'][1]:.3f}")
    return out


async def ask(corpus: quality.Corpus, url: str, env: dict) -> list[dict]:
    """Every question of `corpus` as bench.quality asks it (hybrid, +1d), with what recall returned."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "asked.db"
        await quality.import_all(corpus, path, url, env)
        async with Engine(quality.mode_settings(dict(env, MUNINN_DB_PATH=str(path)), "hybrid", url)) as engine:
            for q in corpus.asks + corpus.absent:
                result = await engine.recall(q["question"], Viewer(q["owner"], dm=True), limit=10,
                                             as_of=quality.as_of_for(q, 1.0), touch=bool(q["evidence"]))
                recalled: dict[str, dict] = {}
                for r in result.memories:
                    c = r.candidate
                    if c.link is not None:
                        continue
                    turn = beam.turn_of(r.memory.external_id or "")
                    if turn in recalled:
                        continue
                    recalled[turn] = {"turn": turn, "text": r.memory.text, "cosine": c.cosine,
                                      "fts_score": c.fts_score, "created_at": r.memory.created_at}
                ranked = list(recalled)
                row = {"dataset": corpus.name, "conversation": q["conversation"], "category": q["category"],
                       "question": q["question"], "evidence": sorted(q["evidence"]), "recalled": list(recalled.values())}
                if q["evidence"]:
                    row |= quality.score(ranked, q["evidence"]) | {k: sorted(q[k]) for k in ("original", "updated") if k in q}
                rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="signals that tell questions without evidence, cross-validated")
    parser.add_argument("--data", default=str(quality.DATA))
    parser.add_argument("--beam", default=None)
    parser.add_argument("--foreign", type=int, default=20)
    parser.add_argument("--rows", default=None, help="analyse the rows saved here instead of asking again")
    parser.add_argument("--out", default=str(quality.RESULTS / "abstain.json"))
    args = parser.parse_args(argv)
    data = json.loads(Path(args.data).read_text())
    locomo, beam_corpus = quality.Corpus(data), quality.Corpus.beam(beam.folder(args.beam))
    locomo.foreign(beam_corpus, args.foreign)
    beam_corpus.foreign(quality.Corpus(data), args.foreign)
    corpora = {"locomo": locomo, "beam": beam_corpus}
    rows_path = Path(args.rows) if args.rows else quality.RESULTS / "abstain-rows.json"
    if args.rows:
        rows = json.loads(rows_path.read_text())
    else:
        env = dict(quality.ENGINE_ENV)
        quality.RESULTS.mkdir(parents=True, exist_ok=True)
        with EmbedServerProcess("minilm", cache=str(quality.EMBED_CACHE)) as url:
            rows = [row for corpus in corpora.values() for row in asyncio.run(ask(corpus, url, env))]
        rows_path.write_text(json.dumps(rows))
    counts = {name: Counts(corpus) for name, corpus in corpora.items()}
    for row in rows:
        row["signals"] = signals(row, counts[row["dataset"]])
    out = {"signals": report_signals(rows), "update": update_report(rows)}
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
