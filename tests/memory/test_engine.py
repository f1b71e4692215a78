"""The engine loads the vector cache in the background at start (largest keys first, within
the budget, never evicting), so recalls do not pay cold loads; searches stay exact."""
from __future__ import annotations

import threading

import numpy as np

from bot.memory.engine import Engine
from bot.memory.scope import Viewer
from bot.memory.sqlite import db
from bot.memory.sqlite import vec0 as vectors
from bot.memory.vectors.cache import VectorCache
from tests.memory.vectors.test_cache import DIM, KEYS, fill, random_unit, same


async def test_start_warms_every_key_and_recall_stays_exact(make_settings):
    settings = make_settings("", OLLAMA_EMBED_MODEL="m")
    conn = db.connect(settings.db_path)
    rng = np.random.default_rng(21)
    info = fill(conn, rng, 120)
    conn.close()
    async with Engine(settings) as engine:
        assert await engine.warmed() == len(KEYS)
        assert set(engine.vector_cache.cached_keys()) == set(KEYS)
        q = random_unit(rng)
        result = await engine.recall("memory", Viewer(user_id=7, channel_id=1, guild_id=1), query_vector=q,
                                     touch=False)
        assert result.ids
        plain = db.connect(settings.db_path)
        keys = ["g", "r:1", "p:7:dm", "p:7:1"]
        assert same(await engine.read(lambda c: vectors.knn(c, info, q, keys, 6)),
                    vectors.knn_vec0(plain, info, q, keys, 6))
        plain.close()


def test_warm_fits_the_budget_without_evicting_and_stops_when_asked(tmp_path):
    conn = db.connect(tmp_path / "v.db")
    info = fill(conn, np.random.default_rng(22), 90)
    counts = dict(conn.execute("SELECT vis_key, count(*) FROM memories GROUP BY vis_key"))
    # room for ~25 vectors: not for r:1 (a third of all, 30+)
    small = VectorCache(DIM * 4 * 25, source=vectors.SQLiteVectorSource())
    vectors.attach_cache(conn, small)
    loaded = small.warm(conn, info)
    assert 0 < loaded < len(KEYS) and "r:1" not in small.cached_keys()
    assert small.nbytes <= small.budget_bytes
    assert all(counts[key] <= 25 for key in small.cached_keys())
    stopped = threading.Event()
    stopped.set()
    assert VectorCache(64 << 20, source=vectors.SQLiteVectorSource()).warm(conn, info, stopped) == 0
    conn.close()


async def test_a_one_shot_engine_does_not_warm(make_settings):
    """The command line opens `Engine(warm=False)`: `muninn recall` loads only the keys it searches."""
    settings = make_settings("", OLLAMA_EMBED_MODEL="m")
    conn = db.connect(settings.db_path)
    fill(conn, np.random.default_rng(23), 60)
    conn.close()
    async with Engine(settings, warm=False) as engine:
        assert await engine.warmed() == 0
        assert list(engine.vector_cache.cached_keys()) == []
