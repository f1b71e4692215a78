"""The keyword step alone, this code against another commit's, query by query (issue 12).

    .venv/bin/python -m bench.keyword_ab --base-commit 204f79c --size 100000

The step as `recall.steps.keyword_step` runs it (visibility keys, `fts_candidates`, the name re-rank) on
a read connection, per viewer class of `bench.speed`'s skewed world. Each side gets its own copy
of the saved world, fresh each run and removed after it (the other commit may predate a
migration this code applies; the saved world is never written), and before each side's query the busy channel stores the
same new memory in both copies, as `bench.speed` does: every query starts with the reader's page
cache emptied by a write, as in a live community. The two sides alternate which goes first.
Prints thread CPU and wall time, ms p50 / p95, and how many queries found the same ids.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import apsw

from bench.recall_cpu import base_package
from bench.trees import memory_module
from bench.world import RESULTS, VIEWER_CLASSES, SkewShape, SkewWorld, summary
from bot.memory.sqlite import db

BUSY_CHANNEL = 100_000


def world_copy(world: Path, side: str) -> Path:
    """A fresh copy of `world` for one side, made through SQLite's backup (WAL and all). Both
    sides write into their copy (the busy channel talks, without vectors): the saved world is
    never changed, and every run starts both sides from the same state."""
    copy = world.with_name(f"{world.stem}-ab-{side}{world.suffix}")
    remove_copy(copy)
    source = apsw.Connection(str(world), flags=apsw.SQLITE_OPEN_READONLY)
    target = apsw.Connection(str(copy))
    with target.backup("main", source, "main") as backup:
        backup.step()
    target.close()
    source.close()
    return copy


def remove_copy(copy: Path) -> None:
    for path in (copy, Path(f"{copy}-wal"), Path(f"{copy}-shm")):
        path.unlink(missing_ok=True)


class Side:
    """One commit's keyword step on its own copy of the world."""

    def __init__(self, package: str, path: Path) -> None:
        if package == "bot":
            db.connect(path).close()  # this code's migrations
        self.reader = apsw.Connection(str(path))
        self.reader.execute("PRAGMA mmap_size = 0")  # as the engine's readers (sqlite_backend.open_reader)
        self.reader.execute("PRAGMA query_only = 1")
        self.writer = apsw.Connection(str(path))
        self.writer.set_busy_timeout(5000)
        self.mod = {name: memory_module(package, name)
                    for name in ("retrieval", "subqueries", "scope")}
        # the keyword path moved from retrieval.py to SQLite's own recall_sql.py
        self.fts_candidates = getattr(self.mod["retrieval"], "fts_candidates", None) or memory_module(
            package, "sqlite.recall_sql").fts_candidates

    def said_in_busy_channel(self, text: str) -> None:
        now = time.time()
        with self.writer:
            self.writer.execute(
                "INSERT INTO memories (text, scope, owner_id, channel_id, guild_id, vis_key, stability, created_at, "
                "updated_at) VALUES (?, 'room', 1000, ?, 1, ?, 7, ?, ?)",
                (text, BUSY_CHANNEL, f"r:{BUSY_CHANNEL}", now, now))

    def keyword_step(self, text: str, viewer: Any, limit: int) -> list[int]:
        scope = self.mod["scope"]
        keys = scope.visible_keys(self.reader, scope.Viewer(viewer.user_id, channel_id=viewer.channel_id,
                                                            guild_id=viewer.guild_id, dm=viewer.dm))
        hits = self.fts_candidates(self.reader, text, keys, limit, None)
        named = self.mod["subqueries"].name_hits(self.reader, text, hits)
        return [h.memory_id for h in self.mod["subqueries"].fuse_keyword_lists(hits, named, limit)]


def run(args: argparse.Namespace) -> dict:
    world = Path(args.workdir) / f"skew-{args.size}-{args.label}.db"
    if not world.exists():
        raise SystemExit(f"no world at {world}: build it with `python -m bench.speed --sizes {args.size}` first")
    copies = {"base": world_copy(world, "base"), "new": world_copy(world, "new")}
    try:
        return _compare(args, {"base": Side(base_package(args.base_commit), copies["base"]),
                               "new": Side("bot", copies["new"])})
    finally:
        for copy in copies.values():
            remove_copy(copy)


def _compare(args: argparse.Namespace, sides: dict[str, "Side"]) -> dict:
    queries = SkewWorld(SkewShape(args.size), seed=99)
    chatter = SkewWorld(SkewShape(args.size), seed=7_777)
    out: dict = {"size": args.size, "base_commit": args.base_commit, "classes": {}}
    for kind in VIEWER_CLASSES:
        cpu: dict[str, list[float]] = {name: [] for name in sides}
        wall: dict[str, list[float]] = {name: [] for name in sides}
        same = 0
        for i in range(args.per_class + args.warm):
            viewer, (text, _) = queries.viewer_of(kind), queries.query()
            said = chatter.sentence()
            found = {}
            for name in (("base", "new") if i % 2 == 0 else ("new", "base")):
                side = sides[name]
                side.said_in_busy_channel(said)
                started, thread = time.perf_counter(), time.thread_time()
                found[name] = side.keyword_step(text, viewer, args.limit)
                if i >= args.warm:
                    cpu[name].append((time.thread_time() - thread) * 1000)
                    wall[name].append((time.perf_counter() - started) * 1000)
            if i >= args.warm and found["base"] == found["new"]:
                same += 1
        row = {name: {"cpu": summary(cpu[name]), "wall": summary(wall[name])} for name in sides}
        row["same"] = same
        out["classes"][kind] = row
        print(f"{kind:>12}: cpu " + " -> ".join(f"{row[n]['cpu']['median']:.2f} / {row[n]['cpu']['p95']:.2f}"
                                                 for n in sides)
              + ", wall " + " -> ".join(f"{row[n]['wall']['median']:.2f} / {row[n]['wall']['p95']:.2f}" for n in sides)
              + f" ms (base -> new), same ids {same}/{args.per_class}", flush=True)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="The keyword step, this code against another commit (issue 12)")
    parser.add_argument("--base-commit", required=True)
    parser.add_argument("--size", type=int, default=100000)
    parser.add_argument("--label", default="speed", help="the saved world: skew-<size>-<label>.db")
    parser.add_argument("--per-class", type=int, default=100)
    parser.add_argument("--warm", type=int, default=5)
    parser.add_argument("--limit", type=int, default=30, help="keyword hits asked for (the engine asks 3 x recall limit)")
    parser.add_argument("--workdir", default=str(RESULTS))
    parser.add_argument("--out", default=None, help="JSON file to save")
    args = parser.parse_args(argv)
    out = run(args)
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))
        print(f"saved {args.out}")


if __name__ == "__main__":
    main()
