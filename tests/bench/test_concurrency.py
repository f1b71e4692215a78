"""bench/concurrency.py on a tiny world: each variant runs its recalls in child processes of
its own, the pinned one on one core, the two-process one split over two."""
from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import pytest

from bench import concurrency
from bench.world import SkewShape, build

pytestmark = pytest.mark.sqlite_only("the benchmark of SQLite's concurrent recalls")
ROOT = Path(concurrency.__file__).resolve().parent.parent


async def test_concurrency_variants_run_in_their_own_processes(tmp_path):
    shape = SkewShape(600, users=40, channels=12, guilds=3, vocab=2000)
    path = tmp_path / "world.db"
    await build(path, shape)
    for name in ("x20_one_core", "x20_two_processes"):
        m = concurrency.measure(path, shape, name, recalls=24)
        assert m["n"] == 24 and 0 < m["p50"] <= m["p95"]
        assert m["recalls_per_s"] > 0 and m["cpu_ms_per_recall"] > 0
        assert m["processes"] == (2 if name == "x20_two_processes" else 1)
        # two processes run as two shard processes would: one read thread each, SQLite's default for them
        assert m["readers"] == ([1] if name == "x20_two_processes" else [2])
        if name == "x20_one_core" or len(os.sched_getaffinity(0)) == 1:
            assert m["cores_used"] <= 1.05  # pinned: its threads inherit the one core


def test_configurations_set_settings_and_the_bot_package_a_child_runs(tmp_path):
    """`--configs`: a setting reaches the child's engine, `tree=` its bot package, and the busy
    channel's writes are timed beside the recalls."""
    assert concurrency.parse_configs("") == {"": {}}
    assert concurrency.parse_configs("MUNINN_DB_READERS=1;MUNINN_DB_READERS=3,MUNINN_VECTOR_CODES_MIN=0") == {
        "MUNINN_DB_READERS=1": {"MUNINN_DB_READERS": "1"},
        "MUNINN_DB_READERS=3,MUNINN_VECTOR_CODES_MIN=0": {"MUNINN_DB_READERS": "3", "MUNINN_VECTOR_CODES_MIN": "0"}}
    with pytest.raises(SystemExit):
        concurrency.parse_configs("READERS=1")
    with pytest.raises(SystemExit):
        concurrency.parse_configs(f"tree={tmp_path}")  # no bot package there
    tree = tmp_path / "tree"
    shutil.copytree(ROOT / "bot", tree / "bot",
                    ignore=shutil.ignore_patterns("__pycache__"))
    assert concurrency.parse_configs(f"tree={tree}") == {f"tree={tree}": {"tree": str(tree)}}
    shape = SkewShape(600, users=40, channels=12, guilds=3, vocab=2000)
    path = tmp_path / "world.db"
    asyncio.run(build(path, shape))
    here = concurrency.measure(path, shape, "x20", recalls=24, env={"MUNINN_DB_READERS": "1"})
    there = concurrency.measure(path, shape, "x20", recalls=24, env={"tree": str(tree)})
    assert here["bot"] == [str(ROOT)] and there["bot"] == [str(tree)]
    assert here["readers"] == [1] and there["readers"] == [2]  # SQLite's default
    assert here["read_jobs_per_recall"] == 1  # a given vector: the keyword and search steps in one job
    for m in (here, there):
        assert m["n"] == 24 and 0 < m["write_p50"] <= m["write_p95"]
