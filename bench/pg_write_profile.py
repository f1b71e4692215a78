"""Where one PostgreSQL fact write's time goes (bench/README.md, issue 13):

    python -m bench.pg_write_profile postgresql://.../a_scratch_copy_of_a_world 100 [--sample]

One writer stores `count` new facts the way the bot does (`fact_store.store_facts`, embedding
from the bench's hash embed server), after 5 warm-up facts. Prints facts/s; per fact the wall
time, this process's CPU (all threads) and the PostgreSQL server's (the backends serving this
database, from /proc: the server must run on this machine); the time in each phase (embedding,
planning on a read connection, the write transaction) and the slowest statements (client-side
wall, round trip included). It writes to the database: give it a scratch copy.
`--sample`: also where this process's Python spends its time, by sampling every thread's stack
each millisecond (cProfile sees only the event loop's thread; the writes run on the engine's).
"""
from __future__ import annotations

import asyncio
import collections
import os
import sys
import threading
import time
from typing import Any

import psycopg

from bot.memory.engine import Engine
from bot.settings import load_settings

from .embed_server import EmbedServerProcess
from .speed import EMBED_MODEL, SkewShape, SkewWorld

phases: dict[str, float] = collections.defaultdict(float)
statements: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0])
recording = [False]


def server_pids(url: str) -> set[int]:
    """The server processes serving this database now (pg_stat_activity: the engine's
    connections, autovacuum on it); other databases' work (an index build elsewhere) is left out."""
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                            "AND pid != pg_backend_pid()").fetchall()
    return {int(row[0]) for row in rows}


def server_cpu_s(pids: set[int]) -> dict[int, float]:
    """CPU seconds (user + system) of each of these processes (on this machine, from /proc)."""
    out: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as stat_file:
                stat = stat_file.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        out[pid] = (int(fields[11]) + int(fields[12])) / tick
    return out


def cpu_between(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU spent meanwhile by the processes alive at both ends."""
    return sum(after[pid] - before[pid] for pid in before.keys() & after.keys())


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
    """Time Engine.read / write / embed_or_none and every psycopg statement while recording."""
    def timed(name: str, method: Any) -> Any:
        async def wrapper(self: Engine, *args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return await method(self, *args, **kwargs)
            finally:
                if recording[0]:
                    phases[name] += time.perf_counter() - started
        return wrapper
    Engine.read = timed("planning (Engine.read: the duplicate search)", Engine.read)  # type: ignore[method-assign]
    Engine.write = timed("the write transaction (Engine.write)", Engine.write)  # type: ignore[method-assign]
    Engine.embed_or_none = timed("embedding (HTTP)", Engine.embed_or_none)  # type: ignore[method-assign]
    execute = psycopg.Connection.execute

    def timed_execute(self: psycopg.Connection, query: Any, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        result = execute(self, query, *args, **kwargs)
        if recording[0]:
            text = query.decode() if isinstance(query, bytes) else query if isinstance(query, str) else query.as_string(self)
            entry = statements[" ".join(text.split())[:80]]
            entry[0] += 1
            entry[1] += time.perf_counter() - started
        return result
    psycopg.Connection.execute = timed_execute  # type: ignore[method-assign]


async def profile(url: str, embed_url: str, count: int, sampler: StackSampler | None = None) -> None:
    from bot.lifecycle import fact_store
    from bot.lifecycle.facts import Fact
    env = {"MUNINN_DB_PATH": "/nonexistent.db", "MUNINN_DATABASE_URL": url, "OLLAMA_URL": embed_url,
           "OLLAMA_EMBED_MODEL": EMBED_MODEL, "OLLAMA_COOLDOWN": "0", "OLLAMA_EMBED_TIMEOUT": "30",
           "MUNINN_MAINTENANCE_HOURS": "0"}
    world = SkewWorld(SkewShape(1000), seed=int(time.time()))  # new sentences: new facts, not reinforcements
    facts = [Fact(world.sentence(), "someone", "personal", 0.5, owner_id=1010, channel_id=100_011, guild_id=1)
             for _ in range(count + 5)]
    async with Engine(load_settings(env), warm=False) as engine:
        for fact in facts[:5]:
            await fact_store.store_facts(engine, [fact])
        pids = server_pids(url)
        wall, cpu, server_at_start = time.perf_counter(), time.process_time(), server_cpu_s(pids)
        recording[0] = True
        for fact in facts[5:]:
            await fact_store.store_facts(engine, [fact])
        recording[0] = False
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        server = cpu_between(server_at_start, server_cpu_s(pids))
    print(f"{count} facts: {count / wall:.1f} facts/s; per fact: wall {wall / count * 1000:.1f} ms, this process's "
          f"CPU {cpu / count * 1000:.1f} ms, PostgreSQL's CPU {server / count * 1000:.1f} ms")
    for name, seconds in phases.items():
        print(f"  {name}: {seconds / count * 1000:.1f} ms per fact")
    print("  statements (wall in the client, round trip included):")
    for text, (calls, seconds) in sorted(statements.items(), key=lambda item: -item[1][1])[:12]:
        print(f"    {calls / count:4.1f} per fact {seconds / count * 1000:6.2f} ms per fact  {text}")
    if sampler is not None:
        sampler.report(count, wall)


def main(argv: list[str]) -> None:
    sample = "--sample" in argv
    argv = [a for a in argv if a != "--sample"]
    if len(argv) != 2:
        raise SystemExit("usage: python -m bench.pg_write_profile postgresql://... COUNT [--sample]")
    instrument()
    with EmbedServerProcess("hash", dim=768) as embed_url:
        if not sample:
            asyncio.run(profile(argv[0], embed_url, int(argv[1])))
            return
        with StackSampler() as sampler:
            asyncio.run(profile(argv[0], embed_url, int(argv[1]), sampler))


if __name__ == "__main__":
    main(sys.argv[1:])
