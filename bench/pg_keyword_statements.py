"""Every statement PostgreSQL's keyword step sends for one class of viewer, timed as the client
sees it (round trip and parameters included), on a loaded database: which statements a recall's
keyword step costs, how many a recall, and how long each takes.

    .venv/bin/python -m bench.pg_keyword_statements --database-url URL/muninn_ann_1000000 \\
        --size 1000000 [--kind busy] [--recalls 150]

A database `bench.ann --world` loaded. One reader connection, recalls one at a time (the
keyword step of `recall/steps.py`, as a recall runs it), each its own viewer and query of
bench.world's; the first WARMUP fill the word counts' cache as a running bot has it.
"""
from __future__ import annotations

import argparse
import json
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from bench.world import VIEWER_CLASSES, SkewShape, SkewWorld
from bot.memory.postgres.backend import PostgresStorage
from bot.memory.recall import steps

WARMUP = 5


def _quantile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def measure(url: str, shape: SkewShape, recalls: int, kind: str) -> dict[str, Any]:
    """Per statement (its first 70 characters): runs, ms median / p95, ms a recall; the keyword
    step's ms median / p95 and how many statements each recall sent."""
    storage = PostgresStorage(url)
    conn = storage.open_reader()
    world = SkewWorld(shape, seed=99)
    sent: list[tuple[str, float]] = []
    execute = conn.pg.execute

    def timed(query: Any, params: Any = None, **kwargs: Any) -> Any:
        text = query.decode() if isinstance(query, bytes) else str(query)
        started = time.perf_counter()
        try:
            return execute(query, params, **kwargs)
        finally:
            sent.append((" ".join(text[:70].split()), (time.perf_counter() - started) * 1000))

    conn.pg.execute = timed  # type: ignore[method-assign]
    per: dict[str, list[float]] = defaultdict(list)
    totals: list[float] = []
    counts: Counter[int] = Counter()
    try:
        for i in range(WARMUP + recalls):
            viewer = world.viewer_of(kind)
            text, _ = world.query()
            sent.clear()
            started = time.perf_counter()
            steps.keyword_step(conn, storage, text, viewer, 30, None)
            took = (time.perf_counter() - started) * 1000
            if i < WARMUP:
                continue
            totals.append(took)
            counts[len(sent)] += 1
            for name, ms in sent:
                per[name].append(ms)
    finally:
        conn.close()
    return {"kind": kind, "recalls": recalls,
            "keyword_step": {"median": _quantile(totals, 0.5), "p95": _quantile(totals, 0.95)},
            "statements_per_recall": dict(sorted(counts.items())),
            "statements": {name: {"n": len(v), "median": _quantile(v, 0.5), "p95": _quantile(v, 0.95),
                                  "per_recall": sum(v) / len(totals)}
                           for name, v in sorted(per.items(), key=lambda kv: -sum(kv[1]))}}


def main() -> None:
    """Measure, print a table, write the JSON (--out)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--size", type=int, default=1_000_000, help="the world's size (its viewers and words)")
    parser.add_argument("--kind", default="busy", choices=VIEWER_CLASSES)
    parser.add_argument("--recalls", type=int, default=150)
    parser.add_argument("--out", default="bench/results/pg_keyword_statements.json")
    args = parser.parse_args()
    report = measure(args.database_url, SkewShape(args.size), args.recalls, args.kind)
    step = report["keyword_step"]
    print(f"{args.kind} keyword step: {step['median']:.1f} / {step['p95']:.1f} ms (median / p95), "
          f"statements a recall {report['statements_per_recall']}")
    for name, row in report["statements"].items():
        print(f"{row['per_recall']:7.2f} ms a recall  n={row['n']:4d}  {row['median']:6.2f} / {row['p95']:6.2f}  {name}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
