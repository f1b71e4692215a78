"""bench/speed.py --database-url: the side-by-side path on a tiny world and the embedded server."""
from __future__ import annotations

from bench import pg_speed
from bench.world import VIEWER_CLASSES, SkewShape, build
from bot.memory.postgres.copy import copy_database
from tests.fakes.ollama import FakeOllamaThread


async def test_side_by_side_recall_and_writer_processes(tmp_path, postgres_url):
    shape = SkewShape(300, users=20, channels=8, guilds=2, vocab=1000)
    path = tmp_path / "skew.db"
    await build(path, shape)
    assert copy_database(path, postgres_url).ok
    for url in ("", postgres_url):
        classes = await pg_speed.measure_recall(pg_speed.settings_for(path, url), shape, per_class=3, warm=1)
        assert set(classes) == set(VIEWER_CLASSES)
        assert all(c["total"]["n"] == 3 and c["total"]["median"] > 0 for c in classes.values())
    with FakeOllamaThread() as ollama:  # in its own thread: measure_writers blocks this event loop
        env = {"MUNINN_DB_PATH": str(path), "MUNINN_DATABASE_URL": postgres_url, "OLLAMA_URL": ollama.url,
               "OLLAMA_COOLDOWN": "0", "MUNINN_MAINTENANCE_HOURS": "0"}
        result = pg_speed.measure_writers(env, writers=2, per_writer=3)
        assert result["facts"] == 6 and result["facts_per_s"] > 0
        before = shared_rows(postgres_url)
        shared = pg_speed.measure_writers(env, writers=2, per_writer=3, mode="shared")
    assert shared["facts"] == 6 and shared["facts_per_s"] > 0
    # both processes wrote into the busy channel and about the same users (each fact new or a repeat)
    after = shared_rows(postgres_url)
    assert after.get("room", 0) > before.get("room", 0) and after.get("personal", 0) > before.get("personal", 0)


async def test_a_late_vector_waits_as_the_embedding_would_and_searches_after_it(tmp_path, postgres_url):
    # --embed-delay-ms: the recall embeds (no vector given), the answer comes that late; the
    # vector's search runs after it, and `after_vector` is the recall's time past the wait
    shape = SkewShape(300, users=20, channels=8, guilds=2, vocab=1000)
    path = tmp_path / "skew.db"
    await build(path, shape)
    assert copy_database(path, postgres_url).ok
    classes = await pg_speed.measure_recall(pg_speed.settings_for(path, postgres_url), shape, per_class=3, warm=1,
                                            embed_delay_ms=60)
    for c in classes.values():
        assert c["total"]["n"] == 3 and c["total"]["median"] >= 60
        assert abs(c["after_vector"]["median"] - (c["total"]["median"] - 60)) < 0.01
        assert c["vector"]["median"] > 0


def test_shared_writer_facts_meet_in_the_same_keys():
    one, other = (pg_speed.writer_facts("shared", 6, seed) for seed in (10, 11))
    keys = {fact.to_new_memory().vis_key for fact in one}
    assert keys == {fact.to_new_memory().vis_key for fact in other} and len(keys) == 4  # the channel + 3 users
    assert {fact.to_new_memory().vis_key for fact in pg_speed.writer_facts("own", 3, 10)}.isdisjoint(
        fact.to_new_memory().vis_key for fact in pg_speed.writer_facts("own", 3, 11))


def shared_rows(url: str) -> dict[str, int]:
    import psycopg
    with psycopg.connect(url) as conn:
        return dict(conn.execute("SELECT scope, count(*) FROM memories WHERE channel_id = %s AND owner_id = ANY(%s) "
                                 "GROUP BY scope", (pg_speed.BUSY_CHANNEL, list(pg_speed.SHARED_USERS))).fetchall())


def test_write_profile_splits_a_fact_and_its_transaction_is_four_round_trips(postgres_url):
    """bench/pg_write_profile.py (in its own process: it instruments the engine's classes): one
    writer's facts; the write transaction is BEGIN, the locks with the checks after them, the
    memory with its vector, COMMIT (13 round trips before issue 13's writers round)."""
    import json
    import subprocess
    import sys
    from pathlib import Path
    code = ("import json; from bench.pg_write_profile import run; "
            f"print('JSON', json.dumps(run({postgres_url!r}, 3, 'shared', 1, False)))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("JSON"))[5:])
    assert out["facts"] == 3 and out["facts_per_s"] > 0 and out["write_trips"] == 4.0
    assert out["lock_held"] > 0 and out["plan_trips"] >= 1 and out["server_cpu_ms"] is not None


def test_the_keyword_score_bench_times_both_scores(postgres_server):
    from bench import pg_keyword_score
    out = pg_keyword_score.measure(postgres_server.create_database("keyword_score_test"), 300, 2)
    assert set(out) == {"ts_rank_cd", "bm25"}
    assert all(0 < t["p50"] <= t["p95"] for t in out.values())
