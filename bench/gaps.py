"""Where hybrid recall trails a baseline: per group, per question, which recall step lost the evidence.

    .venv/bin/python -m bench.gaps                       # both data sets, ~1 min on a warm embedding cache
    .venv/bin/python -m bench.gaps --questions           # and every losing question, evidence by evidence
    .venv/bin/python -m bench.gaps --set @retrieval.NEIGHBOUR_REACH=1

Issue 27's goal per group: hybrid at or above the better of plain porter BM25 and plain cosine
at R@10 and at MRR, in every category of both data sets. bench/quality.py says where it is not;
this says why. Both data sets are imported and asked as bench.quality asks them (hybrid, the day
after, touch on, questions in order), with recall's steps watched as bench/recall_stages.py
watches them (fusion, neighbour loan, time factor, keyword lead, newer first: nothing changes),
and the two baselines ranked over the same turns in the same run.

For every group under a baseline, and for each question there:

- R@10: each evidence turn the better baseline has in its top 10 and hybrid has not, put down
  to the step after which none of its memories is in the top 10 any more ("not a candidate":
  neither path found it among its `limit x 3` candidates; "fusion": the fused list already had
  it below 10th);
- MRR: each question whose first evidence is lower than the better baseline's, put down to the
  first step that left it below the baseline's rank.

Also per data set: how many of hybrid's top-10 lists hold two parts of one message (a BEAM
message longer than a memory may be is stored in parts: a list with two parts holds fewer
than 10 messages, while the baselines rank parts and keep their best 10 messages).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import tempfile
from collections import Counter, defaultdict
from contextlib import closing
from pathlib import Path
from typing import Any

from bot.memory.engine import Engine
from bot.memory.recall.retrieval import Candidate
from bot.memory.scope import Viewer

from . import beam, quality, recall_stages
from .embed_server import EmbedServerProcess

STEPS = recall_stages.STEPS


class Places(recall_stages.Watch):
    """Every evidence memory's place after each step, and what each path made of it at the fusion."""

    def __init__(self) -> None:
        super().__init__()
        self.places: dict[str, dict[int, int]] = {}
        self.paths: dict[int, tuple[int | None, int | None, float | None]] = {}

    def note(self, step: str, ranked: list[Candidate]) -> None:
        """After `step`: the place (0-based) of every evidence memory among the candidates."""
        if self.ranks is None:
            return
        self.places[step] = {c.memory_id: i for i, c in enumerate(ranked) if c.memory_id in self.evidence}
        if step == "fuse":
            self.paths = {c.memory_id: (c.fts_rank, c.vector_rank, c.cosine) for c in ranked
                          if c.memory_id in self.evidence}


def memory_ids(path: Path, place: dict[str, str]) -> list[tuple[int, str]]:
    """(id, external id) of every imported memory, read by the bench itself (SQLite file or PostgreSQL)."""
    if place:
        import psycopg
        with psycopg.connect(place["MUNINN_DATABASE_URL"]) as pg:
            return [(int(i), e or "") for i, e in pg.execute("SELECT id, external_id FROM memories")]
    with closing(sqlite3.connect(path)) as conn:
        return [(int(i), e or "") for i, e in conn.execute("SELECT id, external_id FROM memories")]


async def ask_hybrid(corpus: quality.Corpus, url: str, env: dict, watch: Places,
                     database_url: str | None = None) -> list[dict]:
    """Hybrid rows as bench.quality's (scored on messages), with each evidence memory's places per step;
    on the PostgreSQL server of `database_url` when given."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "asked.db"
        place = quality.postgres_place(database_url, f"gaps_{corpus.name}")
        await quality.import_all(corpus, path, url, env | place)
        by_turn: dict[str, set[int]] = defaultdict(set)
        for memory_id, external_id in memory_ids(path, place):  # which memory each turn became
            by_turn[beam.turn_of(external_id)].add(memory_id)
        settings = quality.mode_settings(dict(env, MUNINN_DB_PATH=str(path)) | place, "hybrid", url)
        async with Engine(settings) as engine:
            for q in corpus.asks:
                watch.evidence = {m for turn in q["evidence"] for m in by_turn.get(turn, ())}
                watch.ranks, watch.places, watch.paths = {}, {}, {}
                result = await engine.recall(q["question"], Viewer(q["owner"], dm=True), limit=10,
                                             as_of=quality.as_of_for(q, 1.0), touch=True)
                watch.ranks = None
                chosen = [r.memory.external_id or "" for r in result.memories if r.candidate.link is None]
                ranked = quality.turns(chosen)
                memories = {turn: sorted(by_turn.get(turn, ())) for turn in q["evidence"]}
                rows.append(quality.score(ranked, q["evidence"]) | {
                    "question": q["question"], "category": q["category"], "ranked": ranked,
                    "parts_shared": len(ranked[:10]) < len(chosen[:10]),
                    "evidence": {turn: [{"memory": m, "paths": watch.paths.get(m),
                                         "places": [watch.places.get(step, {}).get(m) for step in STEPS]}
                                        for m in ids] for turn, ids in memories.items()}})
    return rows


def watch_postgres(watch: Places) -> None:
    """PostgreSQL's own neighbour loan and final order, watched as recall_stages watches SQLite's."""
    from bot.memory.postgres.backend import PostgresStorage

    for name, step in (("spread_to_neighbours", "neighbours"), ("final_order", "time")):
        original = getattr(PostgresStorage, name)

        def wrapped(self: Any, *args: Any, _original: Any = original, _step: str = step, **kwargs: Any) -> Any:
            out = _original(self, *args, **kwargs)
            watch.note(_step, out)
            return out
        setattr(PostgresStorage, name, wrapped)


def lost_at(places: list[list[int | None]], cut: int) -> str:
    """The step after which none of a turn's memories is above `cut` any more (its parts' best place)."""
    best = [min((p[i] for p in places if p[i] is not None), default=None) for i in range(len(STEPS))]
    if all(b is None for b in best):
        return "not a candidate"
    for step, place in zip(STEPS, best, strict=True):
        if place is None or place >= cut:
            return "fusion" if step == "fuse" else step
    return "kept"


def diagnose(hybrid: list[dict], bm25: list[dict], cosine: list[dict], groups: dict) -> dict:
    """Per group: hybrid and the baselines, and for a metric under the better baseline, the steps
    that lost the evidence (module doc) with the questions behind them."""
    out: dict = {}
    for cat, name in groups.items():
        mine = [i for i, r in enumerate(hybrid) if r["category"] == cat]
        if not mine:
            continue
        # unrounded: a tie at four decimals must not hide a question's worth of difference
        scores = {mode: {m: sum(rows[i][m] for i in mine) / len(mine) for m in ("r5", "r10", "mrr")}
                  for mode, rows in (("bm25", bm25), ("cosine", cosine), ("hybrid", hybrid))}
        cell: dict = {"n": len(mine), "scores": scores, "causes": {}, "questions": []}
        for metric in ("r10", "mrr"):
            if scores["hybrid"][metric] >= max(scores["bm25"][metric], scores["cosine"][metric]) - 1e-9:
                continue
            causes: Counter = Counter()
            for i in mine:
                h, b, c = hybrid[i], bm25[i], cosine[i]
                better = b if b[metric] >= c[metric] else c
                if metric == "r10":
                    for turn, memories in h["evidence"].items():
                        if turn in better["ranked"][:10] and turn not in h["ranked"][:10]:
                            step = lost_at([m["places"] for m in memories], 10)
                            causes[step if step != "kept" else "the cut"] += 1
                            cell["questions"].append({"metric": metric, "question": h["question"], "turn": turn,
                                                      "lost_at": step, "baseline_place": better["ranked"].index(turn),
                                                      "memories": memories})
                elif h["mrr"] < better["mrr"]:
                    target = round(1 / better["mrr"]) - 1
                    places = [m["places"] for ms in h["evidence"].values() for m in ms]
                    step = lost_at(places, target + 1)
                    causes[step] += 1
                    cell["questions"].append({"metric": metric, "question": h["question"], "lost_at": step,
                                              "baseline_place": target, "hybrid_mrr": h["mrr"],
                                              "evidence": h["evidence"]})
            cell["causes"][metric] = dict(causes)
        out[str(name)] = cell
    return out


async def run(corpora: dict[str, quality.Corpus], url: str, env: dict, watch: Places,
              database_url: str | None = None) -> dict:
    """Each data set's baselines and watched hybrid rows, diagnosed."""
    out = {}
    for name, corpus in corpora.items():
        with tempfile.TemporaryDirectory() as tmp:
            cosine = await quality.ask_cosine(corpus, Path(tmp) / "cosine.db", url, env, 10)
        n = len(corpus.asks)  # the questions with evidence come first
        bm25, cosine = quality.ask_bm25(corpus, 10)[:n], cosine[:n]
        hybrid = await ask_hybrid(corpus, url, env, watch, database_url)
        out[name] = {"groups": diagnose(hybrid, bm25, cosine, corpus.groups),
                     "parts_shared": sum(r["parts_shared"] for r in hybrid), "questions": len(hybrid)}
    return out


def show(results: dict, questions: bool) -> None:
    """The groups' scores beside the baselines, and the causes of every gap."""
    for name, found in results.items():
        print(f"\n{name}: R@10 / MRR (porter BM25, plain cosine, hybrid); hybrid top-10 lists holding two parts "
              f"of one message: {found['parts_shared']} of {found['questions']}")
        for group, cell in found["groups"].items():
            s = cell["scores"]
            print(f"{group:<28} {cell['n']:>4}  " + "  ".join(f"{m} {s[m]['r10']:.3f} / {s[m]['mrr']:.3f}"
                                                            for m in ("bm25", "cosine", "hybrid"))
                  + "".join(f"\n{'':<34}{metric} under: lost at {json.dumps(c)}" for metric, c in cell["causes"].items()))
            if questions:
                for q in cell["questions"]:
                    print(f"{'':<36}{q['metric']} {q['lost_at']:<16} {q['question'][:110]}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="where hybrid trails a baseline, and which recall step lost it")
    parser.add_argument("--data", default=str(quality.DATA))
    parser.add_argument("--beam", default=None)
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="a setting (MUNINN_...) or a recall constant (@module.NAME) for this run")
    parser.add_argument("--questions", action="store_true", help="print every losing question")
    parser.add_argument("--database-url", default=None,
                        help="a PostgreSQL server (postgresql://...): hybrid runs there (the baselines need none)")
    parser.add_argument("--out", default=str(quality.RESULTS / "gaps.json"))
    args = parser.parse_args(argv)
    overrides = quality.set_constants(dict(item.split("=", 1) for item in args.set))
    corpora = {"LoCoMo dev": quality.Corpus(json.loads(Path(args.data).read_text())),
               "BEAM dev": quality.Corpus.beam(beam.folder(args.beam))}
    env: dict[str, Any] = quality.ENGINE_ENV | overrides
    watch = Places()
    recall_stages.watch_steps(watch)
    if args.database_url:
        watch_postgres(watch)
    quality.RESULTS.mkdir(parents=True, exist_ok=True)
    with EmbedServerProcess("minilm", cache=str(quality.EMBED_CACHE)) as url:
        results = asyncio.run(run(corpora, url, env, watch, args.database_url))
    show(results, args.questions)
    Path(args.out).write_text(json.dumps({"settings": args.set, "results": results}, indent=1))
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
