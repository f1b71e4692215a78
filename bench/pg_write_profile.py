"""Where one fact write's time goes (bench/README.md, issue 13):

    python -m bench.pg_write_profile postgresql://.../a_scratch_copy_of_a_world 100 [--mode own|shared]
                                     [--writers N] [--sample] [--cprofile] [--embed-latency-ms MS] [--json FILE]

`writers` processes (default 1) each store `count` new facts the way the bot does
(`fact_store.store_facts`, embedding from the bench's hash embed server), after 5 warm-up facts,
all starting at once; the facts are bench/pg_speed.py's (`own`: each writer its own user's
personal facts; `shared`: the busy channel and three shared users). Prints facts/s and, per fact
(averaged over the writers), where the time goes:
  - wall; CPU of the writer process (all threads), of the PostgreSQL server (the backends
    serving this database, from /proc: the server must run on this machine) and of the embed
    server (the embedding stand-in: a hash, no model; a real Ollama costs far more);
  - each phase as the event loop sees it (embedding over HTTP, planning on a read connection,
    the write transaction), and inside the planning and write jobs: the job's wall on its
    thread, that thread's CPU, the round trips (every psycopg wait: statements, BEGIN, COMMIT,
    savepoints) and the wall spent in them; "hop" is the loop's wall minus the job's (handing the
    job to the thread and the result back);
  - the per-key fact lock (PostgreSQL: the advisory lock; SQLite: BEGIN IMMEDIATE): the wait for
    it and how long it is held (taken -> the transaction's end);
  - the slowest statements (client-side wall, round trip included).
A first argument that is not a postgresql:// URL is a SQLite file (a scratch copy: it is written).
`--sample`: also where the (single) writer's Python spends its time, sampling every thread's
stack each millisecond (cProfile sees only the event loop's thread; the jobs run on others).
`--cprofile`: cProfile of the (single) writer, one profiler per thread (the event loop's, and the
planning and write jobs' on theirs), merged: the functions by their own time per fact.
`--embed-latency-ms`: the embed server answers this late (default 0: the database path alone;
bench.speed's writers use pg_speed.EMBED_LATENCY_MS). `--json`: the numbers into a file.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import cProfile
import json
import multiprocessing
import os
import sys
import threading
import time
from typing import Any

from bot.memory.engine import Engine
from bot.memory.writing import facts as fact_writes
from bot.settings import load_settings

from .embed_server import EmbedServerProcess
from .world import EMBED_MODEL

COUNTERS = ("embed_wall", "plan_wall", "write_wall", "plan_job", "write_job", "plan_cpu", "write_cpu",
            "plan_trips", "write_trips", "plan_trip_wall", "write_trip_wall", "lock_wait", "lock_held")
totals: dict[str, float] = collections.defaultdict(float)
statements: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
recording = [False]
_here = threading.local()  # the job running on this thread: its round trips
profilers: list[cProfile.Profile] = []  # --cprofile: one per thread that ran a job, and the loop's
profiling = [False]


def postmaster_pid(url: str) -> int:
    """The server's main process (the parent of a backend; the server must run on this machine)."""
    import psycopg
    with psycopg.connect(url) as conn:
        backend = int(conn.execute("SELECT pg_backend_pid()").fetchone()[0])
        fields = _stat(backend)
    assert fields is not None, "the PostgreSQL server must run on this machine"
    return int(fields[1])


def _stat(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as stat_file:
            stat = stat_file.read()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2:].split()


def tree_cpu_s(root: int) -> float:
    """CPU seconds (user + system) of `root`, its live children and the children it has reaped:
    a whole PostgreSQL server (backends that exit count through the postmaster's cutime)."""
    tick = os.sysconf("SC_CLK_TCK")
    fields = _stat(root)
    if fields is None:
        return 0.0
    total = sum(int(fields[i]) for i in (11, 12, 13, 14))
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            child = _stat(int(entry))
            if child is not None and child[1] == str(root):
                total += int(child[11]) + int(child[12])
    return total / tick


def process_cpu_s(pid: int) -> float:
    fields = _stat(pid)
    return 0.0 if fields is None else (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# Leaf frames where a thread waits rather than runs (sockets, queues, locks, the event loop's poll).
WAITING = ("wait", "select", "poll", "_worker", "get", "acquire", "sleep", "recv", "run_forever", "_run_once")


class StackSampler:
    """Every `interval` s, each other thread's stack: the leaf function when it is not waiting
    (self samples) and every project function on the stack (inclusive samples)."""

    def __init__(self, interval: float = 0.001) -> None:
        self.interval = interval
        self.leaf: collections.Counter[str] = collections.Counter()
        self.inclusive: collections.Counter[str] = collections.Counter()
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "StackSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        me = threading.get_ident()
        while not self._stop.wait(self.interval):
            if not recording[0]:
                continue
            self.samples += 1
            for ident, frame in sys._current_frames().items():
                if ident == me:
                    continue
                code = frame.f_code
                if code.co_name.split(".")[-1] in WAITING:
                    continue
                self.leaf[f"{_short(code.co_filename)}:{code.co_name}"] += 1
                seen: set[str] = set()
                walk: Any = frame
                while walk is not None:
                    name = f"{_short(walk.f_code.co_filename)}:{walk.f_code.co_name}"
                    if "bot/" in name and name not in seen:
                        seen.add(name)
                        self.inclusive[name] += 1
                    walk = walk.f_back

    def report(self, count: int, wall: float) -> None:
        ms = wall * 1000 / max(1, self.samples) / count  # one sample stands for the real time between samples
        print(f"  Python running (not waiting), sampled ({self.samples} samples), ms per fact; leaf functions:")
        for name, hits in self.leaf.most_common(15):
            print(f"    {hits * ms:6.2f}  {name}")
        print("  project functions on a running stack (inclusive):")
        for name, hits in self.inclusive.most_common(15):
            print(f"    {hits * ms:6.2f}  {name}")


def _short(filename: str) -> str:
    for marker in ("/bot/", "/site-packages/", "/lib/python3"):
        if marker in filename:
            return filename[filename.index(marker) + 1:]
    return filename


def instrument() -> None:
    """Time the phases, the jobs on their threads, every psycopg round trip and the fact lock."""
    from bot.memory.postgres.backend import PostgresStorage
    from bot.memory.sql import transactions

    def timed(name: str, method: Any) -> Any:
        async def wrapper(self: Engine, *args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return await method(self, *args, **kwargs)
            finally:
                if recording[0]:
                    totals[name] += time.perf_counter() - started
        return wrapper
    Engine.read = timed("plan_wall", Engine.read)  # type: ignore[method-assign]
    Engine.write = timed("write_wall", Engine.write)  # type: ignore[method-assign]
    Engine.embed_or_none = timed("embed_wall", Engine.embed_or_none)  # type: ignore[method-assign]

    def job(name: str, function: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            _here.trips, _here.trip_wall, _here.job, _here.locked_at = 0, 0.0, name, None
            started, cpu = time.perf_counter(), time.thread_time()
            profiler = _thread_profiler() if profiling[0] and recording[0] else None
            if profiler is not None:
                profiler.enable()
            try:
                return function(*args, **kwargs)
            finally:
                if profiler is not None:
                    profiler.disable()
                if recording[0]:
                    ended = time.perf_counter()
                    totals[f"{name}_job"] += ended - started
                    totals[f"{name}_cpu"] += time.thread_time() - cpu
                    totals[f"{name}_trips"] += _here.trips
                    totals[f"{name}_trip_wall"] += _here.trip_wall
                    if name == "write" and getattr(_here, "locked_at", None) is not None:
                        totals["lock_held"] += ended - _here.locked_at
                _here.job, _here.locked_at = None, None
        return wrapper
    fact_writes.plan_updates = job("plan", fact_writes.plan_updates)  # type: ignore[assignment]
    fact_writes.write_if_kept = job("write", fact_writes.write_if_kept)  # type: ignore[assignment]

    def timed_lock(method: Any) -> Any:  # the wait for the key locks: the statement(s) taking them
        def wrapper(self: Any, conn: Any, *args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            result = method(self, conn, *args, **kwargs)
            if getattr(_here, "locked_at", None) is None:
                _here.locked_at = time.perf_counter()
                if recording[0]:
                    totals["lock_wait"] += _here.locked_at - started
            return result
        return wrapper
    PostgresStorage.lock_keys = timed_lock(PostgresStorage.lock_keys)  # type: ignore[method-assign]
    if hasattr(PostgresStorage, "begin_fact_write"):  # the locks and the checks after them, one round trip
        PostgresStorage.begin_fact_write = timed_lock(PostgresStorage.begin_fact_write)  # type: ignore[attr-defined]

    begin = transactions._begin_immediate

    def timed_begin(conn: Any) -> None:  # SQLite: the file's write lock
        started = time.perf_counter()
        begin(conn)
        if getattr(_here, "job", None) == "write":
            _here.locked_at = time.perf_counter()
            if recording[0]:
                totals["lock_wait"] += _here.locked_at - started
    transactions._begin_immediate = timed_begin

    try:
        import psycopg
    except ImportError:
        return
    wait = psycopg.Connection.wait

    def timed_wait(self: Any, gen: Any, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return wait(self, gen, *args, **kwargs)
        finally:
            if getattr(_here, "job", None) is not None:
                _here.trips += 1
                _here.trip_wall += time.perf_counter() - started
    psycopg.Connection.wait = timed_wait  # type: ignore[method-assign]
    execute = psycopg.Connection.execute

    def timed_execute(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        result = execute(self, query, *args, **kwargs)
        if recording[0]:
            text = query.decode() if isinstance(query, bytes) else query if isinstance(query, str) else query.as_string(self)
            entry = statements[" ".join(text.split())[:80]]
            entry[0] += 1
            entry[1] += time.perf_counter() - started
        return result
    psycopg.Connection.execute = timed_execute  # type: ignore[method-assign]


def _thread_profiler() -> cProfile.Profile:
    """This thread's profiler (cProfile profiles only the thread that enables it)."""
    profiler = getattr(_here, "profiler", None)
    if profiler is None:
        profiler = _here.profiler = cProfile.Profile()
        profilers.append(profiler)
    return profiler


def report_cprofile(count: int, top: int = 25) -> None:
    import io
    import pstats
    stream = io.StringIO()
    stats = pstats.Stats(*profilers, stream=stream) if profilers else None
    if stats is None:
        return
    stats.sort_stats("tottime").print_stats(top)
    print(f"  cProfile, every thread, {count} facts (own time, cumulative), seconds for all of them:")
    lines = stream.getvalue().splitlines()
    start = next((i for i, line in enumerate(lines) if line.lstrip().startswith("ncalls")), 0)
    for line in lines[start:start + top + 1]:
        print("    " + line)


def _settings_env(target: str, embed_url: str) -> dict[str, str]:
    pg = target.startswith("postgresql://")
    # the same few people teach every fact: a learning cap no run reaches keeps them new memories (its count is measured)
    return {"MUNINN_DB_PATH": "/nonexistent.db" if pg else target, "MUNINN_DATABASE_URL": target if pg else "",
            "OLLAMA_URL": embed_url, "OLLAMA_EMBED_MODEL": EMBED_MODEL, "OLLAMA_COOLDOWN": "0",
            "OLLAMA_EMBED_TIMEOUT": "30", "MUNINN_MAINTENANCE_HOURS": "0", "MUNINN_LEARN_PER_DAY": "1000000"}


async def profile(target: str, embed_url: str, count: int, mode: str, seed: int, start_at: float | None,
                  at_start: Any = None) -> dict:
    from bot.lifecycle import fact_store

    from .pg_speed import writer_facts
    facts = writer_facts(mode, count + 5, seed)  # new sentences per seed: new facts, not reinforcements
    async with Engine(load_settings(_settings_env(target, embed_url)), warm=False) as engine:
        for fact in facts[:5]:
            await fact_store.store_facts(engine, [fact])
        if start_at is not None:
            await asyncio.sleep(max(0.0, start_at - time.time()))
        if at_start is not None:
            at_start()
        wall, cpu = time.perf_counter(), time.process_time()
        recording[0] = True
        loop_profiler = _thread_profiler() if profiling[0] else None
        if loop_profiler is not None:
            loop_profiler.enable()
        for fact in facts[5:]:
            await fact_store.store_facts(engine, [fact])
        if loop_profiler is not None:
            loop_profiler.disable()
        recording[0] = False
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {"wall": wall, "cpu": cpu, "totals": dict(totals), "statements": dict(statements)}


def _one_writer(target: str, embed_url: str, count: int, mode: str, seed: int, start_at: float, results: Any) -> None:
    instrument()
    results.put(asyncio.run(profile(target, embed_url, count, mode, seed, start_at)))


def run(target: str, count: int, mode: str, writers: int, sample: bool, *, embed_latency_ms: float = 0.0,
        cprofile: bool = False) -> dict:
    """Profile `writers` processes at once (1: in this process); print and return the breakdown."""
    pg = target.startswith("postgresql://")
    server = postmaster_pid(target) if pg else None
    embed = EmbedServerProcess("hash", dim=768, latency_ms=embed_latency_ms)
    profiling[0] = cprofile and writers == 1
    at: dict[str, float] = {}

    def at_start() -> None:
        at["server"] = tree_cpu_s(server) if server is not None else 0.0
        at["embed"] = process_cpu_s(embed.proc.pid) if embed.proc is not None else 0.0

    with embed as embed_url:
        if writers == 1:
            instrument()
            if sample:
                with StackSampler() as sampler:
                    results = [asyncio.run(profile(target, embed_url, count, mode, 10, None, at_start))]
                sampler.report(count, results[0]["wall"])
            else:
                results = [asyncio.run(profile(target, embed_url, count, mode, 10, None, at_start))]
        else:
            ctx = multiprocessing.get_context("spawn")
            queue = ctx.Queue()
            start_at = time.time() + 4 + writers
            procs = [ctx.Process(target=_one_writer, args=(target, embed_url, count, mode, 10 + n, start_at, queue))
                     for n in range(writers)]
            for proc in procs:
                proc.start()
            time.sleep(max(0.0, start_at - time.time()))
            at_start()
            results = [queue.get(timeout=900) for _ in procs]
            for proc in procs:
                proc.join()
        time.sleep(0.5)  # the writers' server backends have exited: their CPU reaches the postmaster when reaped
        server_cpu = tree_cpu_s(server) - at["server"] if server is not None else 0.0
        embed_cpu = process_cpu_s(embed.proc.pid) - at["embed"] if embed.proc is not None else 0.0
    facts = count * writers
    span = max(r["wall"] for r in results)
    merged: dict[str, float] = collections.defaultdict(float)
    for r in results:
        for key, value in r["totals"].items():
            merged[key] += value
    per = {key: merged[key] / facts * (1 if key.endswith("trips") else 1000) for key in COUNTERS}
    out = {"backend": "postgresql" if pg else "sqlite", "mode": mode, "writers": writers, "facts": facts,
           "embed_latency_ms": embed_latency_ms,
           "facts_per_s": round(facts / span, 1), "load": round(os.getloadavg()[0], 2),
           "wall_ms": round(sum(r["wall"] for r in results) / facts * 1000, 2),
           "client_cpu_ms": round(sum(r["cpu"] for r in results) / facts * 1000, 2),
           "server_cpu_ms": round(server_cpu / facts * 1000, 2) if pg else None,
           "embed_server_cpu_ms": round(embed_cpu / facts * 1000, 2),
           **{key: round(value, 2) for key, value in per.items()}}
    out["plan_hop_ms"] = round(out["plan_wall"] - out["plan_job"], 2)
    out["write_hop_ms"] = round(out["write_wall"] - out["write_job"], 2)
    print(f"{out['backend']} {mode} keys, {writers} writer(s) x {count} facts: {out['facts_per_s']} facts/s "
          f"(load {out['load']}); per fact: wall {out['wall_ms']} ms; CPU: writer process {out['client_cpu_ms']}, "
          f"PostgreSQL {out['server_cpu_ms']}, embed server {out['embed_server_cpu_ms']} ms")
    for phase in ("plan", "write"):
        print(f"  {phase}: {out[f'{phase}_wall']} ms as the loop sees it = job {out[f'{phase}_job']} (thread CPU "
              f"{out[f'{phase}_cpu']}; {out[f'{phase}_trips']} round trips, {out[f'{phase}_trip_wall']} ms in them) "
              f"+ hop {out[f'{phase}_hop_ms']}")
    print(f"  embedding (HTTP): {out['embed_wall']} ms; fact lock: wait {out['lock_wait']} ms, held {out['lock_held']} ms")
    if pg:
        merged_statements: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
        for r in results:
            for text, (calls, seconds) in r["statements"].items():
                merged_statements[text][0] += calls
                merged_statements[text][1] += seconds
        print("  statements (wall in the client, round trip included):")
        for text, (calls, seconds) in sorted(merged_statements.items(), key=lambda item: -item[1][1])[:12]:
            print(f"    {calls / facts:4.1f} per fact {seconds / facts * 1000:6.2f} ms per fact  {text}")
        out["statements"] = {text: [round(calls / facts, 2), round(seconds / facts * 1000, 3)]
                             for text, (calls, seconds) in merged_statements.items()}
    if profiling[0]:
        report_cprofile(facts)
    return out


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target", help="postgresql://... URL or a SQLite file: a scratch copy of a world")
    parser.add_argument("count", type=int, help="facts per writer")
    parser.add_argument("--mode", choices=("own", "shared"), default="own")
    parser.add_argument("--writers", type=int, default=1)
    parser.add_argument("--sample", action="store_true", help="sample the stacks (one writer only)")
    parser.add_argument("--cprofile", action="store_true", help="cProfile every thread (one writer only)")
    parser.add_argument("--embed-latency-ms", type=float, default=0.0, help="the embed server answers this late")
    parser.add_argument("--json", default=None, metavar="FILE", help="write the numbers to FILE")
    args = parser.parse_args(argv)
    out = run(args.target, args.count, args.mode, args.writers, args.sample, embed_latency_ms=args.embed_latency_ms,
              cprofile=args.cprofile)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(out, handle, indent=2)


if __name__ == "__main__":
    main(sys.argv[1:])
