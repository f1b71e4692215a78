"""Sign-code shortlists against exact search, interleaved in one engine (issue 12).

    .venv/bin/python -m bench.vector_codes --size 100000                   # on skew-100000-speed.db
    .venv/bin/python -m bench.vector_codes --size 1000000 --label bigkeys  # the 1M world
    .venv/bin/python -m bench.vector_codes --offline                       # recall on MiniLM and random vectors
    .venv/bin/python -m bench.vector_codes --concurrency --size 100000     # 20 in flight, codes off / on

One warmed engine; per query the vector step (`vector_candidates`, k = recall_limit x 3) runs
once per mode, the order rotating query by query, by switching the cache's thresholds between
calls: `exact` (no shortlist), `codes` (vector_codes.py, keys >= --codes-min). (The clusters of
rounds 4-5, big_keys.py, were deleted in round 6: the codes beat them on every measure.) Wall and thread CPU on the reader thread;
recall@10 and recall@k of each mode against `exact`. Before each query the busy channel stores
a new memory (untimed), as in `bench.speed`, so appends and the change log are exercised.
`--offline`: recall@10 / @30 of the code shortlist on real MiniLM embeddings (LoCoMo turns,
bench/results/embeddings-minilm.npz: 400 held-out turns as queries) and on isotropic random
vectors, per rescored share.
"""
from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench import speed
from bench.world import RESULTS, VIEWER_CLASSES, SkewShape, SkewWorld, bench_settings, said_in_busy_channel
from bot.memory.engine import Engine
from bot.memory.scope import visible_keys
from bot.memory.sqlite import vec0 as vectors
from bot.memory.vectors import codes as vector_codes

SHARES = (0.005, 0.01, 0.02, 0.05)


def shortlist_recall(matrix: np.ndarray, queries: np.ndarray, share: float, k: int) -> float:
    """Mean recall@k of the code shortlist (`share` of the rows rescored) against exact."""
    codes = vector_codes.pack(matrix)
    ids = np.arange(len(matrix), dtype=np.int64)
    saved = (vector_codes.RERANK_SHARE, vector_codes.RERANK_MIN, vector_codes.RERANK_PER_K)
    vector_codes.RERANK_SHARE, vector_codes.RERANK_MIN, vector_codes.RERANK_PER_K = share, 1, 1
    try:
        hits = []
        for q in queries:
            exact = set(np.argpartition(-(matrix @ q), k)[:k].tolist())
            got, scores = vector_codes.search(codes, ids, matrix, len(matrix), q, k, None)
            top = got[np.argpartition(-scores, k)[:k]] if len(got) > k else got
            hits.append(len(exact & set(top.tolist())) / k)
        return round(float(np.mean(hits)), 3)
    finally:
        vector_codes.RERANK_SHARE, vector_codes.RERANK_MIN, vector_codes.RERANK_PER_K = saved


MINILM_CACHE = RESULTS / "embeddings-minilm.npz"  # bench.quality's embedding cache (LoCoMo turns)


def unit_rows(matrix: np.ndarray) -> np.ndarray:
    return (matrix / np.linalg.norm(matrix, axis=1, keepdims=True)).astype(np.float32)


def offline() -> dict:
    out: dict[str, Any] = {}
    minilm = unit_rows(np.load(MINILM_CACHE)["vectors"].astype(np.float32))
    order = np.random.default_rng(0).permutation(len(minilm))
    queries, indexed = minilm[order[:400]], minilm[order[400:]]
    out["minilm"] = {"rows": len(indexed), "queries": len(queries),
                     **{f"share {share}": {f"recall@{k}": shortlist_recall(indexed, queries, share, k) for k in (10, 30)}
                        for share in SHARES}}
    print("MiniLM", out["minilm"], flush=True)
    rng = np.random.default_rng(1)
    for rows, dim in ((31_763, 384), (320_000, 768)):
        matrix = unit_rows(rng.standard_normal((rows, dim), dtype=np.float32))
        queries = unit_rows(rng.standard_normal((30, dim), dtype=np.float32))
        out[f"random {rows}x{dim}"] = {f"share {share}": {"recall@10": shortlist_recall(matrix, queries, share, 10)}
                                       for share in SHARES}
        print(f"random {rows}x{dim}", out[f"random {rows}x{dim}"], flush=True)
    return out


def peak_rss_mb() -> float:
    """The process's peak resident memory (VmHWM): a transient copy of a big key shows here."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024, 1)
    return float("nan")


def set_mode(engine: Engine, mode: str, codes_min: int) -> None:
    engine.vector_cache.codes_min = codes_min if mode == "codes" else 0


async def online(args: argparse.Namespace) -> dict:
    path = Path(args.workdir) / f"skew-{args.size}-{args.label}.db"
    shape = SkewShape(args.size)
    world, chatter = SkewWorld(shape, seed=99), SkewWorld(shape, seed=7_777)
    modes = args.modes.split(",")
    out: dict[str, Any] = {"size": args.size, "modes": modes, "codes_min": args.codes_min, "classes": {}}

    def vector_step(conn: Any, engine: Engine, info: vectors.IndexInfo, qvec: list[float], keys: list[str],
                    k: int) -> tuple[list[int], float, float]:
        wall, cpu = time.perf_counter(), time.thread_time()
        found = engine.storage.vector_candidates(conn, info, qvec, keys, k, None)
        return ([c.memory_id for c in found], (time.perf_counter() - wall) * 1000, (time.thread_time() - cpu) * 1000)

    async with Engine(bench_settings(path)) as engine:
        info = await engine.write(vectors.index_info)
        started = time.perf_counter()
        await engine.warmed()
        out["warm_s"] = round(time.perf_counter() - started, 1)
        out["rss_after_warm"] = {**speed.rss_mb(), "peak": peak_rss_mb()}
        out["cache_mb"] = round(engine.vector_cache.nbytes / 1e6, 1)
        print(f"warm {out['warm_s']} s, cache {out['cache_mb']} MB, rss {out['rss_after_warm']}", flush=True)
        k = engine.settings.recall_limit * 3
        for kind in args.classes.split(","):
            wall: dict[str, list[float]] = {m: [] for m in modes}
            cpu: dict[str, list[float]] = {m: [] for m in modes}
            recall10: dict[str, list[float]] = {m: [] for m in modes}
            recallk: dict[str, list[float]] = {m: [] for m in modes}
            for i in range(args.per_class + args.warm):
                viewer = world.viewer_of(kind)
                _, qvec = world.query()
                await engine.write(said_in_busy_channel, info, chatter)
                keys = await engine.read(visible_keys, viewer)
                got: dict[str, list[int]] = {}
                for mode in modes[i % len(modes):] + modes[:i % len(modes)]:
                    set_mode(engine, mode, args.codes_min)
                    got[mode], ms, cpu_ms = await engine.read(vector_step, engine, info, qvec.tolist(), keys, k)
                    if i >= args.warm:
                        wall[mode].append(ms)
                        cpu[mode].append(cpu_ms)
                if i >= args.warm and "exact" in got:
                    for mode in modes:
                        recall10[mode].append(len(set(got[mode][:10]) & set(got["exact"][:10])) / 10)
                        recallk[mode].append(len(set(got[mode]) & set(got["exact"])) / max(1, len(got["exact"])))
            row = {m: {"wall_p50": round(float(np.median(wall[m])), 2), "wall_p95": round(float(np.percentile(wall[m], 95)), 2),
                       "cpu_mean": round(float(np.mean(cpu[m])), 2),
                       "recall@10": round(float(np.mean(recall10[m])), 3) if recall10[m] else None,
                       f"recall@{k}": round(float(np.mean(recallk[m])), 3) if recallk[m] else None} for m in modes}
            out["classes"][kind] = row
            print(f"{kind} (load {os.getloadavg()[0]:.1f}): " + "; ".join(
                f"{m} {r['wall_p50']} / {r['wall_p95']} ms, cpu {r['cpu_mean']}, r@10 {r['recall@10']}, "
                f"r@{k} {r[f'recall@{k}']}" for m, r in row.items()), flush=True)
        out["rss_end"] = {**speed.rss_mb(), "peak": peak_rss_mb()}
        set_mode(engine, "codes", args.codes_min)
    return out


async def concurrency(args: argparse.Namespace) -> dict:
    """`bench.speed`'s 20-concurrent measurement with the code shortlists off and on, alternating
    round by round on one scratch copy of the world (MUNINN_VECTOR_CODES_MIN=0 vs --codes-min)."""
    import shutil
    world = Path(args.workdir) / f"skew-{args.size}-{args.label}.db"
    scratch = Path(args.workdir) / f"scratch-codes-{args.size}.db"
    shutil.copy(world, scratch)
    out: dict[str, Any] = {"size": args.size, "rounds": []}
    try:
        for round_ in range(args.rounds):
            for codes_min in ((0, args.codes_min) if round_ % 2 == 0 else (args.codes_min, 0)):
                os.environ["MUNINN_VECTOR_CODES_MIN"] = str(codes_min)
                got = await speed.measure_concurrency(scratch, SkewShape(args.size), burst=args.burst)
                got["codes_min"], got["load"] = codes_min, os.getloadavg()[0]
                out["rounds"].append(got)
                print(f"codes_min {codes_min} (load {got['load']:.1f}): one at a time p95 "
                      f"{got['x1']['latency_ms']['p95']:.1f} ms, cpu {got['x1']['cpu_ms_per_recall']} ms; 20 in flight p95 "
                      f"{got['x20']['latency_ms']['p95']:.1f} ms, cpu {got['x20']['cpu_ms_per_recall']} ms, "
                      f"{got['x20']['recalls_per_s']}/s; ratio {got['p95_ratio']}x", flush=True)
    finally:
        os.environ.pop("MUNINN_VECTOR_CODES_MIN", None)
        for p in (scratch, Path(f"{scratch}-wal"), Path(f"{scratch}-shm")):
            p.unlink(missing_ok=True)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Sign-code shortlists vs exact (issue 12)")
    parser.add_argument("--offline", action="store_true", help="recall on MiniLM and random vectors only")
    parser.add_argument("--concurrency", action="store_true", help="20 concurrent recalls, codes off / on, alternating")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--burst", type=int, default=200)
    parser.add_argument("--size", type=int, default=100000)
    parser.add_argument("--label", default="speed")
    parser.add_argument("--modes", default="exact,codes")
    parser.add_argument("--classes", default=",".join(VIEWER_CLASSES))
    parser.add_argument("--codes-min", type=int, default=20000)
    parser.add_argument("--per-class", type=int, default=40)
    parser.add_argument("--warm", type=int, default=5)
    parser.add_argument("--workdir", default=str(RESULTS))
    parser.add_argument("--out", default=None, help="JSON file to save")
    args = parser.parse_args(argv)
    world = Path(args.workdir) / f"skew-{args.size}-{args.label}.db"
    if args.offline and not MINILM_CACHE.exists():
        raise SystemExit(f"no MiniLM vectors at {MINILM_CACHE}: run `python -m bench.quality` once (it caches them)")
    if not args.offline and not world.exists():
        raise SystemExit(f"no world at {world}: build it with `python -m bench.speed --sizes {args.size} "
                         f"--label {args.label}` first")
    out = offline() if args.offline else asyncio.run(concurrency(args) if args.concurrency else online(args))
    out["load"] = os.getloadavg()
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))
        print(f"saved {args.out}")


if __name__ == "__main__":
    main()
