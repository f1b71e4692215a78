"""The PostgreSQL key-index plan's cache share, A/B in one engine (bench/README.md):

    python -m bench.pg_index_plan postgresql://HOST:PORT/DB [--size 1000000] [--share 0.75]
                                  [--order A,B,B,A,A,B,A] [--per-class 200] [--delay-ms 20]
                                  [--settle-s 0] [--plan-only] [--workdir DIR] [--out FILE]

On a loaded database (bench.speed or bench.ann with `--database-url`), with the environment's
MUNINN_VECTOR_* (the cache's budget and form). `--plan-only` prints each key of at least 1,000
vectors: its size, whether it has an index now, and whether the plan counts it as held by the
cache at shares 1, 0.75, 0.5 (the product's) and 0.25 of the budget. Otherwise one engine runs
blocks of class recalls (each class in turn, as bench.ann; vector given and `--delay-ms` late
alternating recall by recall), arm A the product's share, arm B `--share`, switching between
blocks through the product's `engine.upkeep.vector_indexes` (timed: the builds' cost). Each
recall's exact scans (their keys), HNSW walks and the cache's key loads are recorded. The
order should end on A: the database is left with the indexes of the product's plan.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.pg_speed import late_embedding, settings_for
from bench.world import VIEWER_CLASSES, SkewShape, SkewWorld, said_in_busy_channel
from bot.memory import vector_indexes
from bot.memory.engine import Engine
from bot.memory.postgres import ann
from bot.memory.storage import storage_of
from bot.memory.vectors import keys as cache_keys

Event = tuple[str, float, float, Any]


class Trace:
    """The server searches (exact scans, walks) and cache loads, timed, by wrapping the product's methods."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self._lock = threading.Lock()
        walk, search, load = ann.AnnIndexes._walk, ann.AnnIndexes.search, cache_keys.CachedKeys._load
        trace = self

        def timed_walk(self: Any, conn: Any, info: Any, key: str, *rest: Any) -> Any:
            began = time.perf_counter()
            out = walk(self, conn, info, key, *rest)
            trace.add("walk", began, key)
            return out

        def traced_search(self: Any, conn: Any, info: Any, vector: Any, keys: Any, k: int, as_of: Any,
                          exact: Any) -> Any:
            def timed_exact(c: Any, i: Any, v: Any, scanned: Any, *rest: Any) -> Any:
                began = time.perf_counter()
                out = exact(c, i, v, scanned, *rest)
                trace.add("exact", began, list(scanned))
                return out
            return search(self, conn, info, vector, keys, k, as_of, timed_exact)

        def timed_load(self: Any, conn: Any, info: Any, key: str, *, count_first: bool = False) -> Any:
            began = time.perf_counter()
            out = load(self, conn, info, key, count_first=count_first)
            trace.add("load", began, (key, 0 if out is None else int(out.n)))
            return out
        ann.AnnIndexes._walk = timed_walk  # type: ignore[method-assign]
        ann.AnnIndexes.search = traced_search  # type: ignore[method-assign]
        cache_keys.CachedKeys._load = timed_load  # type: ignore[method-assign]

    def add(self, kind: str, began: float, what: Any) -> None:
        """One event, ended now."""
        with self._lock:
            self.events.append((kind, began, time.perf_counter(), what))

    def since(self, index: int, began: float) -> dict[str, list[tuple[Any, float]]]:
        """The events begun after `began` among those from `index` on, by kind: (what, ms)."""
        with self._lock:
            mine = [event for event in self.events[index:] if event[1] >= began - 0.001]
        # "key loads": a record's "load" is the load average
        return {"key loads" if kind == "load" else kind: [(e[3], (e[2] - e[1]) * 1000) for e in mine if e[0] == kind]
                for kind in ("exact", "walk", "load")}


def plan_table(conn: Any) -> list[dict]:
    """Keys of at least 1,000 vectors: size, indexed now, counted as held at each share."""
    storage = storage_of(conn)
    info, cache = storage.index_info(conn), storage.vector_cache
    sizes = [(str(key), int(n)) for key, n in conn.pg.execute(
        "SELECT vis_key, count(*) FROM memory_vectors GROUP BY vis_key HAVING count(*) >= 1000").fetchall()]
    valid = {row.name for row in ann.listed(conn) if row.valid}
    held = {share: vector_indexes.held_by_cache(cache, info.dim, sizes, share) for share in (1.0, 0.75, 0.5, 0.25)}
    return [{"key": key, "n": n, "indexed": ann.index_name(key, info.dim) in valid,
             **{f"held {share}": key in keys for share, keys in held.items()}}
            for key, n in sorted(sizes, key=lambda item: -item[1])]


async def run(url: str, size: int, share: float, order: list[str], per_class: int, delay: float,
              plan_only: bool, settle_s: float = 0.0, workdir: str = "") -> dict:
    """The plan table, then (unless `plan_only`) the blocks of `order`; every recall's record."""
    trace = None if plan_only else Trace()
    shares = {"A": vector_indexes.HELD_SHARE, "B": share}
    world, chatter = SkewWorld(SkewShape(size), seed=99), SkewWorld(SkewShape(size), seed=7_777)
    # the cache's snapshot goes beside the world's path (bench.ann's --world): never opened here
    settings = settings_for(Path(workdir or tempfile.gettempdir()) / f"skew-{size}-world.db", url)
    out: dict = {"shares": shares, "builds": [], "recalls": []}
    async with Engine(settings) as engine:
        await engine.warmed()
        out["plan"] = await engine.read(plan_table)
        if trace is None:
            return out
        try:
            await _blocks(engine, settings, trace, out, world, chatter, order, shares, per_class, delay, settle_s)
        finally:
            vector_indexes.HELD_SHARE = shares["A"]  # the product's again, whichever arm ran last
    return out


async def _blocks(engine: Engine, settings: Any, trace: Trace, out: dict, world: SkewWorld, chatter: SkewWorld,
                  order: list[str], shares: dict[str, float], per_class: int, delay: float, settle_s: float) -> None:
    """The blocks of `order`, each arm's index plan made before its first block; into `out`."""
    info = await engine.write(lambda conn: storage_of(conn).index_info(conn))
    pending: list[list[float]] = []
    late_embedding(engine, pending, delay)
    current = None
    for block, arm in enumerate(order):
        if arm != current:
            vector_indexes.HELD_SHARE = shares[arm]
            began = time.perf_counter()
            made, dropped = await engine.upkeep.vector_indexes(settings.vector_index_min,
                                                               settings.vector_index_build_mb)
            out["builds"].append({"to": arm, "made": made, "dropped": dropped,
                                  "s": time.perf_counter() - began, "load": os.getloadavg()[0]})
            print(f"to {arm} (share {shares[arm]}): made {made}, dropped {dropped} in "
                  f"{out['builds'][-1]['s']:.1f} s", flush=True)
            current = arm
            await asyncio.sleep(settle_s)  # the build's CPU out of the load the block sees
        for kind in VIEWER_CLASSES:
            for i in range(per_class + 10):
                late = i % 2 == 1
                viewer = world.viewer_of(kind)
                text, qvec = world.query()
                await engine.write(said_in_busy_channel, info, chatter)
                index, began = len(trace.events), time.perf_counter()
                if late:
                    pending[:] = [qvec.tolist()]
                    result = await engine.recall(text, viewer)
                else:
                    result = await engine.recall(text, viewer, query_vector=qvec.tolist())
                if i < 10:
                    continue
                took = dict(result.timings_ms)
                out["recalls"].append({"arm": arm, "block": block, "kind": kind, "mode": "late" if late else "given",
                                       "after": took["total"] - (delay if late else 0), "vector": took["vector"],
                                       "fts": took["fts"], "load": os.getloadavg()[0],
                                       **trace.since(index, began)})
        busy = [r for r in out["recalls"] if r["block"] == block and r["kind"] == "busy"]
        if not busy:  # --per-class 0: only the switch
            continue
        print(f"block {block} {arm} (load {os.getloadavg()[0]:.1f}) busy after the vector: " + "; ".join(
            f"{mode} {np.median(v):.1f} / {np.percentile(v, 95):.1f}" for mode in ("given", "late")
            for v in [[r["after"] for r in busy if r["mode"] == mode]]), flush=True)


def main() -> None:
    """Parse the arguments, run, print, and write the records."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("url")
    parser.add_argument("--size", type=int, default=1_000_000)
    parser.add_argument("--share", type=float, default=0.75, help="arm B's share of the cache budget")
    parser.add_argument("--order", default="A,B,B,A,A,B,A")
    parser.add_argument("--per-class", type=int, default=200, help="recalls per class per block (half given, half late)")
    parser.add_argument("--delay-ms", type=float, default=20.0)
    parser.add_argument("--settle-s", type=float, default=0.0, help="a pause after each switch of the indexes")
    parser.add_argument("--plan-only", action="store_true")
    parser.add_argument("--workdir", default=tempfile.gettempdir(), help="where the vector cache keeps its snapshot")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    out = asyncio.run(run(args.url, args.size, args.share, args.order.split(","), args.per_class,
                          args.delay_ms, args.plan_only, args.settle_s, args.workdir))
    print("key, vectors, indexed, held at shares 1 / 0.75 / 0.5 / 0.25")
    for row in out["plan"]:
        print(f"  {row['key']:24s} {row['n']:7d} {int(row['indexed'])} " +
              " ".join(str(int(row[f"held {s}"])) for s in (1.0, 0.75, 0.5, 0.25)))
    for kind in VIEWER_CLASSES:
        for mode in ("given", "late"):
            cells = []
            for arm in ("A", "B"):
                got = [r["after"] for r in out["recalls"] if r["kind"] == kind and r["arm"] == arm and r["mode"] == mode]
                if got:
                    cells.append(f"{arm} {np.median(got):.1f} / {np.percentile(got, 95):.1f} (n {len(got)})")
            if cells:
                print(f"{kind} {mode}: " + "; ".join(cells))
    if args.out:
        Path(args.out).write_text(json.dumps(out))


if __name__ == "__main__":
    main()
