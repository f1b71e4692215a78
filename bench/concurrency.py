"""Where 20 concurrent recalls' time goes: the second core, the GIL, a second process (issue 12).

    .venv/bin/python -m bench.concurrency                  # 100k world of bench.speed, 3 rounds
    .venv/bin/python -m bench.concurrency --rounds 1 --size 10000
    .venv/bin/python -m bench.concurrency --configs "MUNINN_DB_READERS=1;MUNINN_DB_READERS=3"   # an A/B

`bench.speed`'s concurrency measurement (mixed viewers, the query vector given, the busy channel
storing a new memory before each recall, untimed in the recall's time and reported as the
write's p50 / p95 beside it, a check that recalls in flight do not starve writes; queries and
messages made before the clock starts) in four variants, each in a child process of its own (a
fresh engine, warmed as the bot's is, 20 warm-up recalls, word counts forgotten), interleaved
round by round on one scratch copy of the world:

- `x1`: one recall at a time (the reference of the p95 ratio);
- `x20`: 20 in flight in one process, on every core of the machine (the product as it runs);
- `x20_one_core`: the same, the process pinned to one core (`os.sched_setaffinity`);
- `x20_two_processes`: two processes on the same file, 10 in flight each (two shard processes:
  each child runs with MUNINN_SHARD_COUNT=2 and MUNINN_SHARD_IDS its index, as the product's
  two shard processes would, unless the configuration sets them).

Each line says recalls/s, process CPU per recall, cores used, and the voluntary context switches
per recall (`getrusage`): a Python thread that gives up the GIL for a short C call (each SQLite
step, a numpy product, a hand-off between the event loop and the pools) and finds it taken when
it returns sleeps on a futex; on one core that hardly happens, on two it happens every time.
The floor is bench.speed's: 20 x CPU per recall / cores / single p95.

`--configs`: settings to compare (`;` between configurations, `,` between the settings of one,
e.g. `MUNINN_DB_READERS=1,MUNINN_VECTOR_CODES_MIN=0`; `tree=PATH`: the `bot` package of another
checkout instead of this one's, e.g. one made by `git archive main bot | tar -x -C /tmp/base`, for
an A/B of code). Every variant runs under each, interleaved within each round (the order reversed
every other round), each against its own `x1`. A round ends with each configuration's recalls/s
over the first's, variant by variant, and two processes' recalls/s over one's.
"""
from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # one core per vector product, as in bench.speed

import argparse
import asyncio
import json
import multiprocessing
import resource
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from .world import RESULTS, SkewShape, build, percentile

VARIANTS = {  # name: (processes, recalls in flight in each, pinned to one core)
    "x1": (1, 1, False),
    "x20": (1, 20, False),
    "x20_one_core": (1, 20, True),
    "x20_two_processes": (2, 10, False),
}


def _recalls(scratch: str, shape: SkewShape, index: int, in_flight: int, count: int, one_core: bool,
             ready: Any, go: Any, out: Any, env: dict[str, str] | None = None, processes: int = 1) -> None:
    """A child process: warm, say `ready`, wait for `go` (every child is warm), then `count`
    recalls, `in_flight` at a time; puts what it measured (a dict: latencies, wall, CPU, voluntary
    switches, read jobs, the writes' latencies, which bot package and how many readers).
    `env`: settings of its configuration (bench_settings reads them), and `tree`: the checkout
    whose `bot` package it runs instead of this one's. `processes`: how many children run the
    variant (more than one: each is a shard process, index `index`)."""
    env = dict(env or {})
    tree = env.pop("tree", "")
    if processes > 1:  # what the product runs as one of several shard processes (its readers, say)
        env.setdefault("MUNINN_SHARD_COUNT", str(processes))
        env.setdefault("MUNINN_SHARD_IDS", str(index))
    if tree:  # nothing of bot runs yet in this fresh process: import it again, from `tree`
        for name in [n for n in sys.modules if n.split(".")[0] == "bot" or n in ("bench.world", "bench.speed")]:
            del sys.modules[name]
        sys.path.insert(0, tree)
    os.environ.update(env)
    if one_core:
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # before any thread: they inherit it
    from bot.memory.engine import Engine

    from .speed import before_a_burst
    from .world import SkewShape, SkewWorld, bench_settings, make_world, said_in_busy_channel
    shape = SkewShape(**vars(shape))  # of the class make_world knows (imported again with `tree`)

    async def in_turn(engine: Any, gate: asyncio.Semaphore, info: Any, chatter: Any, totals: list[float],
                      writes: list[float], said: Any, text: str, qvec: list[float], viewer: Any) -> None:
        # bench.speed's recall_in_turn, the busy channel's write timed too (untimed in the recall's)
        async with gate:
            t = time.perf_counter()
            await engine.write(said_in_busy_channel, info, chatter, said)
            writes.append((time.perf_counter() - t) * 1000)
            t = time.perf_counter()
            await engine.recall(text, viewer, query_vector=qvec)
            totals.append((time.perf_counter() - t) * 1000)

    async def run() -> dict[str, Any]:
        chatter = SkewWorld(shape, seed=7_777 + index)
        world = make_world(shape, seed=321 + index)
        async with Engine(bench_settings(Path(scratch))) as engine:
            info, planned = await before_a_burst(engine, world, chatter, count)
            gate = asyncio.Semaphore(in_flight)
            totals: list[float] = []
            writes: list[float] = []
            ready.put(index)
            await asyncio.to_thread(go.wait)
            switches = resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw
            jobs = getattr(engine, "read_jobs", None)  # None: a tree from before the count
            t, cpu = time.perf_counter(), time.process_time()
            await asyncio.gather(*(in_turn(engine, gate, info, chatter, totals, writes, *plan) for plan in planned))
            wall, used = time.perf_counter() - t, time.process_time() - cpu
            return {"totals": totals, "wall": wall, "cpu": used, "pid": os.getpid(), "writes": writes,
                    "switches": resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw - switches,
                    "read_jobs": None if jobs is None else engine.read_jobs - jobs,
                    "bot": str(Path(sys.modules[Engine.__module__].__file__ or "").parents[2]),
                    "readers": getattr(engine._readers, "_max_workers", None)}
    out.put(asyncio.run(run()))


def parse_configs(text: str) -> dict[str, dict[str, str]]:
    """`--configs`: "A=1,B=2;A=3" -> {"A=1,B=2": {...}, "A=3": {...}}; "" -> one configuration, the environment's."""
    configs: dict[str, dict[str, str]] = {}
    for part in (p.strip() for p in text.split(";")):
        pairs = [kv.strip() for kv in part.split(",") if kv.strip()]
        if any("=" not in kv or not kv.startswith(("MUNINN_", "tree=")) for kv in pairs):
            raise SystemExit(f"--configs: {part!r} is not MUNINN_NAME=value[,MUNINN_NAME=value][,tree=PATH]")
        tree = dict(kv.split("=", 1) for kv in pairs).get("tree")
        if tree is not None and not (Path(tree) / "bot" / "__init__.py").exists():
            raise SystemExit(f"--configs: {tree} holds no bot package")
        configs[part] = dict(kv.split("=", 1) for kv in pairs)
    return configs or {"": {}}


def measure(scratch: Path, shape: SkewShape, name: str, recalls: int, env: dict[str, str] | None = None) -> dict:
    """One variant (VARIANTS) on `scratch` under `env`: its children start together once all are warm."""
    processes, in_flight, one_core = VARIANTS[name]
    ctx = multiprocessing.get_context("spawn")  # no engine state or threads inherited
    ready, go, out = ctx.Queue(), ctx.Event(), ctx.Queue()
    children = [ctx.Process(target=_recalls, args=(str(scratch), shape, i, in_flight, recalls // processes,
                                                   one_core, ready, go, out, env, processes))
                for i in range(processes)]
    for child in children:
        child.start()
    for _ in children:
        ready.get(timeout=600)
    go.set()
    results = [out.get(timeout=600) for _ in children]
    for child in children:
        child.join()
    totals = [ms for r in results for ms in r["totals"]]
    wall = max(r["wall"] for r in results)
    used = sum(r["cpu"] for r in results)
    switches = sum(r["switches"] for r in results)
    writes = [ms for r in results for ms in r["writes"]]
    jobs = None if any(r["read_jobs"] is None for r in results) else sum(r["read_jobs"] for r in results)
    return {"p50": round(percentile(totals, 50), 2), "p95": round(percentile(totals, 95), 2), "n": len(totals),
            "recalls_per_s": round(len(totals) / wall, 1), "cpu_ms_per_recall": round(used * 1000 / len(totals), 2),
            "cores_used": round(used / wall, 2), "switches_per_recall": round(switches / len(totals), 1),
            "processes": len({r["pid"] for r in results}), "write_p50": round(percentile(writes, 50), 2),
            "write_p95": round(percentile(writes, 95), 2), "bot": sorted({r["bot"] for r in results}),
            "readers": sorted({r["readers"] for r in results}),
            "read_jobs_per_recall": None if jobs is None else round(jobs / len(totals), 2)}


def report(measured: dict[str, Any], config: str, names: list[str], cores: int) -> None:
    """Print one configuration's variants of one round; adds its floor to `measured`."""
    single, per = measured["x1"]["p95"], measured["x1"]["cpu_ms_per_recall"]
    measured["floor"] = round(20 * per / cores / single, 2)
    print(f" [{config or 'as set'}] x1 p95 {single} ms, CPU {per} ms, switches "
          f"{measured['x1']['switches_per_recall']} a recall, write p95 {measured['x1']['write_p95']} ms; "
          f"floor {measured['floor']}x on {cores} cores", flush=True)
    for name in names[1:]:
        m = measured[name]
        print(f"  {name:>18}: p50 / p95 {m['p50']} / {m['p95']} ms = {m['p95'] / single:.1f}x single "
              f"({m['p95'] / single / measured['floor']:.2f}x the floor); {m['recalls_per_s']} recalls/s, "
              f"CPU {m['cpu_ms_per_recall']} ms, cores {m['cores_used']}, switches {m['switches_per_recall']} and read jobs "
              f"{m['read_jobs_per_recall']} a recall; "
              f"the busy channel's write p50 / p95 {m['write_p50']} / {m['write_p95']} ms", flush=True)


def compare(measured: dict[str, Any], configs: list[str], names: list[str]) -> None:
    """Print, for one round, each configuration's recalls/s over the first's, and two processes over one."""
    first = measured[configs[0]]
    for config in configs[1:]:
        ratios = ", ".join(f"{name} {measured[config][name]['recalls_per_s'] / first[name]['recalls_per_s']:.2f}x"
                           for name in names[1:])
        print(f"  recalls/s [{config}] over [{configs[0]}]: {ratios}", flush=True)
    if "x20" in names and "x20_two_processes" in names:
        two = {config: measured[config]["x20_two_processes"]["recalls_per_s"] / measured[config]["x20"]["recalls_per_s"]
               for config in configs}
        print("  two processes over one: " + ", ".join(f"[{config or 'as set'}] {ratio:.2f}x"
                                                       for config, ratio in two.items()), flush=True)


def _remove(scratch: Path) -> None:
    """The scratch copy, its WAL and the vector snapshot the children wrote beside it."""
    for p in (scratch, Path(f"{scratch}-wal"), Path(f"{scratch}-shm")):
        p.unlink(missing_ok=True)
    shutil.rmtree(f"{scratch}.vectors", ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=100_000)
    parser.add_argument("--label", default="speed", help="the world bench.speed keeps: skew-<size>-<label>.db")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--recalls", type=int, default=600, help="per variant and round (x1: a third)")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="which of " + ", ".join(VARIANTS))
    parser.add_argument("--configs", default="", help="settings to A/B: 'MUNINN_X=1;MUNINN_X=3' (see above)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    configs = parse_configs(args.configs)
    world = RESULTS / f"skew-{args.size}-{args.label}.db"
    if not world.exists():
        print(f"building {world} (bench.speed's world)", flush=True)
        asyncio.run(build(world, SkewShape(args.size)))
    scratch = RESULTS / f"scratch-concurrency-{args.size}.db"
    cores = len(os.sched_getaffinity(0))
    rounds: list[dict] = []
    try:
        _remove(scratch)
        shutil.copy(world, scratch)
        names = ["x1", *(name for name in args.variants.split(",") if name in VARIANTS and name != "x1")]
        runs = [(config, name) for name in names for config in configs]  # a variant's configurations side by side
        for turn in range(args.rounds):
            measured: dict[str, Any] = {"load": round(os.getloadavg()[0], 2)}
            for config, name in (runs if turn % 2 == 0 else runs[::-1]):
                count = args.recalls // 3 if name == "x1" else args.recalls
                measured.setdefault(config, {})[name] = measure(scratch, SkewShape(args.size), name, count,
                                                                configs[config])
            measured["load_after"] = round(os.getloadavg()[0], 2)
            rounds.append(measured)
            print(f"round {turn + 1} (load {measured['load']} -> {measured['load_after']}):", flush=True)
            for config in configs:
                report(measured[config], config, names, cores)
            compare(measured, list(configs), names)
    finally:
        _remove(scratch)
    out = args.out or RESULTS / f"concurrency-{args.size}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "cores": cores,
                               "rounds": rounds}, indent=1))
    print(f"saved {out}")


if __name__ == "__main__":
    main()
