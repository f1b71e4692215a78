"""bench/tail.py on a tiny world: every class timed and split into CPU and run-queue wait, and
the A/B variants really switch the checkpoints and the freeze."""
from __future__ import annotations

import pytest

from bench import tail
from bench.world import VIEWER_CLASSES, SkewShape, build

pytestmark = pytest.mark.sqlite_only("the benchmark of SQLite's recall tail")


async def test_tail_benchmark_splits_each_recall_and_switches_the_variants(tmp_path, monkeypatch):
    for name in tail.VARIANTS["old"]:
        monkeypatch.setenv(name, "")  # run_block sets them per variant; restored after the test
    shape = SkewShape(600, users=40, channels=12, guilds=3, vocab=2000)
    path = tmp_path / "tail.db"
    await build(path, shape)
    old = await tail.run_block(path, shape, "old", per_class=3, seed=1, warm=1)
    new = await tail.run_block(path, shape, "new", per_class=3, seed=2, warm=1, beside_ms=5)
    for block in (old, new):
        assert set(block.rows) == set(VIEWER_CLASSES)
        assert all(len(rows) == 3 for rows in block.rows.values())
        assert all(r["wall"] > 0 and r["cpu"] > 0 and r["runq"] >= 0 for rows in block.rows.values() for r in rows)
    assert {c["thread"] for c in old.checkpoints} <= {"muninn-db"}
    assert {c["thread"] for c in new.checkpoints} <= {"muninn-vecload"}
    summary = tail.summarise([old])
    assert summary["classes"]["busy"]["n"] == 3 and summary["gc_collect_ms"][0] > 0
