"""Where recall loses its evidence: each question's first evidence, step by step through recall.

    .venv/bin/python -m bench.recall_stages
    .venv/bin/python -m bench.recall_stages --set MUNINN_NEIGHBOUR_SHARE=0.25 --set @fusion.RANK_TRUST=1

bench/quality.py says how good the final list is; this says which step of recall
(bot/memory/recall/steps.py) put the evidence where it ended. The LoCoMo dev split and
BEAM's development chats are imported and asked as bench.quality asks them (hybrid, the day
after, touch on), with the steps watched: after the fusion (fusion.fuse), the neighbour loan
(spread_to_neighbours), the time factor (final_order), the keyword lead
(ranking.keyword_winner_first) and newer-before-older (newer.newer_first), the rank of the
first evidence memory is noted (nothing in recall changes: the steps are wrapped, not
replaced). Printed per category: the MRR@10 after each step, and which path found the
evidence (keyword only, vector only, both, neither); where a step lowers a category's MRR,
it is that step that pushes its evidence down. `--set @module.NAME=VALUE` sets a constant of
bot/memory/recall/<module>.py for the run (bench.fusion_cv's grid syntax).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import tempfile
from collections import defaultdict
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

from bot.memory.engine import Engine
from bot.memory.recall import fusion, newer, ranking
from bot.memory.recall.retrieval import Candidate
from bot.memory.scope import Viewer
from bot.memory.sqlite.backend import SQLiteStorage

from . import beam, quality
from .embed_server import EmbedServerProcess

STEPS = ("fuse", "neighbours", "time", "lead", "newer")


class Watch:
    """The steps' outputs for the question being asked: the rank of its first evidence after each."""

    def __init__(self) -> None:
        self.evidence: set[int] = set()
        self.ranks: dict[str, int | None] | None = None
        self.found: str = ""

    def first(self, ranked: list[Candidate]) -> int | None:
        """The rank (0-based) of the first evidence memory in `ranked`."""
        return next((i for i, c in enumerate(ranked) if c.memory_id in self.evidence), None)

    def note(self, step: str, ranked: list[Candidate]) -> None:
        """After `step`: where the evidence is (and, after the fusion, which path found it)."""
        if self.ranks is None:
            return
        self.ranks[step] = self.first(ranked)
        if step == "fuse":
            evidence = [c for c in ranked if c.memory_id in self.evidence]
            keyword = any(c.fts_rank is not None for c in evidence)
            vector = any(c.vector_rank is not None for c in evidence)
            self.found = {(True, True): "both", (True, False): "keyword", (False, True): "vector",
                          (False, False): "neither"}[(keyword, vector)]


def watch_steps(watch: Watch) -> None:
    """Wrap recall's steps so that each reports its output to `watch` (the results are unchanged)."""
    def around(owner: Any, name: str, step: str, method: bool = False) -> None:
        original: Callable[..., list[Candidate]] = getattr(owner, name)
        if method:
            def wrapped_method(self: Any, *args: Any, **kwargs: Any) -> list[Candidate]:
                out = original(self, *args, **kwargs)
                watch.note(step, out)
                return out
            setattr(owner, name, wrapped_method)
            return

        def wrapped(*args: Any, **kwargs: Any) -> list[Candidate]:
            out = original(*args, **kwargs)
            watch.note(step, out)
            return out
        setattr(owner, name, wrapped)
    around(fusion, "fuse", "fuse")
    around(SQLiteStorage, "spread_to_neighbours", "neighbours", method=True)
    around(SQLiteStorage, "final_order", "time", method=True)
    around(ranking, "keyword_winner_first", "lead")
    around(newer, "newer_first", "newer")



async def ask(corpus: quality.Corpus, url: str, env: dict, watch: Watch) -> list[dict]:
    """Import `corpus`, ask its questions with evidence in order; a row per question."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "asked.db"
        await quality.import_all(corpus, path, url, env)
        by_turn: dict[str, set[int]] = defaultdict(set)
        with closing(sqlite3.connect(path)) as conn:  # the bench's own copy: which memory each turn became
            for memory_id, external_id in conn.execute("SELECT id, external_id FROM memories"):
                by_turn[beam.turn_of(external_id or "")].add(memory_id)
        async with Engine(quality.mode_settings(dict(env, MUNINN_DB_PATH=str(path)), "hybrid", url)) as engine:
            for q in corpus.asks:
                watch.evidence = {m for turn in q["evidence"] for m in by_turn.get(turn, ())}
                watch.ranks, watch.found = {}, "neither"
                await engine.recall(q["question"], Viewer(q["owner"], dm=True), limit=10,
                                    as_of=quality.as_of_for(q, 1.0), touch=True)
                rows.append({"category": q["category"], "ranks": watch.ranks, "found": watch.found})
                watch.ranks = None
    return rows


def report(rows: list[dict], groups: dict) -> dict:
    """Per category: MRR@10 after each step, and the paths that found the evidence."""
    def mrr(rank: int | None) -> float:
        return 0.0 if rank is None or rank >= 10 else 1.0 / (rank + 1)
    out = {}
    for cat, name in groups.items():
        mine = [r for r in rows if r["category"] == cat]
        if not mine:
            continue
        out[name] = {"n": len(mine)} | {step: round(sum(mrr(r["ranks"].get(step)) for r in mine) / len(mine), 4)
                                        for step in STEPS} | {
            "found": {path: sum(r["found"] == path for r in mine) for path in ("both", "keyword", "vector", "neither")}}
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="which recall step moves the evidence, per category")
    parser.add_argument("--data", default=str(quality.DATA))
    parser.add_argument("--beam", default=None)
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="a setting (MUNINN_...) or a recall constant (@module.NAME) for this run")
    parser.add_argument("--out", default=str(quality.RESULTS / "recall-stages.json"))
    args = parser.parse_args(argv)
    overrides = quality.set_constants(dict(item.split("=", 1) for item in args.set))
    corpora = {"LoCoMo dev": quality.Corpus(json.loads(Path(args.data).read_text())),
               "BEAM dev": quality.Corpus.beam(beam.folder(args.beam))}
    env = quality.ENGINE_ENV | overrides
    watch = Watch()
    watch_steps(watch)

    async def run(url: str) -> dict:
        return {name: report(await ask(corpus, url, env, watch), corpus.groups) for name, corpus in corpora.items()}

    quality.RESULTS.mkdir(parents=True, exist_ok=True)
    with EmbedServerProcess("minilm", cache=str(quality.EMBED_CACHE)) as url:
        results = asyncio.run(run(url))
    for name, groups in results.items():
        print(f"\n{name}: MRR@10 of the first evidence after each step; the paths that found it")
        print(f"{'category':<26} {'n':>4} " + " ".join(f"{s:>10}" for s in STEPS) + "  both/keyword/vector/neither")
        for group, cell in groups.items():
            found = cell["found"]
            print(f"{group:<26} {cell['n']:>4} " + " ".join(f"{cell[s]:>10.3f}" for s in STEPS)
                  + f"  {found['both']}/{found['keyword']}/{found['vector']}/{found['neither']}")
    Path(args.out).write_text(json.dumps({"settings": args.set, "results": results}, indent=2))
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
