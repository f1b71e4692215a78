"""Where the recall tail goes at 100k (issue 12): waiting for a core, CPU, or something else.

    .venv/bin/python -m bench.tail --size 100000                 # A/B: checkpoints inline + GC as is, vs main's defaults
    .venv/bin/python -m bench.tail --size 100000 --variants new  # only the product's defaults

On a scratch copy of bench.speed's world (the 100k world builds in ~1-3 min if missing), the busy
channel stores a new memory before every recall (untimed, as `bench.speed` does) and each
recall of each viewer class is timed with, for the threads that worked on it (the event
loop's, the read connections', the writer's for the touch), their CPU and their wait in the
run queue (/proc/self/task/<tid>/schedstat, fields 1 and 2): wall = CPU + run queue + other
(GIL, I/O, locks; negative when threads overlapped). It also counts the recalls that overlapped
a WAL checkpoint (checkpoints.Checkpoints.history, either thread) or a full GC collection
(gc.callbacks), and the CPU the engine's background thread used meanwhile.

Variants, interleaved block by block in one process (each block a fresh engine, warm first):
`old` = SQLite's checkpoint inside the commit (MUNINN_WAL_CHECKPOINT=inline) and no gc.freeze
(MUNINN_GC_FREEZE=off), i.e. main before this change; `new` = the defaults. The order of the
variants alternates each round.
"""
from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse
import asyncio
import gc
import json
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bot.memory.engine import Engine
from bot.memory.sqlite import vec0 as vectors

from .speed import forget_word_counts
from .world import RESULTS, VIEWER_CLASSES, SkewShape, SkewWorld, bench_settings, build, percentile, said_in_busy_channel

VARIANTS = {"old": {"MUNINN_WAL_CHECKPOINT": "inline", "MUNINN_GC_FREEZE": "off"},
            "new": {"MUNINN_WAL_CHECKPOINT": "", "MUNINN_GC_FREEZE": ""},
            "ckpt": {"MUNINN_WAL_CHECKPOINT": "", "MUNINN_GC_FREEZE": "off"},   # checkpoints moved only
            "freeze": {"MUNINN_WAL_CHECKPOINT": "inline", "MUNINN_GC_FREEZE": ""}}
BACKGROUND_THREADS = ("muninn-vecload",)  # the engine's loader: cache loads, and now checkpoints


def schedstat_wait(tid: int) -> int:
    """ns this thread of the process has waited in the run queue (schedstat field 2: brought up to
    date each time the thread gets a core, so exact for threads that are not running now)."""
    try:
        with open(f"/proc/self/task/{tid}/schedstat") as f:
            return int(f.read().split()[1])
    except (FileNotFoundError, ValueError, IndexError):  # the thread ended
        return 0


def thread_cpu(ident: int) -> int:
    """ns of CPU of one thread (its CPU clock: exact, also for the running thread, where
    schedstat's field 1 lags by up to a scheduler tick)."""
    try:
        return time.clock_gettime_ns(time.pthread_getcpuclockid(ident))
    except (OSError, ProcessLookupError):
        return 0


def threads_of(prefixes: tuple[str, ...]) -> list[int]:
    """pthread idents of this process's threads whose name starts with one of `prefixes`."""
    return [t.ident for t in threading.enumerate() if t.ident is not None and t.name.split("_")[0] in prefixes]


class JobClock:
    """CPU and run-queue wait of each job the engine's reader and writer threads run (wrapped
    on their executors, bench-side only). A job's wait counts from its submission (the waits of
    the executor's idle threads are read then: a sleeping thread's count is up to date) to its
    end: the wait to be woken for it plus what it waited while running it, all on the recall's
    path; what a thread waited after its previous job (setting that job's result) is not."""

    def __init__(self) -> None:
        self.jobs: list[tuple[float, int, int]] = []  # (ended, cpu ns, run-queue ns)
        self.skip_next = False  # the next job submitted is not a recall's (the busy channel's write)

    def wrap(self, executor: Any) -> None:
        submit = executor.submit

        def timed_submit(fn: Any, /, *args: Any, **kwargs: Any) -> Any:
            at_submit = {t.native_id: schedstat_wait(t.native_id) for t in list(executor._threads)}
            if self.skip_next:  # set just before the write, which submits before it yields: nothing between
                self.skip_next = False
                return submit(fn, *args, **kwargs)

            def job() -> Any:
                tid = threading.get_native_id()
                cpu = time.thread_time_ns()
                since = at_submit.get(tid)
                since = schedstat_wait(tid) if since is None else since  # a thread started for it
                try:
                    return fn(*args, **kwargs)
                finally:
                    self.jobs.append((time.perf_counter(), time.thread_time_ns() - cpu, schedstat_wait(tid) - since))
            return submit(job)
        executor.submit = timed_submit

    def between(self, start: float, end: float) -> tuple[float, float]:
        """(cpu ms, run-queue ms) of the jobs that ended in [start, end]."""
        done = [(cpu, wait) for ended, cpu, wait in self.jobs if start <= ended <= end]
        return sum(c for c, _ in done) / 1e6, sum(w for _, w in done) / 1e6


class GcClock:
    """Every collection's (start, end, generation), through gc.callbacks."""

    def __init__(self) -> None:
        self.spans: list[tuple[float, float, int]] = []
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.spans.append((self._started, time.perf_counter(), int(info["generation"])))

    def __enter__(self) -> "GcClock":
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self)


def overlapping(spans: list[tuple[float, float]], start: float, end: float) -> list[tuple[float, float]]:
    return [(a, b) for a, b in spans if a < end and b > start]


@dataclass
class Block:
    """The recalls of one variant in one round."""
    rows: dict[str, list[dict[str, float]]] = field(default_factory=lambda: {k: [] for k in VIEWER_CLASSES})
    checkpoints: list[dict[str, Any]] = field(default_factory=list)
    full_gcs_ms: list[float] = field(default_factory=list)
    full_collect_ms: float = 0.0
    load: float = 0.0


async def talk_beside(engine: Engine, jobs: JobClock, info: vectors.IndexInfo, chatter: SkewWorld, every_s: float,
                      stop: asyncio.Event) -> None:
    """The busy channel stores a message every `every_s` while the recalls run (the bot records
    every message through the writer, whatever recalls are in flight)."""
    while not stop.is_set():
        jobs.skip_next = True
        await engine.write(said_in_busy_channel, info, chatter)
        try:
            await asyncio.wait_for(stop.wait(), every_s)
        except asyncio.TimeoutError:
            pass


async def run_block(path: Path, shape: SkewShape, variant: str, per_class: int, seed: int, warm: int = 10,
                    beside_ms: float = 0.0) -> Block:
    """`beside_ms` > 0: the busy channel talks every that many ms beside the recalls; 0: it stores
    one message before each recall, untimed (bench.speed's protocol)."""
    os.environ.update(VARIANTS[variant])
    world, chatter = SkewWorld(shape, seed=seed), SkewWorld(shape, seed=seed + 1)
    block = Block(load=os.getloadavg()[0])
    forget_word_counts()
    with GcClock() as gcs:
        async with Engine(bench_settings(path)) as engine:
            info = await engine.write(vectors.index_info)
            await engine.warmed()
            checks = getattr(engine.storage, "checkpoints", None)
            jobs = JobClock()  # a recall's work: the event loop (this thread), then jobs on these
            jobs.wrap(engine._readers)
            jobs.wrap(engine._executor)
            main = threading.get_native_id()
            collected = time.perf_counter()
            gc.collect()  # what one full collection costs now (frozen: the warm cache is not walked)
            block.full_collect_ms = (time.perf_counter() - collected) * 1000
            gcs.spans.clear()
            stop = asyncio.Event()
            talking = (asyncio.create_task(talk_beside(engine, jobs, info, chatter, beside_ms / 1000, stop))
                       if beside_ms > 0 else None)
            for kind in VIEWER_CLASSES:
                for i in range(per_class + warm):
                    viewer = world.viewer_of(kind)
                    text, qvec = world.query()
                    if talking is None:
                        await engine.write(said_in_busy_channel, info, chatter)
                    bg = threads_of(BACKGROUND_THREADS)
                    bg_before = sum(thread_cpu(ident) for ident in bg)
                    main_waited, main_cpu = schedstat_wait(main), time.thread_time_ns()
                    start = time.perf_counter()
                    await engine.recall(text, viewer, query_vector=qvec.tolist())
                    end = time.perf_counter()
                    main_cpu, main_waited = time.thread_time_ns() - main_cpu, schedstat_wait(main) - main_waited
                    bg_cpu = (sum(thread_cpu(ident) for ident in bg) - bg_before) / 1e6
                    if i < warm:
                        continue
                    job_cpu, job_wait = jobs.between(start, end)
                    cpu, runq = main_cpu / 1e6 + job_cpu, main_waited / 1e6 + job_wait
                    wall = (end - start) * 1000
                    ckpt = overlapping([(c.started, c.ended) for c in (checks.history if checks else ())], start, end)
                    full = overlapping([(a, b) for a, b, gen in gcs.spans if gen == 2], start, end)
                    block.rows[kind].append({
                        "wall": wall, "cpu": cpu, "runq": runq, "other": wall - cpu - runq, "bg_cpu": bg_cpu,
                        "ckpt": float(bool(ckpt)), "gc2": float(bool(full)),
                        "ckpt_ms": sum((min(b, end) - max(a, start)) * 1000 for a, b in ckpt),
                        "gc_ms": sum((min(b, end) - max(a, start)) * 1000
                                     for a, b, _ in gcs.spans if a < end and b > start)})
            stop.set()
            if talking is not None:
                await talking
            if checks is not None:
                block.checkpoints = [{"thread": c.thread.split("_")[0], "ms": (c.ended - c.started) * 1000,
                                      "wal": c.wal_pages, "copied": c.copied_pages} for c in checks.history]
        block.full_gcs_ms = [(b - a) * 1000 for a, b, gen in gcs.spans if gen == 2]
    return block


def stats(values: list[float]) -> dict[str, float]:
    return {"p50": round(percentile(values, 50), 2), "p95": round(percentile(values, 95), 2)}


def summarise(blocks: list[Block]) -> dict[str, Any]:
    out: dict[str, Any] = {"classes": {}, "load": [round(b.load, 2) for b in blocks]}
    for kind in VIEWER_CLASSES:
        rows = [row for b in blocks for row in b.rows[kind]]
        out["classes"][kind] = {
            **{name: stats([r[name] for r in rows]) for name in ("wall", "cpu", "runq", "other", "bg_cpu")},
            "n": len(rows), "wall_max": round(max(r["wall"] for r in rows), 2),
            "over_checkpoint": int(sum(r["ckpt"] for r in rows)),
            "walls_over_checkpoint": [round(r["wall"], 1) for r in rows if r["ckpt"]],
            "walls_over_full_gc": [round(r["wall"], 1) for r in rows if r["gc2"]],
            "over_full_gc": int(sum(r["gc2"] for r in rows)),
            "ckpt_ms_in_recalls": round(sum(r["ckpt_ms"] for r in rows), 1),
            "gc_ms_in_recalls": round(sum(r["gc_ms"] for r in rows), 1)}
    ckpts = [c for b in blocks for c in b.checkpoints]
    by_thread: dict[str, list[dict[str, Any]]] = {}
    for c in ckpts:
        by_thread.setdefault(c["thread"], []).append(c)
    out["checkpoints"] = {thread: {"n": len(done), "p50_ms": round(percentile([c["ms"] for c in done], 50), 2),
                                   "max_ms": round(max(c["ms"] for c in done), 2),
                                   "wal_pages_max": max(c["wal"] for c in done)} for thread, done in by_thread.items()}
    out["gc_collect_ms"] = [round(b.full_collect_ms, 2) for b in blocks]
    full = [ms for b in blocks for ms in b.full_gcs_ms]
    out["full_gcs"] = {"n": len(full), "p50_ms": round(percentile(full, 50), 2) if full else 0.0,
                       "max_ms": round(max(full), 2) if full else 0.0}
    return out


def print_results(results: dict[str, dict[str, Any]]) -> None:
    print("\nper class, ms p50 / p95: wall = cpu + run-queue wait + other (threads that worked on the recall); "
          "recalls over a checkpoint / a full GC")
    print("| variant | class | n | wall | cpu | run queue | other | background cpu | wall max | over a checkpoint "
          "(their walls) | over a full GC (their walls) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for variant, r in results.items():
        for kind, c in r["classes"].items():
            cells = " | ".join(f"{c[name]['p50']:.2f} / {c[name]['p95']:.2f}"
                               for name in ("wall", "cpu", "runq", "other", "bg_cpu"))
            print(f"| {variant} | {kind} | {c['n']} | {cells} | {c['wall_max']:.1f} | "
                  f"{c['over_checkpoint']} {c['walls_over_checkpoint']} | {c['over_full_gc']} {c['walls_over_full_gc']} |")
    for variant, r in results.items():
        print(f"{variant}: checkpoints {r['checkpoints']}; full GCs during the block {r['full_gcs']}; "
              f"gc.collect() after the warm {r['gc_collect_ms']} ms; load per block {r['load']}")
    if "old" in results and "new" in results:
        print("p95 wall new / old: " + ", ".join(
            f"{kind} {results['new']['classes'][kind]['wall']['p95'] / results['old']['classes'][kind]['wall']['p95']:.2f}"
            for kind in VIEWER_CLASSES))


async def run(args: argparse.Namespace) -> dict[str, Any]:
    world = Path(args.workdir) / f"skew-{args.size}-{args.label}.db"
    if not world.exists():
        print(f"building {world}", flush=True)
        await build(world, SkewShape(args.size))
    scratch = Path(args.workdir) / f"tail-scratch-{args.size}.db"
    for p in (scratch, Path(f"{scratch}-wal"), Path(f"{scratch}-shm")):
        p.unlink(missing_ok=True)
    shutil.copy(world, scratch)
    variants = args.variants.split(",")
    blocks: dict[str, list[Block]] = {v: [] for v in variants}
    saved = {name: os.environ.get(name) for name in VARIANTS["old"]}
    try:
        for round_ in range(args.rounds):
            order = variants if round_ % 2 == 0 else variants[::-1]
            for variant in order:
                block = await run_block(scratch, SkewShape(args.size), variant, args.per_class, seed=1000 + round_,
                                        beside_ms=args.talk_beside_ms)
                blocks[variant].append(block)
                walls = {k: round(percentile([r["wall"] for r in block.rows[k]], 95), 1) for k in VIEWER_CLASSES}
                print(f"round {round_ + 1} {variant:>6} (load {block.load:.1f}): p95 wall {walls}", flush=True)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        for p in (scratch, Path(f"{scratch}-wal"), Path(f"{scratch}-shm")):
            p.unlink(missing_ok=True)
    return {variant: summarise(b) for variant, b in blocks.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Where the recall tail goes: run queue, CPU, checkpoints, GC")
    parser.add_argument("--size", type=int, default=100_000)
    parser.add_argument("--variants", default="old,new", help=f"comma-separated, of {', '.join(VARIANTS)}")
    parser.add_argument("--rounds", type=int, default=4, help="blocks per variant, their order alternating")
    parser.add_argument("--per-class", type=int, default=30, help="recalls per class in each block")
    parser.add_argument("--talk-beside-ms", type=float, default=0.0,
                        help="the busy channel stores a message every that many ms beside the recalls "
                             "(default 0: one before each recall, untimed, as bench.speed)")
    parser.add_argument("--workdir", default=str(RESULTS))
    parser.add_argument("--label", default="speed", help="the bench.speed world to copy (skew-SIZE-LABEL.db)")
    parser.add_argument("--out", default=None, help="JSON file (default bench/results/tail-SIZE.json)")
    args = parser.parse_args(argv)
    unknown = set(args.variants.split(",")) - set(VARIANTS)
    if unknown:
        parser.error(f"unknown variants {sorted(unknown)}")
    started = time.perf_counter()
    results = asyncio.run(run(args))
    print_results(results)
    out = Path(args.out) if args.out else RESULTS / f"tail-{args.size}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "results": results,
                               "seconds": round(time.perf_counter() - started, 1)}, indent=2))
    print(f"saved {out} ({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
