"""bench/concurrency.py on a tiny world: each variant runs its recalls in child processes of
its own, the pinned one on one core, the two-process one split over two."""
from __future__ import annotations

import os

import pytest

from bench import concurrency
from bench.world import SkewShape, build

pytestmark = pytest.mark.sqlite_only("the benchmark of SQLite's concurrent recalls")


async def test_concurrency_variants_run_in_their_own_processes(tmp_path):
    shape = SkewShape(600, users=40, channels=12, guilds=3, vocab=2000)
    path = tmp_path / "world.db"
    await build(path, shape)
    for name in ("x20_one_core", "x20_two_processes"):
        m = concurrency.measure(path, shape, name, recalls=24)
        assert m["n"] == 24 and 0 < m["p50"] <= m["p95"]
        assert m["recalls_per_s"] > 0 and m["cpu_ms_per_recall"] > 0
        assert m["processes"] == (2 if name == "x20_two_processes" else 1)
        if name == "x20_one_core" or len(os.sched_getaffinity(0)) == 1:
            assert m["cores_used"] <= 1.05  # pinned: its threads inherit the one core
