"""bench/speed.py --database-url: the side-by-side path on a tiny world and the embedded server."""
from __future__ import annotations

from bench import pg_speed, speed
from bot.cli.migrate import copy_database
from tests.fakes.ollama import FakeOllamaThread


async def test_side_by_side_recall_and_writer_processes(tmp_path, postgres_url):
    shape = speed.SkewShape(300, users=20, channels=8, guilds=2, vocab=1000)
    path = tmp_path / "skew.db"
    await speed.build(path, shape)
    assert copy_database(path, postgres_url).ok
    for url in ("", postgres_url):
        classes = await pg_speed.measure_recall(pg_speed.settings_for(path, url), shape, per_class=3, warm=1)
        assert set(classes) == set(speed.VIEWER_CLASSES)
        assert all(c["total"]["n"] == 3 and c["total"]["median"] > 0 for c in classes.values())
    with FakeOllamaThread() as ollama:  # in its own thread: measure_writers blocks this event loop
        env = {"MUNINN_DB_PATH": str(path), "MUNINN_DATABASE_URL": postgres_url, "OLLAMA_URL": ollama.url,
               "OLLAMA_COOLDOWN": "0", "MUNINN_MAINTENANCE_HOURS": "0"}
        result = pg_speed.measure_writers(env, writers=2, per_writer=3, lead_s=2.0)
    assert result["facts"] == 6 and result["facts_per_s"] > 0
