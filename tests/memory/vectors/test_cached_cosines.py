"""Recall's cosines for keyword-only candidates come from the search cache when it holds the
memory, and equal what vec0's vec_distance_cosine gives (also inside an open write, after
other connections' writes, and for ids the cache does not hold)."""
from __future__ import annotations

import numpy as np
import pytest

from bot.memory.records import NewMemory
from bot.memory.sql import queries, store
from bot.memory.sqlite import db
from bot.memory.sqlite import vec0 as vectors
from bot.memory.vectors.cache import VectorCache
from tests.memory.vectors.test_cache import KEYS, fill, random_unit

DIM_ = 16  # top_scores_over's own vectors


def vec0_cosines(conn, info, query, ids) -> dict[int, float]:
    return vectors.cosines(conn, info, query, ids)  # `conn` has no cache: one vec0 lookup each


def close(a: dict[int, float], b: dict[int, float]) -> bool:
    return a.keys() == b.keys() and all(abs(a[k] - b[k]) < 1e-5 for k in a)


def test_cached_cosines_equal_vec0s_and_need_no_lookup(pair):
    cached, plain = pair
    rng = np.random.default_rng(11)
    info = fill(plain, rng, 150)
    q = random_unit(rng)
    vectors.knn(cached, info, q, ["r:1", "g"], 5)  # loads these two keys only
    cache = vectors.cache_of(cached)
    rows = list(plain.execute("SELECT id, vis_key FROM memories ORDER BY id"))
    in_cache = [mid for mid, key in rows if key in ("r:1", "g")]
    assert len(cache.cosines(cached, info, q, in_cache)) == len(in_cache)
    ids = [mid for mid, _ in rows] + [10**9]  # every key, and an id without a vector
    got = vectors.cosines(cached, info, q, ids)
    assert 10**9 not in got
    assert close(got, vec0_cosines(plain, info, q, ids))


def test_cached_cosines_follow_other_writes_and_an_open_transaction(pair):
    cached, plain = pair
    rng = np.random.default_rng(12)
    info = fill(plain, rng, 80)
    q = random_unit(rng)
    vectors.knn(cached, info, q, KEYS, 5)
    target = queries.query_value(plain, "SELECT min(id) FROM memories WHERE vis_key = 'r:1'")
    with plain:
        store.set_vector(plain, info, target, q)  # replaced elsewhere: now exactly the query
    assert vectors.cosines(cached, info, q, [target])[target] == pytest.approx(1.0, abs=1e-5)
    other = queries.query_value(plain, "SELECT max(id) FROM memories WHERE vis_key = 'g'")
    flipped = (-np.asarray(q)).tolist()
    with cached:  # its own uncommitted write is read from vec0, not from the shared cache
        store.set_vector(cached, info, other, flipped)
        assert vectors.cosines(cached, info, q, [other])[other] == pytest.approx(-1.0, abs=1e-5)
        assert other not in vectors.cache_of(cached).cosines(cached, info, q, [other])
    ids = [mid for (mid,) in plain.execute("SELECT id FROM memories")]
    assert close(vectors.cosines(cached, info, q, ids), vec0_cosines(plain, info, q, ids))


def test_a_memory_stored_before_its_key_was_cached_gets_the_same_cosine(tmp_path):
    conn = db.connect(tmp_path / "v.db")
    info = fill(conn, np.random.default_rng(13), 20)
    with conn:
        mid = store.insert_many(conn, [NewMemory("the zebra crossing", "global")], base_stability_days=7,
                                vector_info=info, vectors_=[random_unit(np.random.default_rng(14))])[0]
    expected = vectors.cosines(conn, info, random_unit(np.random.default_rng(15)), [mid])[mid]
    vectors.attach_cache(conn, VectorCache(64 << 20))
    vectors.knn(conn, info, random_unit(np.random.default_rng(15)), ["g"], 3)
    assert vectors.cache_of(conn).cosines(conn, info, random_unit(np.random.default_rng(15)), [mid]) == \
        pytest.approx({mid: expected}, abs=1e-5)
    conn.close()


@pytest.mark.parametrize("form", ["float32", "int8"])
def test_one_selection_over_all_keys_equals_one_per_key(form):
    """vector_cache.top_scores_over (one argpartition over every visible key) picks what
    selecting per key and merging did, with removed rows, an as_of and skipped ids."""
    from bot.memory.vectors.arrays import KeyVectors, top_scores, top_scores_over
    rng = np.random.default_rng(16)
    entries = []
    for size in (0, 3, 40, 7, 120):
        matrix = rng.standard_normal((size, DIM_)).astype(np.float32)
        entry = KeyVectors(np.arange(size, dtype=np.int64) + 1000 * len(entries), rng.uniform(0, 100, size), matrix,
                           form=form)
        for memory_id in entry.ids[:entry.n][::5].tolist():
            entry.discard(int(memory_id))
        entries.append(entry)
    q = rng.standard_normal(DIM_).astype(np.float32)
    for k, as_of, skip in ((5, None, None), (30, 50.0, np.array([4001, 4002, 2011])), (500, 10.0, None)):
        views = [entry.view() for entry in entries]
        per_key = sorted((pair for ids, created, matrix, n, scales in views
                          for pair in top_scores(ids[:n], created[:n], matrix[:n], q, k, as_of, skip,
                                                 None if scales is None else scales[:n])), reverse=True)[:k]
        assert sorted(top_scores_over(views, q, k, as_of, skip), reverse=True)[:k] == per_key

