"""Very big keys are searched through clusters (bot/memory/big_keys.py): a recall floor against
the exact search on clustered vectors, exactness below the threshold, and a cache that stays in
step with writes, removals and regrown arrays after its rows were regrouped."""
from __future__ import annotations

import numpy as np
import pytest

from bot.memory import big_keys, db, store, vector_codes, vectors
from bot.memory.engine import Engine
from bot.memory.store import NewMemory
from bot.memory.vector_cache import VectorCache

DIM = 16
BIG, SMALL = "r:1", "g"


def clustered(rng: np.random.Generator, count: int, centres: np.ndarray) -> np.ndarray:
    """Unit vectors around a few centres: embeddings of real text are clustered like this."""
    points = centres[rng.integers(0, len(centres), size=count)] + 0.35 * rng.standard_normal((count, DIM))
    return points / np.linalg.norm(points, axis=1, keepdims=True)


def fill(conn, rng: np.random.Generator, big: int, small: int, centres: np.ndarray) -> vectors.IndexInfo:
    with conn:
        info = vectors.index_info(conn) or vectors.create_index(conn, "m", DIM)
        memories = [NewMemory(f"room {i}", "room", owner_id=7, channel_id=1) for i in range(big)]
        memories += [NewMemory(f"global {i}", "global", owner_id=7) for i in range(small)]
        store.insert_many(conn, memories, base_stability_days=7, vector_info=info,
                          vectors_=clustered(rng, big + small, centres).tolist(), now=1000.0)
    return info


@pytest.fixture
def world(tmp_path, monkeypatch):
    monkeypatch.setattr(big_keys, "ROWS_PER_LIST", 40)  # ~30 lists for 1,200 vectors
    rng = np.random.default_rng(21)
    centres = rng.standard_normal((12, DIM))
    cached, plain = db.connect(tmp_path / "v.db"), db.connect(tmp_path / "v.db")
    cache = VectorCache(64 << 20, approx_min=1000)
    vectors.attach_cache(cached, cache)
    info = fill(plain, rng, 1200, 150, centres)
    yield cached, plain, cache, info, rng, centres
    cached.close()
    plain.close()


def ids_of(hits) -> list[int]:
    return [memory_id for memory_id, _ in hits]


def test_a_big_key_is_searched_through_clusters_above_a_recall_floor(world):
    cached, plain, cache, info, rng, centres = world
    queries = clustered(rng, 40, centres)
    vectors.knn(cached, info, queries[0].tolist(), [BIG, SMALL], 10)  # loads both keys, exact so far
    assert cache.partition_key(BIG) and not cache.partition_key(SMALL)  # the small key stays exact
    recall = []
    for q in queries:
        got = vectors.knn(cached, info, q.tolist(), [BIG, SMALL], 10)
        exact = vectors.knn_vec0(plain, info, q.tolist(), [BIG, SMALL], 10)
        recall.append(len(set(ids_of(got)) & set(ids_of(exact))) / 10)
        found = dict(exact)
        for memory_id, distance in got:  # what it returns is scored exactly
            assert memory_id not in found or abs(found[memory_id] - distance) < 1e-5
        assert ids_of(vectors.knn(cached, info, q.tolist(), [SMALL], 10)) == ids_of(
            vectors.knn_vec0(plain, info, q.tolist(), [SMALL], 10))
    assert np.mean(recall) >= 0.9, recall
    assert cache._keys[BIG].approx is not None


def test_below_the_threshold_or_turned_off_the_search_is_exact(world):
    cached, plain, cache, info, rng, centres = world
    for approx_min in (0, 5000):
        cache.approx_min = approx_min
        for q in clustered(rng, 10, centres):
            assert ids_of(vectors.knn(cached, info, q.tolist(), [BIG, SMALL], 10)) == ids_of(
                vectors.knn_vec0(plain, info, q.tolist(), [BIG, SMALL], 10))
        assert not cache.partition_key(BIG)


def test_regrouped_rows_stay_in_step_with_writes_removals_and_cosines(world):
    cached, plain, cache, info, rng, centres = world
    q = clustered(rng, 1, centres)[0]
    vectors.knn(cached, info, q.tolist(), [BIG], 10)
    assert cache.partition_key(BIG)
    some = [mid for (mid,) in plain.execute("SELECT id FROM memories WHERE vis_key = ? LIMIT 50", (BIG,))]
    exact_cos = {mid: float(np.dot(vectors.vector_of(plain, info, mid), q)) for mid in some}
    assert vectors.cosines(cached, info, q.tolist(), some) == pytest.approx(exact_cos, abs=1e-5)
    nearest = vectors.knn_vec0(plain, info, q.tolist(), [BIG], 1)[0][0]
    store.archive(plain, nearest, "test")                      # removed elsewhere, after the regrouping
    with plain:
        newest = store.insert_many(plain, [NewMemory("new", "room", owner_id=7, channel_id=1)], base_stability_days=7,
                                   vector_info=info, vectors_=[q.tolist()], now=2000.0)[0]
    got = vectors.knn(cached, info, q.tolist(), [BIG], 10)
    assert got[0][0] == newest and got[0][1] == pytest.approx(0.0, abs=1e-3)  # the tail is always read
    assert nearest not in ids_of(got)
    assert all(mid != newest for mid in ids_of(vectors.knn(cached, info, q.tolist(), [BIG], 10, as_of=1500.0)))
    items = [(mid, BIG) for mid in some[:5]]
    batched = vectors.neighbours_many(cached, info, items, 4)
    for memory_id, key in items:
        assert ids_of(batched[memory_id]) == ids_of(vectors.similar_to_memory(plain, info, memory_id, [key], 4))


def test_regrown_arrays_are_searched_exactly_until_the_loader_regroups_them(world):
    cached, plain, cache, info, rng, centres = world
    jobs: list = []
    cache.background = jobs.append
    q = clustered(rng, 1, centres)[0]
    vectors.knn(cached, info, q.tolist(), [BIG], 10)
    assert len(jobs) == 1                                       # big and not grouped yet: queued once
    vectors.knn(cached, info, q.tolist(), [BIG], 10)
    assert len(jobs) == 1
    assert jobs.pop()(plain) and cache._keys[BIG].approx is not None
    entry = cache._keys[BIG]
    entry._regrow(len(entry.ids) + 10)                          # what appends past the spare rows do
    assert entry.approx is None
    for q in clustered(rng, 5, centres):
        assert ids_of(vectors.knn(cached, info, q.tolist(), [BIG], 10)) == ids_of(
            vectors.knn_vec0(plain, info, q.tolist(), [BIG], 10))
    assert len(jobs) == 1 and jobs.pop()(plain) and cache._keys[BIG].approx is not None


def test_a_growing_key_asks_for_its_rebuild_before_appends_regrow_its_arrays(world):
    cached, plain, cache, info, rng, centres = world
    jobs: list = []
    cache.background = jobs.append
    q = clustered(rng, 1, centres)[0]
    vectors.knn(cached, info, q.tolist(), [BIG], 10)
    assert jobs.pop()(plain)
    entry = cache._keys[BIG]
    grouped, indexed = entry.matrix, entry.approx.indexed
    while big_keys.usable(entry.approx, entry.n):              # appends until the tail is stale
        assert not jobs
        with plain:
            store.insert_many(plain, [NewMemory("more", "room", owner_id=7, channel_id=1)], base_stability_days=7,
                              vector_info=info, vectors_=clustered(rng, 1, centres).tolist(), now=3000.0)
        vectors.knn(cached, info, q.tolist(), [BIG], 10)
    assert entry.matrix is grouped and entry.approx is not None  # no regrow dropped the clusters first
    assert len(jobs) == 1 and entry.n - indexed > indexed * big_keys.STALE_TAIL_SHARE
    assert len(entry.ids) - entry.n >= indexed * (big_keys.SPARE_SHARE - big_keys.STALE_TAIL_SHARE) - 1
    assert jobs.pop()(plain) and entry.approx is not None and entry.approx.indexed == entry.n


def test_a_partition_is_void_if_the_arrays_were_regrown_meanwhile(world, monkeypatch):
    cached, plain, cache, info, rng, centres = world
    vectors.knn(cached, info, clustered(rng, 1, centres)[0].tolist(), [BIG], 10)
    entry = cache._keys[BIG]
    real = big_keys.partition

    def regrow_meanwhile(matrix, rows, capacity):
        part = real(matrix, rows, capacity)
        with cache._lock:
            entry._regrow(len(entry.ids) + 10)
        return part
    monkeypatch.setattr(big_keys, "partition", regrow_meanwhile)
    assert not cache.partition_key(BIG) and entry.approx is None


async def test_the_engine_groups_a_big_key_while_it_warms(tmp_path, make_settings, monkeypatch):
    monkeypatch.setattr(big_keys, "ROWS_PER_LIST", 40)
    rng = np.random.default_rng(22)
    centres = rng.standard_normal((12, DIM))
    conn = db.connect(tmp_path / "muninn.db")
    fill(conn, rng, 1200, 20, centres)
    conn.close()
    async with Engine(make_settings(OLLAMA_EMBED_MODEL="m", MUNINN_VECTOR_APPROX_MIN="1000")) as engine:
        assert await engine.warmed() == 2
        assert engine.vector_cache.cached_keys() and engine.vector_cache._keys[BIG].approx is not None
        assert engine.vector_cache._keys[SMALL].approx is None


def test_a_search_as_of_a_past_moment_is_exact_on_a_clustered_key(world):
    """The nearest lists are chosen before the time filter: as of a moment that leaves few rows
    they could hold none of them, so such a search reads the whole key."""
    cached, plain, cache, info, rng, centres = world
    with plain:  # a few memories of the big key, older than the rest
        store.insert_many(plain, [NewMemory(f"old room {i}", "room", owner_id=7, channel_id=1) for i in range(15)],
                          base_stability_days=7, vector_info=info, vectors_=clustered(rng, 15, centres).tolist(),
                          now=500.0)
    vectors.knn(cached, info, clustered(rng, 1, centres)[0].tolist(), [BIG], 10)
    assert cache.partition_key(BIG)
    for q in clustered(rng, 10, centres):
        got = vectors.knn(cached, info, q.tolist(), [BIG], 10, as_of=600.0)
        assert ids_of(got) == ids_of(vectors.knn_vec0(plain, info, q.tolist(), [BIG], 10, as_of=600.0))


def test_changes_made_while_a_key_is_grouped_are_carried_over(world, monkeypatch):
    cached, plain, cache, info, rng, centres = world
    vectors.knn(cached, info, clustered(rng, 1, centres)[0].tolist(), [BIG], 10)
    entry = cache._keys[BIG]
    removed, new_id = int(entry.ids[5]), 10**9
    real = big_keys.partition

    def racing(matrix, rows, capacity):  # a search applies a removal and an append meanwhile
        part = real(matrix, rows, capacity)
        with cache._lock:
            entry.discard(removed)
            entry.add(new_id, 1000.0, clustered(rng, 1, centres)[0].astype(np.float32))
        return part
    monkeypatch.setattr(big_keys, "partition", racing)
    assert cache.partition_key(BIG)
    assert removed not in entry.row_of and entry.ids[entry.row_of[new_id]] == new_id
    live = entry.ids[:entry.n]
    assert entry.row_of == {int(i): row for row, i in enumerate(live.tolist()) if i >= 0}
    assert entry.codes is not None  # the appended row's sign code was carried over too
    assert (entry.codes[:, :entry.n] == vector_codes.pack(entry.matrix[:entry.n])).all()
