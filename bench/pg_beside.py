"""PostgreSQL recall with its reads on one connection against beside each other (recall/beside.py),
interleaved recall by recall in one engine: per class, then 20 recalls in flight.

    MUNINN_VECTOR_CACHE_MB=225 .venv/bin/python -m bench.pg_beside --database-url URL/muninn_ann_1000000 \\
        --world W/skew-1000000-LABEL.db --size 1000000 [--modes one,beside,beside100]

A database `bench.ann --world` loaded (its indexes built). Modes: `one` (every read of a recall on
its own connection, as before), `beside` (the change), `besideN` (beside, `hnsw.ef_search` N).
Each recall has its own viewer and query, the modes taking turns, so every mode meets the same
mix of cold and held keys; the busy channel stores a memory before each recall, as in bench.speed.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path

from bench.pg_speed import settings_for
from bench.world import VIEWER_CLASSES, SkewShape, SkewWorld, said_in_busy_channel, summary
from bot.memory.engine import Engine
from bot.memory.postgres import ann
from bot.memory.storage import storage_of

IN_FLIGHT = 20
SHIPPED_EF = ann.EF_SEARCH


def set_mode(engine: Engine, mode: str) -> None:
    """`one`, `beside` or `besideN` (N: hnsw.ef_search)."""
    engine.walk_beside = mode.startswith("beside")
    ann.EF_SEARCH = int(mode[6:]) if mode[6:].isdigit() else SHIPPED_EF


async def measure(args: argparse.Namespace) -> dict:
    """Per mode and class: total, keyword and vector step (median / p95); 20 in flight: recalls/s."""
    modes = args.modes.split(",")
    shape = SkewShape(args.size)
    world, chatter = SkewWorld(shape, seed=99), SkewWorld(shape, seed=7_777)
    steps = {mode: {kind: {"total": [], "fts": [], "vector": []} for kind in VIEWER_CLASSES} for mode in modes}
    flight: dict[str, dict[str, list[float]]] = {mode: {"total": [], "rate": []} for mode in modes}
    async with Engine(settings_for(Path(args.world), args.database_url)) as engine:
        await engine.warmed()
        info = await engine.write(lambda conn: storage_of(conn).index_info(conn))
        for _ in range(10):  # the first recalls open connections and read the word statistics
            text, qvec = world.query()
            await engine.recall(text, world.viewer_of("busy"), query_vector=qvec.tolist())
        for round_ in range(args.rounds):
            print(f"round {round_ + 1}, load {os.getloadavg()[0]:.1f}", flush=True)
            for kind in VIEWER_CLASSES:
                for i in range(args.viewers * len(modes)):
                    viewer = world.viewer_of(kind)
                    text, qvec = world.query()
                    mode = modes[(i + round_) % len(modes)]
                    await engine.write(said_in_busy_channel, info, chatter)
                    set_mode(engine, mode)
                    result = await engine.recall(text, viewer, query_vector=qvec.tolist())
                    for step, values in steps[mode][kind].items():
                        values.append(result.timings_ms[step])
            for mode in modes if round_ % 2 == 0 else modes[::-1]:
                set_mode(engine, mode)
                for _ in range(args.batches):
                    batch = [(world.viewer_of(VIEWER_CLASSES[j % len(VIEWER_CLASSES)]), *world.query())
                             for j in range(IN_FLIGHT)]
                    await engine.write(said_in_busy_channel, info, chatter)
                    started = time.perf_counter()
                    results = await asyncio.gather(*(engine.recall(text, viewer, query_vector=qvec.tolist())
                                                     for viewer, text, qvec in batch))
                    flight[mode]["rate"].append(IN_FLIGHT / (time.perf_counter() - started))
                    flight[mode]["total"] += [result.timings_ms["total"] for result in results]
    report: dict = {}
    for mode in modes:
        report[mode] = {kind: {step: summary(values) for step, values in by_step.items()}
                        for kind, by_step in steps[mode].items()}
        report[mode]["in_flight"] = {"total": summary(flight[mode]["total"]),
                                     "recalls_per_s": sum(flight[mode]["rate"]) / max(1, len(flight[mode]["rate"]))}
        print(f"{mode}: " + "; ".join(
            f"{kind} {report[mode][kind]['total']['median']:.1f} / {report[mode][kind]['total']['p95']:.1f} "
            f"(keyword step p95 {report[mode][kind]['fts']['p95']:.1f}, vector step p95 "
            f"{report[mode][kind]['vector']['p95']:.1f})" for kind in VIEWER_CLASSES)
              + f"; {IN_FLIGHT} in flight {report[mode]['in_flight']['total']['median']:.1f} / "
              f"{report[mode]['in_flight']['total']['p95']:.1f}, {report[mode]['in_flight']['recalls_per_s']:.1f} "
              "recalls/s (median / p95 ms)", flush=True)
    return report


def main() -> None:
    """Parse the arguments, run, save the JSON."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--database-url", required=True, help="the database bench.ann --world loaded")
    parser.add_argument("--world", required=True, metavar="DB", help="the world file it was loaded from")
    parser.add_argument("--size", type=int, default=1_000_000)
    parser.add_argument("--modes", default="one,beside")
    parser.add_argument("--viewers", type=int, default=40, help="recalls per class, mode and round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batches", type=int, default=3, help="batches of 20 in flight per mode and round")
    parser.add_argument("--out", default="bench/results/pg_beside.json")
    args = parser.parse_args()
    shipped = ann.EF_SEARCH
    try:
        report = asyncio.run(measure(args))
    finally:
        ann.EF_SEARCH = shipped
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"args": vars(args), "report": report}, indent=1))
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
