"""bench/ann.py on a tiny world and the embedded server: the busy key's index made, its recall@10
against the exact scan, the class recalls through it, writes timed with and without."""
from __future__ import annotations

import argparse

from bench import ann
from bench.world import SkewShape, build
from bot.memory.postgres.backend import PostgresStorage
from bot.memory.postgres.copy import copy_database


async def test_a_tiny_world_on_postgresql_with_its_big_keys_indexed(tmp_path, postgres_url):
    shape = SkewShape(400, users=20, channels=8, guilds=2, vocab=1000)
    path = tmp_path / "skew.db"
    await build(path, shape)
    assert copy_database(path, postgres_url).ok
    storage = PostgresStorage(postgres_url)
    conn = storage.open_reader()
    try:
        info = storage.index_info(conn)
        assert ann.timed_writes(storage, info, 2, seed=1)["n"] == 2
        job = ann.planned(conn, 100)  # the busy channel holds 30 %: 120 vectors
    finally:
        storage.close(conn)
    assert job is not None and [key for key, _ in job.plan.create] == ["r:100000"]
    assert ann.carried_out(job, 0) == (1, 0)
    found = ann.recall_at_10(storage, 3)
    assert list(found) == ["r:100000"] and found["r:100000"]["recall_at_10"] >= 0.9  # 120 vectors, a walk of 400
    assert ann.drop_all(storage) == 1


def test_the_world_run_copies_builds_and_measures(tmp_path, postgres_url, monkeypatch):
    import asyncio
    shape = SkewShape(400, users=20, channels=8, guilds=2, vocab=1000)
    path = tmp_path / "skew-400-t.db"
    asyncio.run(build(path, shape))
    server = postgres_url.rsplit("/", 1)[0] + "/postgres"
    out = tmp_path / "ann.json"
    monkeypatch.setattr("bench.ann.SkewShape", lambda size: shape)
    ann.world_on_postgres(argparse.Namespace(world=str(path), database_url=server, size=400, min=100, build_mb=0,
                                             queries=2, viewers=2, out=str(out), classes_only=False,
                                             embed_delay_ms=0.0))
    assert '"classes"' in out.read_text() and '"recall_of_indexed_keys"' in out.read_text()
    ann.world_on_postgres(argparse.Namespace(world=str(path), database_url=server, size=400, min=100, build_mb=0,
                                             queries=2, viewers=2, out=str(out), classes_only=True,
                                             embed_delay_ms=5.0))
    assert '"classes"' in out.read_text() and '"recall_of_indexed_keys"' not in out.read_text()  # loaded: only the recalls
    assert '"classes_late_vector"' in out.read_text()  # and again with the vector known late
