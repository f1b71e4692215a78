"""A tiny run of bench/overlap.py: recall idle and while another process stores facts, both measured."""
from __future__ import annotations

import time

import apsw

from bench import overlap, speed
from bench.world import DIM, SkewShape, build


async def test_recall_is_measured_idle_and_while_another_process_writes(tmp_path):
    shape = SkewShape(600, users=40, channels=12, guilds=3, vocab=2000)
    path = tmp_path / "skew.db"
    await build(path, shape)
    started = time.time()
    with speed.EmbedServerProcess("hash", dim=DIM) as url:
        result = await overlap.measure(overlap._env(path, "", url), shape, rounds=2, recalls=3)
    assert result["idle"]["n"] == result["writing"]["n"] == 6
    assert 0 < result["idle"]["p50"] <= result["idle"]["p95"] and result["p95_ratio"] > 0
    assert result["facts_written"] >= 2  # each writing phase began only once a fact was stored
    conn = apsw.Connection(str(path))
    try:  # the writer's facts are in the file the recalls read
        assert conn.execute("SELECT count(*) FROM memories").fetchall()[0][0] >= 600 + result["facts_written"]
        # ...and some in the busy channel the recalls' viewers read (not only the writer's own keys)
        assert conn.execute("SELECT count(*) FROM memories WHERE channel_id = 100000 AND owner_id >= 1077 "
                            "AND created_at > ?", (started,)).fetchall()[0][0] >= 1
    finally:
        conn.close()
