"""bench/pg_beside.py on a tiny world and the embedded server: each mode's class recalls and
recalls in flight measured, the modes switched on the one engine."""
from __future__ import annotations

import argparse
import asyncio
import json

from bench import ann, pg_beside
from bench.world import SkewShape, build


def test_each_mode_is_measured_per_class_and_in_flight(tmp_path, postgres_url, monkeypatch):
    shape = SkewShape(400, users=20, channels=8, guilds=2, vocab=1000)
    path = tmp_path / "skew-400-t.db"
    asyncio.run(build(path, shape))
    server = postgres_url.rsplit("/", 1)[0] + "/postgres"
    monkeypatch.setattr("bench.ann.SkewShape", lambda size: shape)
    monkeypatch.setattr("bench.pg_beside.SkewShape", lambda size: shape)
    ann.world_on_postgres(argparse.Namespace(world=str(path), database_url=server, size=400, min=100, build_mb=0,
                                             queries=1, viewers=1, out=str(tmp_path / "ann.json"), classes_only=False,
                                             embed_delay_ms=0.0))
    out = tmp_path / "beside.json"
    url = server.rsplit("/", 1)[0] + f"/{server.rsplit('/', 1)[1]}_ann_400"
    monkeypatch.setattr("sys.argv", ["pg_beside", "--database-url", url, "--world", str(path), "--size", "400",
                                     "--modes", "one,beside,beside100", "--viewers", "2", "--rounds", "1",
                                     "--batches", "1", "--out", str(out)])
    pg_beside.main()
    assert ann.ann.EF_SEARCH == pg_beside.SHIPPED_EF  # the shipped breadth back for whatever runs next
    report = json.loads(out.read_text())["report"]
    assert set(report) == {"one", "beside", "beside100"}
    for mode in report.values():
        assert mode["busy"]["total"]["n"] == 2 and mode["in_flight"]["total"]["n"] == pg_beside.IN_FLIGHT
