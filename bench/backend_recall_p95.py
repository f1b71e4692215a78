"""Recall latency on both storage backends, same data, same queries (a quick check, not the
speed benchmark): N memories (default 10k) with random 384-dim vectors spread over 40 rooms,
200 people's personal keys and the global key; then Q hybrid recalls (keyword + vector, the
query vector given, so no model runs) from viewers in rooms. Prints p50/p95 per backend and
their ratio, measured in one run. PostgreSQL is the embedded test server (tests/postgres_server.py).

    python -m bench.backend_recall_p95 [--memories 10000] [--queries 200]
"""
from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from bot.memory.engine import Engine
from bot.memory.scope import Viewer
from bot.memory.store import NewMemory
from bot.settings import load_settings

DIM = 384
ROOMS = 40
PEOPLE = 200
WORDS = [f"w{i:04d}" for i in range(3000)]


def world(n: int, seed: int = 7) -> tuple[list[NewMemory], np.ndarray]:
    rng = random.Random(seed)
    memories = []
    for _ in range(n):
        text = " ".join(rng.choice(WORDS) for _ in range(12))
        kind = rng.random()
        room = 1000 + rng.randrange(ROOMS)
        if kind < 0.5:
            memories.append(NewMemory(text, "room", owner_id=rng.randrange(PEOPLE) + 1, channel_id=room, guild_id=9))
        elif kind < 0.9:
            memories.append(NewMemory(text, "personal", owner_id=rng.randrange(PEOPLE) + 1, channel_id=room, guild_id=9))
        else:
            memories.append(NewMemory(text, "global"))
    vecs = np.random.default_rng(seed).standard_normal((n, DIM)).astype(np.float32)
    return memories, vecs


async def measure(settings_env: dict[str, str], memories: list[NewMemory], vecs: np.ndarray,
                  queries: int) -> list[float]:
    settings = load_settings({**settings_env, "OLLAMA_URL": "", "MUNINN_MAINTENANCE_HOURS": "0"}, dotenv=False)
    async with Engine(settings) as engine:
        for start in range(0, len(memories), 500):
            await engine.write(engine.storage.insert, memories[start:start + 500], base_stability_days=7.0,
                               model=settings.embed_model, vecs=vecs[start:start + 500].tolist(), now=None)
        await engine.warmed()
        rng = random.Random(11)
        qvecs = np.random.default_rng(11).standard_normal((queries, DIM)).astype(np.float32)
        times = []
        for i in range(queries):
            viewer = Viewer(rng.randrange(PEOPLE) + 1, 1000 + rng.randrange(ROOMS), 9)
            query = " ".join(rng.choice(WORDS) for _ in range(4))
            started = time.perf_counter()
            result = await engine.recall(query, viewer, query_vector=qvecs[i].tolist())
            times.append((time.perf_counter() - started) * 1000)
            assert result.mode == "hybrid" or result.mode == "vector-only"
    return times


def summary(times: list[float]) -> tuple[float, float]:
    ordered = sorted(times)
    return statistics.median(ordered), ordered[int(0.95 * (len(ordered) - 1))]


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--memories", type=int, default=10_000)
    parser.add_argument("--queries", type=int, default=200)
    args = parser.parse_args()
    memories, vecs = world(args.memories)
    from tests.postgres_server import EmbeddedPostgres
    with tempfile.TemporaryDirectory() as tmp, EmbeddedPostgres() as server:
        sqlite = await measure({"MUNINN_DB_PATH": str(Path(tmp) / "bench.db")}, memories, vecs, args.queries)
        url = server.create_database("bench")
        pg = await measure({"MUNINN_DB_PATH": str(Path(tmp) / "unused.db"), "MUNINN_DATABASE_URL": url},
                           memories, vecs, args.queries)
    (s50, s95), (p50, p95) = summary(sqlite), summary(pg)
    print(f"{args.memories} memories, {args.queries} hybrid recalls (ms)")
    print(f"  sqlite      p50 {s50:6.2f}  p95 {s95:6.2f}")
    print(f"  postgresql  p50 {p50:6.2f}  p95 {p95:6.2f}")
    print(f"  ratio pg/sqlite  p50 {p50 / s50:.2f}x  p95 {p95 / s95:.2f}x")


if __name__ == "__main__":
    asyncio.run(main())
