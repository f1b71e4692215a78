"""How fast the operator's console answers at scale: every page, over HTTP and in a real browser.

    python -m bench.console [--size 100000] [--repeat 10] [--no-browser] [--database-url URL]

Builds (once, kept in bench/results/, git-ignored) a community of the realistic shape
(bench/world.py SkewShape: one busy channel with 30 % of all memories, Zipf users), gives it a
history (learned over 400 days up to today, one in 20 older than a month archived by decay), starts the
console over it as `muninn web` does, logs in, and asks each page the hard way: the busiest
channel, the person with the most memories, a memory with links, a search as the busiest viewer,
the stats over a year (every memory of the world). It prints per page the server time (p50/p95 over --repeat requests,
from the HTTP client on 127.0.0.1) and, when chromium is installed, the browser's own load time
(Navigation Timing: request to load event, the page drawn; median and max of --repeat/2 loads),
beside the 200 ms goal.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import time
from pathlib import Path

from aiohttp.test_utils import TestClient, TestServer

from bench import browser
from bench.world import RESULTS, SkewShape, bench_settings, build
from bot.memory.console import Filter
from bot.memory.engine import Engine
from bot.memory.sql import queries
from bot.web.app import create_app

TOKEN = "bench-console-token-0123456789"
AGE_DAYS = 400           # the community's history: memories learned over this many days up to today
ARCHIVED_EVERY = 20      # one in this many memories older than a month archived by decay
AGED = "console_bench_aged"  # meta mark: the world has its history
DAY = 86400.0
GOAL_MS = 200.0


async def pages(engine: Engine) -> dict[str, str]:
    """The pages to time, each at its hardest for this database."""
    places = await engine.console.places()
    busiest = max((p for p in places if p.channel_id is not None), key=lambda p: p.room + p.personal)
    people, _ = await engine.console.people(limit=1)
    heaviest = people[0].user_id
    linked = await engine.read(lambda conn: next(iter(conn.execute(
        "SELECT source_id FROM memory_links GROUP BY source_id ORDER BY count(*) DESC LIMIT 1")), (1,))[0])
    said, _ = await engine.console.memories(Filter(channel_id=busiest.channel_id, scope="room"), limit=1)
    words = "+".join(said[0].text.split()[:4]) if said else "what+did+we+plan+for+the+weekend"  # words that find memories
    return {"overview": "/", "servers": "/servers", "busiest channel": f"/channels/{busiest.channel_id}",
            "its archived": f"/channels/{busiest.channel_id}?state=archived", "people": "/people",
            "heaviest person": f"/people/{heaviest}", "a memory": f"/memories/{linked}",
            "search": f"/search?q={words}&user={heaviest}&channel={busiest.channel_id}"
                      f"&guild={busiest.guild_id}",
            "stats (a year)": "/stats?days=366", "log": "/log"}


async def log_in(client: TestClient) -> None:
    form = await (await client.get("/login")).text()
    nonce = re.search(r'name="login" value="([^"]+)"', form)
    assert nonce
    answer = await client.post("/login", data={"login": nonce.group(1), "token": TOKEN})
    assert answer.status == 200


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def over_http(client: TestClient, paths: dict[str, str], repeat: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for name, path in paths.items():
        times = []
        for _ in range(repeat):
            started = time.perf_counter()
            answer = await client.get(path)
            await answer.read()
            times.append((time.perf_counter() - started) * 1000)
            assert answer.status == 200, (path, answer.status)
        out[name] = times
    return out


async def in_browser(base: str, paths: dict[str, str], repeat: int) -> dict[str, list[float]]:
    driver = await asyncio.to_thread(browser.launch)
    out: dict[str, list[float]] = {}
    try:
        await asyncio.to_thread(driver.get, base + "/login")
        field = await asyncio.to_thread(driver.find_element, "css selector", "input[name=token]")
        await asyncio.to_thread(field.send_keys, TOKEN + "\n")
        await asyncio.sleep(0.5)
        for name, path in paths.items():
            times = []
            for _ in range(max(1, repeat // 2)):
                await asyncio.to_thread(driver.get, base + path)
                times.append(await asyncio.to_thread(browser.navigation_ms, driver))
            out[name] = times
    finally:
        await asyncio.to_thread(driver.quit)
    return out


async def age(path: Path, days: int = AGE_DAYS, archived_every: int = ARCHIVED_EVERY) -> None:
    """Give the world a history, as a community a year old has: memories learned over `days` days
    up to today (the newest last), and one in `archived_every` of those older than a month archived
    by decay since, on days spread over the year. Done once (a meta mark)."""
    async with Engine(bench_settings(path), warm=False) as engine:
        if await engine.read(lambda conn: queries.get_meta(conn, AGED)):
            return
        now = time.time()
        top = await engine.read(lambda conn: queries.query_value(conn, "SELECT max(id) FROM memories", (), 1))

        def spread(conn) -> list[int]:
            conn.execute("UPDATE memories SET created_at = ? - (? - id) * ?, updated_at = ? - (? - id) * ?, "
                         "last_accessed = NULL", (now, top, days * DAY / top, now, top, days * DAY / top))
            return [int(r[0]) for r in conn.execute(
                "SELECT id FROM memories WHERE archived_at IS NULL AND created_at < ? AND id % ? = 0",
                (now - 30 * DAY, archived_every))]
        fading = await engine.write(spread)
        for memory_id in fading:  # the product's own archive: the keyword index and the vectors follow
            await engine.archive(memory_id, "decayed")
        await engine.write(lambda conn: conn.execute(
            "UPDATE memories SET archived_at = created_at + 30 * ? + (id % 97) * ? WHERE archive_reason = 'decayed'",
            (DAY, DAY)))
        await engine.write(lambda conn: queries.set_meta(conn, AGED, "1"))
    print(f"  aged it over {days} days; {len(fading):,} memories archived by decay", flush=True)


async def run(args: argparse.Namespace) -> dict:
    path = Path(args.workdir) / f"console-{args.size}.db"
    if not path.exists():
        print(f"building a {args.size:,}-memory community in {path} (once) ...", flush=True)
        await build(path, SkewShape(args.size))
    await age(path)
    settings = bench_settings(path)
    if args.database_url:  # the same world, copied by `muninn migrate`'s own copy into PostgreSQL
        from bench.pg_speed import copied, create_database, database_url, settings_for
        from bot.memory.postgres.copy import copy_database
        url = database_url(args.database_url, f"console_bench_{args.size}_aged")
        if not copied(url):
            create_database(args.database_url, f"console_bench_{args.size}_aged")
            await asyncio.to_thread(copy_database, path, url, batch=5000)
        settings = settings_for(path, url)
    async with Engine(settings, warm=False) as engine:
        paths = await pages(engine)
        server = TestServer(create_app(engine, token=TOKEN), host="127.0.0.1")
        client = TestClient(server)
        await client.start_server()
        try:
            await log_in(client)
            http = await over_http(client, paths, args.repeat)
            seen = (await in_browser(str(server.make_url("")).rstrip("/"), paths, args.repeat)
                    if args.browser and browser.available() else {})
        finally:
            await client.close()
    rows = []
    for name in paths:
        row = {"page": name, "http_p50_ms": round(statistics.median(http[name]), 1),
               "http_p95_ms": round(percentile(http[name], 0.95), 1)}
        if name in seen:  # the median: one slow load on a shared machine is the machine's, not the page's
            row["browser_ms"] = round(statistics.median(seen[name]), 1)
            row["browser_max_ms"] = round(max(seen[name]), 1)
        rows.append(row)
    return {"size": args.size, "backend": "postgresql" if args.database_url else "sqlite", "goal_ms": GOAL_MS,
            "pages": rows,
            "browser": "chromium" if seen else ("off" if not args.browser else browser.MISSING)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=100_000, help="memories in the community")
    parser.add_argument("--repeat", type=int, default=10, help="requests per page over HTTP (half as many in the browser)")
    parser.add_argument("--no-browser", dest="browser", action="store_false", help="time over HTTP only")
    parser.add_argument("--workdir", default=str(RESULTS))
    parser.add_argument("--database-url", default="", metavar="URL",
                        help="a PostgreSQL server: the world is copied into a database of its own there (once)")
    args = parser.parse_args()
    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    result = asyncio.run(run(args))
    print(f"console at {result['size']:,} memories on {result['backend']} "
          f"(goal: every page under {GOAL_MS:.0f} ms; browser: {result['browser']})")
    print(f"{'page':<18}{'http p50':>10}{'http p95':>10}{'browser p50':>13}{'max':>8}  within goal")
    for row in result["pages"]:
        worst = max(row["http_p95_ms"], row.get("browser_ms", 0.0))
        print(f"{row['page']:<18}{row['http_p50_ms']:>10.1f}{row['http_p95_ms']:>10.1f}"
              f"{row.get('browser_ms', float('nan')):>13.1f}{row.get('browser_max_ms', float('nan')):>8.1f}"
              f"  {'yes' if worst < GOAL_MS else 'NO'}")
    out = Path(args.workdir) / f"console-{args.size}-{result['backend']}.json"
    out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
