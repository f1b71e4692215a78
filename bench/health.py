"""/healthz and /metrics latency while the bot is busy recalling (goal: within 50 ms).

    .venv/bin/python -m bench.health                      # 20,000-memory world, 20 recalls in flight, 10 s
    .venv/bin/python -m bench.health --size 100000 --seconds 20

The real bot (`MuninnBot`, MUNINN_METRICS_PORT set) runs on the fake Discord gateway
(tests/fakes/discord_server.py) over a `bench.world` SkewWorld; `--in-flight` coroutines keep
that many `Engine.recall`s of the bot's own engine going at all times (mixed viewers, the query
vector given, touch on, as the pipeline asks). A child process, as Prometheus would, GETs
/metrics and /healthz in turn every `--every` ms over HTTP and times each answer, so the
number includes the wait for the bot's busy event loop. Prints p50 / p95 / max per page and the
recalls per second; `--out` writes the JSON.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import socket
import time
import urllib.request
from pathlib import Path
from typing import Any

from .world import RESULTS, SkewShape, bench_settings, build, make_world, percentile, query_of

GOAL_MS = 50.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _scrape(port: int, every_s: float, stop: Any, out: Any) -> None:
    """A child process: GET /metrics and /healthz in turn until `stop`; puts {page: [ms, ...]} and the statuses."""
    times: dict[str, list[float]] = {"/metrics": [], "/healthz": []}
    statuses: dict[int, int] = {}
    while not stop.is_set() or not times["/healthz"]:  # at least one round, however slow the start
        for page in times:
            started = time.perf_counter()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}{page}", timeout=10) as response:
                    response.read()
                    status = response.status
            except urllib.error.HTTPError as exc:  # a 503 is an answer too
                exc.read()
                status = exc.code
            times[page].append((time.perf_counter() - started) * 1000)
            statuses[status] = statuses.get(status, 0) + 1
            time.sleep(every_s)
    out.put((times, statuses))


async def run(args: argparse.Namespace) -> dict:
    from bot.memory.engine import Engine
    from cogs.client import MuninnBot
    from tests.fakes.discord_server import FakeDiscord, discord_urls_patched
    from tests.fakes.ollama import FakeOllama

    path = Path(args.workdir) / f"skew-{args.size}-health.db"
    if not path.exists():
        print(f"building a {args.size}-memory world in {path} ...", flush=True)
        await build(path, SkewShape(args.size))
    world = make_world(SkewShape(args.size))
    asks = [(query_of(world), world.viewer()) for _ in range(500)]  # made before the clock starts
    port = _free_port()
    async with FakeDiscord(heartbeat_interval=1000) as fake, FakeOllama() as ollama:
        fake.add_guild("Asgard", members=[fake.add_user("alice")])
        with discord_urls_patched(fake):
            settings = bench_settings(path, ollama.url, MUNINN_METRICS_PORT=str(port), MUNINN_MAINTENANCE_HOURS="0")
            bot = MuninnBot(settings, guild_ready_timeout=0.1)
            task = asyncio.create_task(bot.start("fake-token"))
            try:
                await fake.wait_until_ready()
                engine: Engine = bot.engine  # type: ignore[assignment]
                await engine.warmed()
                return await measure(args, engine, asks, port)
            finally:
                await bot.close()
                await asyncio.gather(task, return_exceptions=True)


async def measure(args: argparse.Namespace, engine: Any, asks: list, port: int) -> dict:
    """Keep `args.in_flight` recalls going while the child scrapes; the latencies and the recall rate."""
    done = 0
    stopping = asyncio.Event()

    async def recaller(n: int) -> None:
        nonlocal done
        i = n
        while not stopping.is_set():
            (text, vector), viewer = asks[i % len(asks)]
            await engine.recall(text, viewer, query_vector=vector)
            done += 1
            i += args.in_flight
    recallers = [asyncio.create_task(recaller(n)) for n in range(args.in_flight)]
    await asyncio.sleep(1.0)  # every recaller under way before the first scrape
    context = multiprocessing.get_context("spawn")
    stop, out = context.Event(), context.Queue()
    scraper = context.Process(target=_scrape, args=(port, args.every / 1000, stop, out))
    done, started = 0, time.perf_counter()
    scraper.start()
    await asyncio.sleep(args.seconds)
    stop.set()
    times, statuses = await asyncio.to_thread(out.get)
    elapsed = time.perf_counter() - started
    stopping.set()
    await asyncio.gather(*recallers)
    scraper.join()
    result: dict[str, Any] = {"size": args.size, "in_flight": args.in_flight, "seconds": round(elapsed, 1),
                              "recalls_per_s": round(done / elapsed, 1), "statuses": statuses}
    for page, ms in times.items():
        result[page] = {"n": len(ms), "p50_ms": round(percentile(ms, 50), 2), "p95_ms": round(percentile(ms, 95), 2),
                        "max_ms": round(max(ms), 2), "within_goal": percentile(ms, 95) <= GOAL_MS}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", type=int, default=20_000, help="memories in the world")
    parser.add_argument("--in-flight", type=int, default=20, help="recalls kept in flight")
    parser.add_argument("--seconds", type=float, default=10.0, help="how long to scrape")
    parser.add_argument("--every", type=float, default=50.0, help="ms between two requests of the scraper")
    parser.add_argument("--workdir", default=str(RESULTS))
    parser.add_argument("--out", help="write the JSON here too")
    args = parser.parse_args()
    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    result = asyncio.run(run(args))
    for page in ("/metrics", "/healthz"):
        r = result[page]
        print(f"{page:9} n={r['n']:4}  p50 {r['p50_ms']:6.2f} ms  p95 {r['p95_ms']:6.2f} ms  max {r['max_ms']:6.2f} ms"
              f"  {'within' if r['within_goal'] else 'OVER'} the {GOAL_MS:.0f} ms goal (p95)")
    print(f"while {result['in_flight']} recalls were in flight: {result['recalls_per_s']} recalls/s over "
          f"{result['size']} memories; statuses {result['statuses']}")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
