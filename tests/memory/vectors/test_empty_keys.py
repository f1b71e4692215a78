"""After the warm has listed every key with vectors, a key without any is answered without a
load (no SQL), and one that gets its first vector later, from any connection, is loaded then."""
from __future__ import annotations

import numpy as np

from bot.memory.records import NewMemory
from bot.memory.sql import store
from bot.memory.sqlite import db
from bot.memory.sqlite import vec0 as vectors
from bot.memory.vectors.cache import VectorCache

DIM = 8


def unit(rng: np.random.Generator) -> list[float]:
    v = rng.standard_normal(DIM)
    return (v / np.linalg.norm(v)).tolist()


def test_empty_keys_need_no_load_until_a_vector_arrives(tmp_path, monkeypatch):
    rng = np.random.default_rng(31)
    cached, plain = db.connect(tmp_path / "v.db"), db.connect(tmp_path / "v.db")
    cache = VectorCache(64 << 20, source=vectors.SQLiteVectorSource())
    vectors.attach_cache(cached, cache)
    with plain:
        info = vectors.create_index(plain, "m", DIM)
    store.insert_many(plain, [NewMemory(f"g {i}", "global", owner_id=7) for i in range(20)], base_stability_days=7,
                      vector_info=info, vectors_=[unit(rng) for _ in range(20)], now=1000.0)
    loads: list[str] = []
    real = vectors.load_key

    def counting(conn, info_, key):
        loads.append(key)
        return real(conn, info_, key)
    monkeypatch.setattr(vectors, "load_key", counting)
    assert cache.warm(cached, info) == 1 and loads == ["g"]
    q = unit(rng)
    assert len(vectors.knn(cached, info, q, ["g", "p:5:dm", "r:9"], 5)) == 5
    assert loads == ["g"]                                           # the empty keys cost no load
    mine = NewMemory("mine", "personal", owner_id=5)
    assert mine.vis_key == "p:5:dm"
    new_id = store.insert_many(plain, [mine], base_stability_days=7, vector_info=info, vectors_=[q], now=2000.0)[0]
    assert vectors.knn(cached, info, q, ["g", "p:5:dm", "r:9"], 5)[0][0] == new_id  # stored elsewhere, found
    assert loads == ["g", "p:5:dm"]
    cached.close()
    plain.close()


def test_without_a_warm_every_key_is_looked_up(tmp_path, monkeypatch):
    rng = np.random.default_rng(32)
    cached = db.connect(tmp_path / "v.db")
    vectors.attach_cache(cached, VectorCache(64 << 20, source=vectors.SQLiteVectorSource()))
    with cached:
        info = vectors.create_index(cached, "m", DIM)
    loads: list[str] = []
    real = vectors.load_key
    monkeypatch.setattr(vectors, "load_key", lambda conn, i, key: loads.append(key) or real(conn, i, key))
    store.insert_many(cached, [NewMemory("g", "global", owner_id=7)], base_stability_days=7, vector_info=info,
                      vectors_=[unit(rng)], now=1000.0)
    vectors.knn(cached, info, unit(rng), ["g", "r:9"], 3)
    assert sorted(loads) == ["g", "r:9"]
    cached.close()
