"""Does a per-question signal tell how much each recall path should count? Cross-validated.

    .venv/bin/python -m bench.path_share                          # ~3 min on a warm embedding cache
    .venv/bin/python -m bench.path_share --shares 0.4,0.6,0.8
    .venv/bin/python -m bench.path_share --rows bench/results/path-share.json   # fit again (seconds)

Score fusion (bot/memory/recall/fusion.py) gives the vector path one share of the fused score
for every question (MUNINN_FUSION_VECTOR_SHARE), muted per question only by the keyword hits'
agreement in meaning. This asks both data sets (bench.quality's protocol: hybrid, the day
after, touch on, questions in order) once per vector share, and notes for every question what
the fusion saw before scoring (signals the product could compute: the agreement, the best
cosine, the spread of the best ten cosines, the keyword hits' own cosine, how many keyword
hits and how peaked their BM25, how many hits both paths share). Then it fits rules "share a
when the signal is under t, else b", leaving one conversation out over both data sets' 13
conversations (each set weighted the same, objective (R@10 + MRR) / 2, as bench.fusion_cv),
and prints, per signal, the held-out score against the fixed share, and the best rule's
per-group R@10 / MRR. Rows (scores and signals only, no texts) go to bench/results/path-share.json.
`--rows a.json,b.json` fits again from saved runs, every rule scored as the mean over them (one
run per backend: `--database-url` asks a PostgreSQL server). A rule found here is checked for
real, every mode and baseline in one run, with `bench.quality --question-share SIGNAL:T:A:B`
(bench/patches.py: the fusion patched for that run only).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
from pathlib import Path
from typing import Any

from bot.memory.recall import fusion
from bot.memory.recall.retrieval import Candidate

from . import beam, quality
from .embed_server import EmbedServerProcess
from .patches import SIGNALS, signals


class Seen:
    """The first fusion of each recall: its signals (fusion.fuse wrapped, its answer unchanged)."""

    def __init__(self) -> None:
        self.rows: list[dict[str, float]] = []
        original = fusion.fuse

        def fuse(fts_hits: list[Candidate], vector_hits: list[Candidate], settings: Any) -> list[Candidate]:
            out = original(fts_hits, vector_hits, settings)
            self.rows.append(signals(out))
            return out
        fusion.fuse = fuse


async def ask_all(corpora: dict[str, quality.Corpus], shares: list[str], url: str, env: dict,
                  seen: Seen, database_url: str | None) -> dict:
    out: dict = {"shares": shares, "data": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for name, corpus in corpora.items():
            template = Path(tmp) / f"{name}.db"
            place = quality.postgres_place(database_url, f"share_{name}")
            await quality.import_all(corpus, template, url, env | place)
            runs = []
            for i, share in enumerate(shares):
                path = Path(tmp) / f"{name}-{i}.db"
                if database_url:
                    place = quality.postgres_place(database_url, f"share_{name}_{i}", f"share_{name}")
                else:
                    quality.copy_database(template, path)
                seen.rows.clear()
                rows = await quality.ask_engine(corpus, path, env | place | {"MUNINN_FUSION_VECTOR_SHARE": share},
                                                "hybrid", url, 1.0, True, 10)
                asked = len(corpus.asks)
                runs.append({"rows": [{"r10": r["r10"], "mrr": r["mrr"]} for r in rows[:asked]],
                             "signals": seen.rows[:asked] if len(seen.rows) == len(rows) else None})
                path.unlink(missing_ok=True)
            out["data"][name] = {"runs": runs, "questions": [
                {"conversation": q["conversation"], "category": q["category"],
                 "words": len(q["question"].split())} for q in corpus.asks]}
    return out


def question_scores(found: dict) -> tuple[list[dict], list[list[float]]]:
    """Every question with evidence (LoCoMo's adversarial apart from the objective) and its score
    under each share; signals from the run at the default share (fixed per question)."""
    shares = found["shares"]
    default = shares.index(fusion_cv_default(shares))
    qs, scores = [], []
    for name, data in found["data"].items():
        for j, q in enumerate(data["questions"]):
            sig = data["runs"][default]["signals"][j] | {"words": float(q["words"])}
            qs.append(q | {"dataset": name, "signals": sig})
            scores.append([(run["rows"][j]["r10"] + run["rows"][j]["mrr"]) / 2 for run in data["runs"]])
    return qs, scores


def fusion_cv_default(shares: list[str]) -> str:
    """The share the settings give by default (the fixed rule every other is measured against)."""
    from bot.settings import SETTINGS
    value = SETTINGS["fusion_vector_share"].default
    return next(s for s in shares if float(s) == float(value))


def objective(qs: list[dict], scores: list[list[float]], pick: list[int], keep) -> float:
    """bench.fusion_cv's objective: mean over data sets of the mean over conversations, each
    question scored under the share `pick` gives it."""
    by: dict[str, list[float]] = {}
    sets: dict[str, str] = {}
    for q, row, p in zip(qs, scores, pick, strict=True):
        if q["category"] == 5 or not keep(q["conversation"]):
            continue
        by.setdefault(q["conversation"], []).append(row[p])
        sets[q["conversation"]] = q["dataset"]
    per_set: dict[str, list[float]] = {}
    for sid, values in by.items():
        per_set.setdefault(sets[sid], []).append(sum(values) / len(values))
    return sum(sum(v) / len(v) for v in per_set.values()) / len(per_set) if per_set else 0.0


Backend = tuple[list[dict], list[list[float]]]  # one run's questions (with signals) and scores per share


def rules(runs: list[Backend], n_shares: int, signal: str, keep) -> list[tuple[float, int, int]]:
    """Every rule (threshold, share index under it, at or over it): thresholds at the training
    questions' deciles of the signal (over every run given)."""
    values = sorted(q["signals"][signal] for qs, _ in runs for q in qs if keep(q["conversation"]))
    cuts = sorted({values[int(len(values) * k / 10)] for k in range(1, 10)})
    return [(t, a, b) for t in cuts for a in range(n_shares) for b in range(n_shares) if a != b]


def apply(qs: list[dict], signal: str | None, rule: tuple[float, int, int]) -> list[int]:
    """The share index each question gets under `rule` (a fixed share when `signal` is None)."""
    t, a, b = rule
    return [b if signal is None or q["signals"][signal] >= t else a for q in qs]


def joint(runs: list[Backend], signal: str | None, rule: tuple[float, int, int], keep) -> float:
    """The objective under `rule`, the mean over the runs (backends) given."""
    return sum(objective(qs, scores, apply(qs, signal, rule), keep) for qs, scores in runs) / len(runs)


def fit(runs: list[Backend], n: int, signal: str | None, keep) -> tuple[float, int, int]:
    """The best rule on the conversations `keep` takes (a fixed share when `signal` is None)."""
    candidates = [(float("inf"), i, i) for i in range(n)] if signal is None else rules(runs, n, signal, keep)
    return max(candidates, key=lambda r: joint(runs, signal, r, keep))


def cross_validate(runs: list[Backend], shares: list[str]) -> dict:
    """Per signal: the rule chosen leaving each conversation out, scored on it (over every run)."""
    qs0 = runs[0][0]
    conversations = list(dict.fromkeys(q["conversation"] for q in qs0))
    dataset = {q["conversation"]: q["dataset"] for q in qs0}
    n = len(shares)
    default = shares.index(fusion_cv_default(shares))
    out: dict = {"default": joint(runs, None, (float("inf"), default, default), lambda s: True)}
    for signal in (None, *SIGNALS, "words"):
        held: dict[str, float] = {}
        chosen = []
        for sid in conversations:
            rule = fit(runs, n, signal, lambda s, sid=sid: s != sid)
            held[sid] = joint(runs, signal, rule, lambda s, sid=sid: s == sid)
            chosen.append(rule)
        # the held-out scores as the objective weighs them: per data set, then the mean of both
        sets: dict[str, list[float]] = {}
        for sid, value in held.items():
            sets.setdefault(dataset[sid], []).append(value)
        whole = fit(runs, n, signal, lambda s: True)
        out[signal or "fixed"] = {
            "held_out": sum(sum(v) / len(v) for v in sets.values()) / len(sets),
            "held_out_by_set": {k: sum(v) / len(v) for k, v in sets.items()},
            "on_all": joint(runs, signal, whole, lambda s: True),
            "rule_on_all": [whole[0], shares[whole[1]], shares[whole[2]]],
            "fold_rules": [[round(r[0], 4), shares[r[1]], shares[r[2]]] for r in chosen]}
    return out


def groups(qs: list[dict], scores_r10_mrr: list[list[tuple[float, float]]], pick: list[int]) -> dict:
    """R@10 / MRR per data set and group under a per-question choice of share."""
    by: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for q, row, p in zip(qs, scores_r10_mrr, pick, strict=True):
        by.setdefault((q["dataset"], str(q["category"])), []).append(row[p])
        if q["category"] != 5:
            by.setdefault((q["dataset"], "overall"), []).append(row[p])
    return {f"{d} {g}": (round(sum(r for r, _ in v) / len(v), 3), round(sum(m for _, m in v) / len(v), 3))
            for (d, g), v in sorted(by.items())}


def report(found: list[dict]) -> dict:
    """Cross-validated rules over every run given (one per backend), and each run's groups per fixed share."""
    shares = found[0]["shares"]
    runs = [question_scores(f) for f in found]
    cv = cross_validate(runs, shares)
    print(f"default share {fusion_cv_default(shares)}: {cv['default']:.4f}")
    print("signal: held out (all, per set) | fitted on all | rule on all | the folds' rules")
    for name, cell in cv.items():
        if name == "default":
            continue
        per = "  ".join(f"{k} {v:.4f}" for k, v in cell["held_out_by_set"].items())
        print(f"{name:<7} {cell['held_out']:.4f} ({per}) | {cell['on_all']:.4f} | {cell['rule_on_all']} | "
              f"{cell['fold_rules'][:4]} ...")
    for f, (qs, _) in zip(found, runs, strict=True):
        print(f"\n{f.get('backend', 'sqlite')}: per group R@10 / MRR by fixed share")
        table = {s: groups(qs, pairs_of(f), [i] * len(qs)) for i, s in enumerate(shares)}
        for group in table[shares[0]]:
            print(f"{group:<40} " + "  ".join(f"{s}: {table[s][group][0]:.3f}/{table[s][group][1]:.3f}" for s in shares))
    return cv


def pairs_of(found: dict) -> list[list[tuple[float, float]]]:
    """(R@10, MRR) of every question under each share, in question_scores' order."""
    return [[(run["rows"][j]["r10"], run["rows"][j]["mrr"]) for run in data["runs"]]
            for data in found["data"].values() for j in range(len(data["questions"]))]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="a per-question vector share, cross-validated")
    parser.add_argument("--data", default=str(quality.DATA))
    parser.add_argument("--beam", default=None)
    parser.add_argument("--shares", default="0.4,0.5,0.6,0.7,0.8")
    parser.add_argument("--database-url", default=None, help="a PostgreSQL server: ask there")
    parser.add_argument("--rows", default=None,
                        help="fit again from saved runs (no asking); several, comma-separated (e.g. SQLite's and "
                             "PostgreSQL's): every rule is scored as the mean over them")
    parser.add_argument("--out", default=str(quality.RESULTS / "path-share.json"))
    args = parser.parse_args(argv)
    if args.rows:
        found = [json.loads(Path(path).read_text()) for path in args.rows.split(",")]
    else:
        corpora = {"locomo": quality.Corpus(json.loads(Path(args.data).read_text())),
                   "beam": quality.Corpus.beam(beam.folder(args.beam))}
        env = dict(quality.ENGINE_ENV)
        seen = Seen()
        with EmbedServerProcess("minilm", cache=str(quality.EMBED_CACHE)) as url:
            found = [asyncio.run(ask_all(corpora, args.shares.split(","), url, env, seen, args.database_url))]
        found[0]["backend"] = "postgresql" if args.database_url else "sqlite"
        quality.RESULTS.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(found[0]))
        print(f"saved {args.out}")
    report(found)


if __name__ == "__main__":
    main()
