"""CPU per recall, step by step, per viewer class; optionally against another commit, query by query.

    .venv/bin/python -m bench.recall_cpu --size 100000                       # this code's steps
    .venv/bin/python -m bench.recall_cpu --size 100000 --base-commit 2b2651d  # A/B against a commit
    .venv/bin/python -m bench.recall_cpu --size 100000 --base-commit 2b2651d --whole   # whole recalls
    .venv/bin/python -m bench.recall_cpu --size 100000 --base-commit 8a22272 --concurrency  # 1 vs 20 in flight

On a world `bench.speed` built (bench/results/skew-<size>-speed.db). Steps: one recall's steps
called one after the other on one thread (a read connection and the writer, as the engine
uses them), each timed in thread CPU (`time.thread_time`: what the step costs, whatever the
other sessions on the machine do). `--whole`: `Engine.recall` itself (query vector given),
wall time and process CPU per recall (one in flight). With `--base-commit`, the other
commit's `bot` package is copied out of git as `bot_base` (imports renamed) and both run on the
same world, alternating which goes first, query by query: the fair comparison on shared cores
(issue 12). `--concurrency`: bench.speed's concurrency measurement (mixed viewers, one at a
time and 20 in flight, each recall's message recorded first) for each commit in turn, alternating
which goes first and which level, round by round, on a scratch copy of the world (`concurrency_rounds`).
Both touch the same database, so near-ties may rank differently once one engine
touched what the other did not ("same" counts identical results).
"""
from __future__ import annotations

import os

from bench.trees import memory_module

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse
import asyncio
import collections
import importlib
import io
import json
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from bench import speed
from bench.world import EMBED_MODEL, RESULTS, VIEWER_CLASSES, SkewShape, SkewWorld, summary

ROOT = Path(__file__).resolve().parent.parent


def base_package(commit: str) -> str:
    """`bot` at `commit`, importable as `bot_base` (a temporary copy)."""
    where = Path(tempfile.mkdtemp(prefix="muninn-base-"))
    archive = subprocess.run(["git", "archive", commit, "bot"], cwd=ROOT, check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(where, filter="data")
    (where / "bot").rename(where / "bot_base")
    for path in (where / "bot_base").rglob("*.py"):
        text = path.read_text()
        path.write_text(re.sub(r"\b(from|import) bot([. ])", r"\1 bot_base\2", text))
    sys.path.insert(0, str(where))
    return "bot_base"


class Steps:
    """Thread CPU per named step."""

    def __init__(self) -> None:
        self.ms: dict[str, list[float]] = collections.defaultdict(list)

    def __call__(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        started = time.thread_time()
        out = fn(*args, **kwargs)
        self.ms[name].append((time.thread_time() - started) * 1000)
        return out


def recall_steps(pkg: str, engine: Any, reader: Any, writer: Any, text: str, viewer: Any, vector: list[float],
                 steps: Steps) -> list[int]:
    """One recall as Engine.recall runs it (without its thread hand-offs), step by step."""
    mod = {name: memory_module(pkg, name)
           for name in ("dates", "ranking", "subqueries", "retrieval")}
    storage, s = engine.storage, engine.settings
    now, limit = time.time(), s.recall_limit
    keys = steps("visible_keys", storage.visible_keys, reader, viewer)
    hits = steps("fts", storage.fts_candidates, reader, text, keys, limit * 3, None)
    hits = mod["subqueries"].fuse_keyword_lists(
        hits, steps("name_hits", mod["subqueries"].name_hits, reader, text, hits), limit * 3)
    if hasattr(storage, "index_state"):  # as recall.steps.search_step reads it (one round trip on PostgreSQL)
        info, _ = steps("index_state", storage.index_state, reader)
    else:  # a base commit from before index_state
        info = steps("index_info", storage.index_info, reader)
        steps("reindex_pending", storage.reindex_pending, reader)
    found = steps("vector", storage.vector_candidates, reader, info, vector, keys, limit * 3, None)
    fused = steps("fuse", mod["retrieval"].fuse, hits, found, k=s.rrf_k, limit=len(hits) + len(found),
                  weight_fts=s.rrf_weight_fts, weight_vector=s.rrf_weight_vec)
    fused = steps("spread", storage.spread_to_neighbours, reader, fused, keys, s.neighbour_share, None)
    fused = steps("final_order", storage.final_order, reader, fused, now, time_weight=s.time_weight,
                  date_hints=mod["dates"].hints(text), date_boost=s.date_boost, tz=s.timezone)
    fused = mod["ranking"].keyword_winner_first(fused, s.keyword_lead)[:limit]
    chosen = fused + steps("graph", storage.graph_neighbours, reader, fused, keys, s.graph_limit, None)
    steps("similarity", storage.measure_similarity, reader, vector, chosen, info)
    relevant = mod["ranking"].worth_touching(chosen, vector_ran=True,
                                             floor=mod["ranking"].touch_floor(s.embed_model, s.touch_min_cosine))
    ids = [c.memory_id for c in chosen]
    try:
        touches = memory_module(pkg, "touches")
        loaded = steps("touch_and_load", touches.touch_and_load_all, writer, storage, [(relevant, ids, now)],
                       s.stability_growth)[0]
    except ModuleNotFoundError:  # a commit before touches.py
        loaded = steps("touch_and_load", storage.touch_and_load, writer, relevant, ids, growth=s.stability_growth,
                       now=now)
    return [i for i in ids if i in loaded]


def load_average() -> float:
    return round(os.getloadavg()[0], 2)


async def timed_recall(engine: Any, sem: asyncio.Semaphore, latencies: list[float], who: Any, text: str,
                       vector: list[float], message_id: int | None) -> None:
    """One recall when `sem` lets it run (timed), after recording its message if given one."""
    from bot.memory.sql import history
    async with sem:
        if message_id is not None:
            await engine.write(history.record, channel_id=who.channel_id or 0, guild_id=who.guild_id,
                               author_id=who.user_id, author_name="someone", role="user", content=text,
                               message_id=message_id)
        started = time.perf_counter()
        await engine.recall(text, who, query_vector=vector)
        latencies.append((time.perf_counter() - started) * 1000)


async def concurrency_rounds(args: argparse.Namespace, engines: dict[str, tuple[Any, Any, Any, Any]]) -> dict:
    """For each engine in turn (alternating which goes first, round by round): `args.burst`
    recalls of a mix of viewers (bench.speed's: typical, busy, dm_heavy) one at a time and
    `args.level` at a time, touch on, the level order alternating round by round too. Each level
    of a round has queries of its own (the same for every engine: the A/B stays query for query),
    and every run starts with that engine's word counts forgotten (`speed.forget_word_counts`):
    a run after another would otherwise find every count the earlier one made. The queries are
    made before the clock starts (the CPU per recall is the engine's, all threads). Messages (on
    unless --no-messages): each recall first records its message in the history, as the bot does
    (a writer job and a commit per recall, beside the other recalls in flight)."""
    packages = list(engines)
    world = SkewWorld(SkewShape(args.size), seed=321)
    raw: dict[str, dict[int, dict[str, list[float]]]] = {
        pkg: {level: collections.defaultdict(list) for level in (1, args.level)} for pkg in packages}
    message_id = 1 << 40
    for round_ in range(args.rounds):
        levels = (1, args.level) if round_ % 2 == 0 else (args.level, 1)
        queries = {level: [(world.viewer(), *world.query()) for _ in range(args.burst)] for level in levels}
        for pkg in (packages if round_ % 2 == 0 else packages[::-1]):
            engine, _, _, viewer_class = engines[pkg]
            for level in levels:
                work = [(viewer_class(v.user_id, channel_id=v.channel_id, guild_id=v.guild_id, dm=v.dm), text,
                         vector.tolist()) for v, text, vector in queries[level]]
                speed.forget_word_counts(pkg)
                sem = asyncio.Semaphore(level)
                latencies: list[float] = []
                load = load_average()
                wall, cpu = time.perf_counter(), time.process_time()
                await asyncio.gather(*(timed_recall(engine, sem, latencies, *job, message_id + i if args.messages else None)
                                       for i, job in enumerate(work)))
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                message_id += len(work)
                got = raw[pkg][level]
                got["latency_ms"] += latencies
                got["cpu_ms_per_recall"].append(cpu * 1000 / len(work))
                got["cores_used"].append(cpu / wall)
                got["load"].append(load)
                print(f"round {round_} {pkg} x{level}: p50 {np.median(latencies):.1f} p95 "
                      f"{np.percentile(latencies, 95):.1f} ms, CPU {cpu * 1000 / len(work):.2f} ms/recall, "
                      f"cores used {cpu / wall:.2f}, load {load}", flush=True)
    cores = len(os.sched_getaffinity(0))
    out: dict = {"cores": cores, "rounds": args.rounds, "burst": args.burst, "messages": args.messages}
    for pkg in packages:
        row: dict = {}
        for level in (1, args.level):
            got = raw[pkg][level]
            row[f"x{level}"] = {"latency_ms": summary(got["latency_ms"]),
                                "cpu_ms_per_recall": round(float(np.mean(got["cpu_ms_per_recall"])), 2),
                                "cores_used": round(float(np.mean(got["cores_used"])), 2),
                                "load": [min(got["load"]), max(got["load"])]}
        single, many = row["x1"], row[f"x{args.level}"]
        row["p95_ratio"] = round(many["latency_ms"]["p95"] / single["latency_ms"]["p95"], 2)
        # as bench.speed.measure_concurrency: the last of `level` recalls on `cores` cores waits for
        # about level / cores recalls' CPU, however they are scheduled
        row["p95_ratio_floor"] = round(args.level * single["cpu_ms_per_recall"] / cores / single["latency_ms"]["p95"], 2)
        out[pkg] = row
        print(f"{pkg}: one at a time p50 {single['latency_ms']['median']:.1f} / p95 {single['latency_ms']['p95']:.1f} ms "
              f"(CPU {single['cpu_ms_per_recall']} ms); {args.level} in flight p50 {many['latency_ms']['median']:.1f} / "
              f"p95 {many['latency_ms']['p95']:.1f} ms (CPU {many['cpu_ms_per_recall']} ms, cores used "
              f"{many['cores_used']}); ratio {row['p95_ratio']}x, floor {row['p95_ratio_floor']}x", flush=True)
    return out


async def run(args: argparse.Namespace) -> dict:
    packages = ["bot"] + ([base_package(args.base_commit)] if args.base_commit else [])
    path = Path(args.workdir) / f"skew-{args.size}-speed.db"
    if not path.exists():
        raise SystemExit(f"no world at {path}: build it with `python -m bench.speed --sizes {args.size}` first")
    if args.concurrency:  # it writes (touches, messages): on a scratch copy
        scratch = Path(tempfile.mkdtemp(prefix="muninn-conc-")) / path.name
        shutil.copy(path, scratch)
        path = scratch
    world = SkewWorld(SkewShape(args.size), seed=99)
    engines: dict[str, tuple[Any, Any, Any, Any]] = {}
    for pkg in packages:
        settings = importlib.import_module(f"{pkg}.settings").load_settings(
            {"MUNINN_DB_PATH": str(path), "OLLAMA_URL": "", "OLLAMA_EMBED_MODEL": EMBED_MODEL})
        engine = await importlib.import_module(f"{pkg}.memory.engine").Engine(settings).start()
        await engine.warmed()
        engines[pkg] = (engine, engine.storage.open_reader(), engine.storage.open_writer(),
                        importlib.import_module(f"{pkg}.memory.scope").Viewer)
    out: dict = {"size": args.size, "per_class": args.per_class, "base_commit": args.base_commit,
                 "whole": args.whole, "classes": {}}
    if args.concurrency:
        out["concurrency"] = await concurrency_rounds(args, engines)
    for kind in (() if args.concurrency else VIEWER_CLASSES):
        queries = [(world.viewer_of(kind), *world.query()) for _ in range(args.per_class + args.warm)]
        measured: dict[str, Steps] = {pkg: Steps() for pkg in packages}
        same = 0
        for i, (viewer, text, vector) in enumerate(queries):
            results = {}
            for pkg in (packages if i % 2 == 0 else packages[::-1]):
                engine, reader, writer, viewer_class = engines[pkg]
                who = viewer_class(viewer.user_id, channel_id=viewer.channel_id, guild_id=viewer.guild_id, dm=viewer.dm)
                steps = measured[pkg] if i >= args.warm else Steps()
                cpu, thread = time.process_time(), time.thread_time()
                if args.whole:
                    result = await engine.recall(text, who, query_vector=vector.tolist())
                    results[pkg] = result.ids
                    steps.ms["total_wall"].append(result.timings_ms["total"])
                    steps.ms["process_cpu"].append((time.process_time() - cpu) * 1000)
                else:
                    results[pkg] = recall_steps(pkg, engine, reader, writer, text, who, vector.tolist(), steps)
                    steps.ms["total"].append((time.thread_time() - thread) * 1000)
            same += len(set(map(tuple, results.values()))) == 1
        row = {pkg: {name: {"mean": round(float(np.mean(v)), 3), "p50": round(float(np.median(v)), 3),
                            "p95": round(float(np.percentile(v, 95)), 3)} for name, v in measured[pkg].ms.items()}
               for pkg in packages}
        row["same"] = f"{same}/{len(queries)}"
        out["classes"][kind] = row
        names = sorted(row["bot"], key=lambda n: -row["bot"][n]["mean"])
        print(f"{kind} (same results {row['same']}): " + ", ".join(
            f"{n} " + " -> ".join(f"{row[p][n]['mean']:.2f}" for p in packages[::-1]) for n in names), flush=True)
    for engine, reader, writer, _ in engines.values():
        engine.storage.close(reader)
        engine.storage.close(writer)
        await engine.close()
    if args.concurrency:
        shutil.rmtree(path.parent, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="CPU per recall, step by step (issue 12)")
    parser.add_argument("--size", type=int, default=100000)
    parser.add_argument("--per-class", type=int, default=60)
    parser.add_argument("--warm", type=int, default=10)
    parser.add_argument("--base-commit", default="", help="A/B against this commit's bot package")
    parser.add_argument("--whole", action="store_true", help="time Engine.recall whole (wall, process CPU)")
    parser.add_argument("--concurrency", action="store_true", help="one at a time vs --level in flight, per commit")
    parser.add_argument("--level", type=int, default=20, help="--concurrency: recalls in flight")
    parser.add_argument("--burst", type=int, default=80, help="--concurrency: recalls per level per round")
    parser.add_argument("--rounds", type=int, default=4, help="--concurrency: rounds (each runs every commit)")
    parser.add_argument("--no-messages", dest="messages", action="store_false",
                        help="--concurrency: recall without recording each recall's message in the history first "
                             "(the bot records every message)")
    parser.add_argument("--workdir", default=str(RESULTS))
    parser.add_argument("--out", default=None, help="JSON file to save")
    args = parser.parse_args(argv)
    out = asyncio.run(run(args))
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))
        print(f"saved {args.out}")


if __name__ == "__main__":
    main()
