"""bench/pg_index_plan.py on a tiny world and the embedded server: the plan table, and blocks of
both arms with the index switch between them and every recall recorded."""
from __future__ import annotations

from bench import pg_index_plan
from bench.world import VIEWER_CLASSES, SkewShape, build
from bot.memory import vector_indexes
from bot.memory.postgres.copy import copy_database


async def test_blocks_of_both_arms_are_recorded_and_the_shipped_share_restored(tmp_path, postgres_url, monkeypatch):
    shape = SkewShape(400, users=20, channels=8, guilds=2, vocab=1000)
    path = tmp_path / "skew.db"
    await build(path, shape)
    assert copy_database(path, postgres_url).ok
    monkeypatch.setattr("bench.pg_index_plan.SkewShape", lambda size: shape)
    monkeypatch.setenv("MUNINN_VECTOR_INDEX_MIN", "100")
    shipped = vector_indexes.HELD_SHARE
    only = await pg_index_plan.run(postgres_url, 400, 0.25, ["A", "B"], 2, 5.0, plan_only=True,
                                   workdir=str(tmp_path))
    assert only["plan"] == [] and only["recalls"] == []  # no key of 1,000 vectors; nothing run
    out = await pg_index_plan.run(postgres_url, 400, 0.25, ["A", "B", "B"], 2, 5.0, plan_only=False,
                                  workdir=str(tmp_path))
    assert [b["to"] for b in out["builds"]] == ["A", "B"]  # the plan made when the arm changes
    assert vector_indexes.HELD_SHARE == shipped  # the product's share again after B's blocks
    for block, arm in enumerate(["A", "B", "B"]):
        mine = [r for r in out["recalls"] if r["block"] == block]
        assert {r["arm"] for r in mine} == {arm}
        assert sorted((r["kind"], r["mode"]) for r in mine) == sorted(
            (kind, mode) for kind in VIEWER_CLASSES for mode in ("given", "late"))
    assert all(r["after"] >= 0 and set(r) >= {"exact", "walk", "load"} for r in out["recalls"])
