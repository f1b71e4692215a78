"""PostgreSQL recall, this tree against another commit, interleaved on one server and world.

    .venv/bin/python -m bench.recall_ab --server postgresql://postgres@127.0.0.1:PORT/postgres \\
        --template muninn_bench_100000 --base-commit main [--archive 0.15] [--per-class 40]

The world is a PostgreSQL database that `bench.speed --database-url` copied (`<db>_bench_<size>`).
Each side gets its own copy of it (`CREATE DATABASE ... TEMPLATE`: `<template>_ab_old` for the
other commit's `bot` package, copied out of git as `bot_base` (bench.recall_cpu.base_package),
`<template>_ab_new` for this tree), so each applies its own migrations. `--archive F` archives
the same random share F of the memories in both copies first (as maintenance does: archived_at
set, the vector removed; then VACUUM ANALYZE): real bots archive, and the keyword path's
statistics must hold with archived rows (issue 13). Then, per viewer class, the same viewers and
queries (seed 99) go to both engines (`Engine.recall`, query vector given, touch on), which one
goes first alternating query by query; before each query the busy channel says the same new
sentence in both (bench.speed's `talk`). Prints p50 / p95 of the whole recall and of its
keyword step per side and class, and how many recalls returned the same ids.
"""
from __future__ import annotations

import os

from bench.trees import memory_module

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse
import asyncio
import importlib
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.pg_speed import create_database
from bench.recall_cpu import base_package
from bench.world import EMBED_MODEL, VIEWER_CLASSES, SkewShape, SkewWorld


def archive_share(url: str, share: float, seed: int = 5) -> int:
    """Archive `share` of the active memories (a random pick, the same for the same world and seed)
    as maintenance would (archived_at, reason, embedded = 0, the vector removed), then VACUUM
    ANALYZE, so the statistics have seen them."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        ids = [row[0] for row in conn.execute("SELECT id FROM memories WHERE archived_at IS NULL ORDER BY id")]
        picked = np.random.default_rng(seed).choice(ids, size=int(len(ids) * share), replace=False).tolist()
        with conn.transaction():
            conn.execute("UPDATE memories SET archived_at = extract(epoch FROM now()), archive_reason = 'faded', "
                         "embedded = 0 WHERE id = ANY(%s)", (picked,))
            conn.execute("DELETE FROM memory_vectors WHERE memory_id = ANY(%s)", (picked,))
        conn.execute("VACUUM ANALYZE memories")
        conn.execute("VACUUM ANALYZE memory_vectors")
    return len(picked)


def summary(values: list[float]) -> dict[str, float]:
    return {"p50": round(float(np.median(values)), 2), "p95": round(float(np.percentile(values, 95)), 2)}


class Side:
    """One commit's engine on its own copy of the world."""

    def __init__(self, package: str, url: str) -> None:
        self.package, self.url = package, url
        self.engine: Any = None
        self.chatter = SkewWorld(SkewShape(1000), seed=7_777)  # the same sentences on both sides
        self.ms: dict[str, list[float]] = {}

    async def start(self) -> None:
        settings = importlib.import_module(f"{self.package}.settings").load_settings(
            {"MUNINN_DB_PATH": "/nonexistent/unused.db", "MUNINN_DATABASE_URL": self.url, "OLLAMA_URL": "",
             "OLLAMA_EMBED_MODEL": EMBED_MODEL, "MUNINN_MAINTENANCE_HOURS": "0"})
        self.engine = await importlib.import_module(f"{self.package}.memory.engine").Engine(settings).start()
        await self.engine.warmed()
        self.info = await self.engine.write(lambda conn: self.engine.storage.index_info(conn))
        self.store = memory_module(self.package, "store")
        self.viewer = importlib.import_module(f"{self.package}.memory.scope").Viewer

    async def talk(self) -> None:
        vec = self.chatter.rng.standard_normal(self.info.dim, dtype=np.float32)
        memory = self.store.NewMemory(self.chatter.sentence(), "room", owner_id=1000, channel_id=100_000, guild_id=1)
        await self.engine.write(lambda conn: self.engine.storage.insert(
            conn, [memory], base_stability_days=7.0, model=self.info.model,
            vecs=[(vec / np.linalg.norm(vec)).tolist()], now=None))

    async def recall(self, viewer: Any, text: str, vector: np.ndarray, record: bool) -> list[int]:
        who = self.viewer(viewer.user_id, channel_id=viewer.channel_id, guild_id=viewer.guild_id, dm=viewer.dm)
        result = await self.engine.recall(text, who, query_vector=vector.tolist())
        if record:
            for step in ("total", "fts"):
                self.ms.setdefault(step, []).append(result.timings_ms[step])
        return list(result.ids)


async def run(args: argparse.Namespace) -> dict:
    base = base_package(args.base_commit)
    sides = {}
    for side, package in (("old", base), ("new", "bot")):
        url = create_database(args.server, f"{args.template}_ab_{side}", template=args.template)
        if args.archive:
            print(f"{side}: archived {archive_share(url, args.archive)} memories", flush=True)
        sides[side] = Side(package, url)
    for side in sides.values():
        await side.start()
    world = SkewWorld(SkewShape(args.size), seed=args.seed)
    out: dict = {"base_commit": args.base_commit, "archive": args.archive, "per_class": args.per_class,
                 "load": [round(os.getloadavg()[0], 2)], "classes": {}}
    for kind in VIEWER_CLASSES:
        for side in sides.values():
            side.ms = {}
        same = 0
        for i in range(args.per_class + args.warm):
            viewer = world.viewer_of(kind)
            text, vector = world.query()
            ids = {}
            for name in (("old", "new") if i % 2 == 0 else ("new", "old")):
                await sides[name].talk()
                ids[name] = await sides[name].recall(viewer, text, vector, record=i >= args.warm)
            same += i >= args.warm and ids["old"] == ids["new"]
        row = {name: {step: summary(v) for step, v in side.ms.items()} for name, side in sides.items()}
        row["same"] = f"{same}/{args.per_class}"
        out["classes"][kind] = row
        out["load"].append(round(os.getloadavg()[0], 2))
        print(f"{kind:>11}: total p50/p95 {row['old']['total']['p50']:.1f} / {row['old']['total']['p95']:.1f} -> "
              f"{row['new']['total']['p50']:.1f} / {row['new']['total']['p95']:.1f}; fts "
              f"{row['old']['fts']['p50']:.1f} / {row['old']['fts']['p95']:.1f} -> "
              f"{row['new']['fts']['p50']:.1f} / {row['new']['fts']['p95']:.1f}; same ids {row['same']} "
              f"(load {out['load'][-1]})", flush=True)
    for side in sides.values():
        await side.engine.close()
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", required=True, help="postgresql://... of the server (its maintenance database)")
    parser.add_argument("--template", default="muninn_bench_100000", help="the world's database on that server")
    parser.add_argument("--base-commit", default="main")
    parser.add_argument("--size", type=int, default=100000, help="the world's size (its viewers and queries)")
    parser.add_argument("--archive", type=float, default=0.0, help="share of memories archived first in both copies")
    parser.add_argument("--per-class", type=int, default=40)
    parser.add_argument("--warm", type=int, default=10)
    parser.add_argument("--seed", type=int, default=99)
    parser.add_argument("--out", default=None, help="JSON file to save")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    out = asyncio.run(run(args))
    out["seconds"] = round(time.perf_counter() - started, 1)
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))
        print(f"saved {args.out}")


if __name__ == "__main__":
    main()
