"""Scaling out, measured as ratios in one run (2 shared cores: absolute numbers drift).

  hosts    replies/s through OllamaHosts over 1, 2, 3 fake Ollama servers that each take
           `--reply-ms` per reply and OLLAMA_MAX_CONCURRENCY=2 (the GPU is the bottleneck
           being modelled, so the ideal is 1x, 2x, 3x)
  writers  memories stored per second by 1 and by 2 writer processes on one SQLite file
           (keyword-only, no Ollama: the database is what is measured; SQLite has one
           writer at a time, so the ideal is ~1x, not 2x: that is what PostgreSQL is for)

    python -m bench.scale [--replies 48] [--reply-ms 100] [--writes 400]
"""
from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import tempfile
import time
from contextlib import AsyncExitStack
from pathlib import Path

from bot.llm.ollama import OllamaHosts
from bot.memory import records
from tests.fakes.ollama import FakeOllama


async def replies_per_second(hosts: int, replies: int, reply_ms: float) -> float:
    async with AsyncExitStack() as stack:
        fakes = [await stack.enter_async_context(FakeOllama()) for _ in range(hosts)]
        for fake in fakes:
            fake.mode, fake.delay = "slow", reply_ms / 1000
        async with OllamaHosts([f.url for f in fakes], chat_timeout=60, retries=0, concurrency=2) as client:
            started = time.perf_counter()
            await asyncio.gather(*(client.chat([{"role": "user", "content": str(n)}]) for n in range(replies)))
            return replies / (time.perf_counter() - started)


def _write(path: str, count: int, start: multiprocessing.synchronize.Event, offset: int) -> None:
    from bot.memory.sql import store
    from bot.memory.sqlite import db
    conn = db.connect(path)
    start.wait()
    for n in range(count):
        with db.write_transaction(conn):
            store.insert_many(conn, [records.NewMemory(f"writer {offset} fact number {n} about ravens", "global")],
                              base_stability_days=7.0)
    conn.close()


def writes_per_second(processes: int, writes: int) -> float:
    """Each process stores `writes` memories, one transaction each; the total rate."""
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "scale.db")
        from bot.memory.sqlite import db
        db.connect(path).close()
        context = multiprocessing.get_context("spawn")
        start = context.Event()
        workers = [context.Process(target=_write, args=(path, writes, start, i)) for i in range(processes)]
        for worker in workers:
            worker.start()
        time.sleep(1.5)  # let every worker import and open the file before the clock starts
        started = time.perf_counter()
        start.set()
        for worker in workers:
            worker.join()
            if worker.exitcode != 0:
                raise RuntimeError(f"a writer process failed (exit {worker.exitcode})")
        return processes * writes / (time.perf_counter() - started)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replies", type=int, default=48)
    parser.add_argument("--reply-ms", type=float, default=100.0)
    parser.add_argument("--writes", type=int, default=400)
    args = parser.parse_args(argv)
    rates = {n: asyncio.run(replies_per_second(n, args.replies, args.reply_ms)) for n in (1, 2, 3)}
    print("| Ollama hosts | replies/s | vs one host |\n|---|---|---|")
    for n, rate in rates.items():
        print(f"| {n} | {rate:.1f} | {rate / rates[1]:.2f}x |")
    writes = {n: writes_per_second(n, args.writes) for n in (1, 2)}
    print("\n| writer processes | memories stored/s | vs one |\n|---|---|---|")
    for n, rate in writes.items():
        print(f"| {n} | {rate:.0f} | {rate / writes[1]:.2f}x |")


if __name__ == "__main__":
    main()
