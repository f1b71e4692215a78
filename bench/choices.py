"""How fast the memory id suggestions of `/memory forget` and `/memory why` answer (engine.own_choices).

    .venv/bin/python -m bench.choices                          # SQLite, a heavy user among 100k memories
    .venv/bin/python -m bench.choices --backend postgresql     # an embedded PostgreSQL (tests/postgres_server.py)
    .venv/bin/python -m bench.choices --size 20000 --own 5000 --rounds 50

A world of `--size` memories (no vectors: the suggestions never embed) in which one person owns
`--own` of them in one server (personal, and room memories of one channel) and everyone else the
rest. Each round times the suggestions for that person as they type: nothing, a word in most of
their memories, a rare word, a word nobody wrote, and a number; and for a person with no memory.
Discord drops an autocomplete not answered within 3 s; prints p50/p95/max in ms per case as JSON.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import time
from pathlib import Path

from bot.memory.engine import Engine
from bot.memory.records import NewMemory
from bot.memory.scope import Viewer
from bot.settings import Settings, load_settings

HEAVY, GUILD, CHANNEL = 4242, 7, 70
WORDS = ("cello", "garden", "quiz", "raven", "bicycle", "tea", "mountain", "library", "piano", "harbour")


def settings_for(path: Path, database_url: str) -> Settings:
    """An engine without Ollama (keyword recall only, no vectors) on the file or database given."""
    return load_settings({"MUNINN_DB_PATH": str(path), "MUNINN_DATABASE_URL": database_url, "OLLAMA_URL": "",
                          "MUNINN_MAINTENANCE_HOURS": "0"})


def memories(size: int, own: int, seed: int) -> list[NewMemory]:
    """`own` memories of the heavy user (one in a thousand says "zeppelin"), the rest everyone else's."""
    rng = random.Random(seed)
    made = []
    for n in range(size):
        words = " ".join(rng.choice(WORDS) for _ in range(6))
        if n < own:
            rare = " zeppelin" if n % 1000 == 0 else ""
            scope = "room" if n % 10 == 0 else "personal"
            made.append(NewMemory(f"Heavy likes {words}{rare} #{n}", scope, HEAVY, CHANNEL, GUILD))
        else:
            user = 10_000 + n % 5_000
            made.append(NewMemory(f"User {user} likes {words} #{n}", "personal", user, 100 + n % 300, 1 + n % 50))
    rng.shuffle(made)
    return made


async def fill(engine: Engine, size: int, own: int, seed: int) -> None:
    """Store the world in batches of a thousand."""
    world = memories(size, own, seed)
    for start in range(0, len(world), 1000):
        await engine.remember_many(world[start:start + 1000])


async def measure(engine: Engine, rounds: int) -> dict[str, dict[str, float]]:
    """p50/p95/max ms of the suggestions per case, over `rounds` rounds."""
    heavy = Viewer(user_id=HEAVY, channel_id=CHANNEL, guild_id=GUILD)
    nobody = Viewer(user_id=99, channel_id=CHANNEL, guild_id=GUILD)
    cases = {"nothing typed": (heavy, ""), "common word": (heavy, "cello"), "rare word": (heavy, "zeppelin"),
             "no match": (heavy, "xylophone"), "a number": (heavy, "12"), "no memories": (nobody, "cello")}
    times: dict[str, list[float]] = {case: [] for case in cases}
    for _ in range(rounds):
        for case, (viewer, typed) in cases.items():
            start = time.perf_counter()
            await engine.own_choices(viewer, typed)
            times[case].append((time.perf_counter() - start) * 1000)

    def summary(values: list[float]) -> dict[str, float]:
        ordered = sorted(values)
        return {"p50": round(ordered[len(ordered) // 2], 2), "p95": round(ordered[int(len(ordered) * 0.95)], 2),
                "max": round(ordered[-1], 2)}
    return {case: summary(values) for case, values in times.items()}


async def run(args: argparse.Namespace, database_url: str, folder: Path) -> dict:
    """Build the world, then time it."""
    async with Engine(settings_for(folder / "choices.db", database_url)) as engine:
        started = time.perf_counter()
        await fill(engine, args.size, args.own, args.seed)
        built = time.perf_counter() - started
        return {"backend": args.backend, "size": args.size, "own": args.own, "rounds": args.rounds,
                "build_s": round(built, 1), "ms": await measure(engine, args.rounds)}


def main() -> None:
    """The command line (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="bench.choices", description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("sqlite", "postgresql"), default="sqlite")
    parser.add_argument("--size", type=int, default=100_000)
    parser.add_argument("--own", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        if args.backend == "sqlite":
            result = asyncio.run(run(args, "", folder))
        else:
            from tests.postgres_server import EmbeddedPostgres
            with EmbeddedPostgres() as server:
                result = asyncio.run(run(args, server.create_database("choices"), folder))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
