"""Big keys shortlisted by sign codes, then rescored exactly (bot/memory/vectors/codes.py): the
codes themselves, a recall floor against vec0's exact search, exact distances, exactness below
the threshold and as of a past moment, and codes that stay in step with every way a key's rows
change (appends, removals, regrow, compaction), packed only for keys searched by code."""
from __future__ import annotations

import threading

import numpy as np
import pytest

from bot.memory.records import NewMemory
from bot.memory.sql import store
from bot.memory.sqlite import db
from bot.memory.sqlite import vec0 as vectors
from bot.memory.vectors import codes as vector_codes
from bot.memory.vectors import keys as cache_keys
from bot.memory.vectors.arrays import KeyVectors
from bot.memory.vectors.cache import VectorCache

DIM = 100  # two 64-bit words, the second one partly padding
BIG, SMALL = "r:1", "g"


def clustered(rng: np.random.Generator, count: int, centres: np.ndarray) -> np.ndarray:
    points = centres[rng.integers(0, len(centres), size=count)] + 0.5 * rng.standard_normal((count, DIM))
    return points / np.linalg.norm(points, axis=1, keepdims=True)


@pytest.fixture
def world(tmp_path):
    rng = np.random.default_rng(5)
    centres = rng.standard_normal((20, DIM))
    cached, plain = db.connect(tmp_path / "v.db"), db.connect(tmp_path / "v.db")
    cache = VectorCache(64 << 20, codes_min=1000, source=vectors.SQLiteVectorSource())
    vectors.attach_cache(cached, cache)
    with plain:
        info = vectors.create_index(plain, "m", DIM)
        memories = [NewMemory(f"room {i}", "room", owner_id=7, channel_id=1) for i in range(1500)]
        memories += [NewMemory(f"global {i}", "global", owner_id=7) for i in range(200)]
        store.insert_many(plain, memories, base_stability_days=7, vector_info=info,
                          vectors_=clustered(rng, 1700, centres).tolist(), now=1000.0)
    yield cached, plain, cache, info, rng, centres
    cached.close()
    plain.close()


def ids_of(hits) -> list[int]:
    return [memory_id for memory_id, _ in hits]


def in_step(entry: KeyVectors) -> bool:
    return bool((entry.codes[:, :entry.n] == vector_codes.pack(entry.matrix[:entry.n])).all())


@pytest.mark.parametrize("dim", [DIM, 40, 130, 768])  # 2, 1, 3 and 12 words: the pairs summed as uint8
def test_hamming_counts_the_dimensions_whose_signs_differ(dim, monkeypatch):
    monkeypatch.setattr(vector_codes, "SCAN_BLOCK", 128)  # several blocks, the last one partial
    rng = np.random.default_rng(1)
    matrix = rng.standard_normal((300, dim)).astype(np.float32)
    q = rng.standard_normal(dim).astype(np.float32)
    matrix[7] = -q  # every sign differs: the largest distance, no uint8 overflow
    codes = vector_codes.pack(matrix)
    expected = ((matrix > 0) != (q > 0)).sum(axis=1)
    assert expected[7] == dim
    assert (vector_codes.hamming(codes, 300, vector_codes.pack(q[None])[:, 0]) == expected).all()
    assert (vector_codes.hamming(codes, 120, vector_codes.pack(q[None])[:, 0]) == expected[:120]).all()
    if dim != DIM:
        return
    rows = vector_codes.nearest_rows(expected.astype(np.uint16), 40)
    assert len(rows) == 40 and expected[rows].max() <= np.sort(expected)[39]



def test_removed_rows_take_no_place_in_the_shortlist(monkeypatch):
    """300 removed rows identical to the query (the nearest by code) must not crowd the live
    nearest out of a 256-row shortlist; and they sit just past the farthest distance (a uint16
    max made nearest_rows count 65,536 bins a search, ~6x its cost)."""
    rng = np.random.default_rng(3)
    q = rng.standard_normal(DIM).astype(np.float32)
    q /= np.linalg.norm(q)
    live = rng.standard_normal((2000, DIM)).astype(np.float32)
    live /= np.linalg.norm(live, axis=1, keepdims=True)
    matrix = np.vstack([np.tile(q, (300, 1)), live])
    ids = np.concatenate([np.full(300, -1), np.arange(2000)]).astype(np.int64)
    counted: list[int] = []
    real_bincount = np.bincount
    monkeypatch.setattr(vector_codes.np, "bincount", lambda x: counted.append(int(x.max())) or real_bincount(x))
    got, scores = vector_codes.search(vector_codes.pack(matrix), ids, matrix, len(ids), q, 10, None)
    assert int(np.argmax(live @ q)) in got[np.isfinite(scores)].tolist()
    assert counted and max(counted) <= vector_codes.words_for(DIM) * 64 + 1

def test_a_big_key_is_shortlisted_by_code_above_a_recall_floor_with_exact_distances(world):
    cached, plain, cache, info, rng, centres = world
    recall = []
    for q in clustered(rng, 30, centres):
        got = vectors.knn(cached, info, q.tolist(), [BIG, SMALL], 10)
        exact = vectors.knn_vec0(plain, info, q.tolist(), [BIG, SMALL], 10)
        recall.append(len(set(ids_of(got)) & set(ids_of(exact))) / 10)
        for memory_id, distance in got:  # whatever it returns is scored exactly
            assert distance == pytest.approx(float(np.linalg.norm(vectors.vector_of(plain, info, memory_id) - q)), abs=1e-4)
        assert ids_of(vectors.knn(cached, info, q.tolist(), [SMALL], 10)) == ids_of(
            vectors.knn_vec0(plain, info, q.tolist(), [SMALL], 10))  # a small key stays exact
    assert np.mean(recall) >= 0.9, recall


def test_below_the_threshold_turned_off_or_as_of_the_search_is_exact(world, monkeypatch):
    cached, plain, cache, info, rng, centres = world
    monkeypatch.setattr(vector_codes, "RERANK_MIN", 1)  # a shortlist this short would miss neighbours
    monkeypatch.setattr(vector_codes, "RERANK_PER_K", 1)
    monkeypatch.setattr(vector_codes, "RERANK_SHARE", 0.001)
    queries = clustered(rng, 10, centres)
    shortlisted = [ids_of(vectors.knn(cached, info, q.tolist(), [BIG], 10)) for q in queries]
    exact = [ids_of(vectors.knn_vec0(plain, info, q.tolist(), [BIG], 10)) for q in queries]
    assert shortlisted != exact  # the codes path did run
    assert [ids_of(vectors.knn(cached, info, q.tolist(), [BIG], 10, as_of=5000.0)) for q in queries] == exact
    for codes_min in (0, 5000):
        cache.codes_min = codes_min
        assert [ids_of(vectors.knn(cached, info, q.tolist(), [BIG], 10)) for q in queries] == exact


def test_codes_stay_in_step_with_appends_removals_regrow_and_compaction(world):
    cached, plain, cache, info, rng, centres = world
    q = clustered(rng, 1, centres)[0]
    vectors.knn(cached, info, q.tolist(), [BIG], 10)
    entry = cache._keys[BIG]
    assert in_step(entry)
    nearest = vectors.knn_vec0(plain, info, q.tolist(), [BIG], 1)[0][0]
    store.archive(plain, nearest, "test")
    with plain:
        added = store.insert_many(plain, [NewMemory(f"new {i}", "room", owner_id=7, channel_id=1) for i in range(30)],
                                  base_stability_days=7, vector_info=info,
                                  vectors_=[q.tolist()] + clustered(rng, 29, centres).tolist(), now=2000.0)
    got = vectors.knn(cached, info, q.tolist(), [BIG], 10)
    assert got[0][0] == added[0] and got[0][1] == pytest.approx(0.0, abs=1e-3) and nearest not in ids_of(got)
    assert len(entry.ids) > 1504 and in_step(entry)            # appended past the first arrays: regrown
    for memory_id in added[1:]:
        store.archive(plain, memory_id, "test")
    for memory_id in ids_of(vectors.knn_vec0(plain, info, q.tolist(), [BIG], 400))[1:]:
        store.archive(plain, memory_id, "test")                 # enough removals to compact
    got = vectors.knn(cached, info, q.tolist(), [BIG], 10)
    assert entry.dead < 64 and in_step(entry)
    assert got[0][0] == added[0] and not set(ids_of(got)) & set(added[1:])
    recall = [len(set(ids_of(vectors.knn(cached, info, p.tolist(), [BIG], 10)))
                  & set(ids_of(vectors.knn_vec0(plain, info, p.tolist(), [BIG], 10)))) / 10
              for p in clustered(rng, 10, centres)]
    assert np.mean(recall) >= 0.9, recall


def test_codes_are_packed_only_once_a_key_is_searched_by_code(world, monkeypatch):
    """A key searched exactly holds no codes (they cost ~26 % of a load and memory no search
    reads); the first search after it grows past the threshold packs them, equal to pack()."""
    cached, plain, cache, info, rng, centres = world
    monkeypatch.setattr(cache_keys, "CODES_KEY_MIN", 100)
    vectors.knn(cached, info, clustered(rng, 1, centres)[0].tolist(), [BIG], 10)
    vectors.knn(cached, info, clustered(rng, 1, centres)[0].tolist(), [SMALL], 10)
    big, small = cache._keys[BIG], cache._keys[SMALL]
    assert in_step(big) and small.codes is None
    assert cache.nbytes == big.nbytes + small.nbytes
    cache.codes_min = 300
    with plain:  # fewer changes than a reload takes (RELOAD_AFTER_CHANGES): appended to the cached key
        store.insert_many(plain, [NewMemory(f"more {i}", "global", owner_id=7) for i in range(150)],
                          base_stability_days=7, vector_info=info, vectors_=clustered(rng, 150, centres).tolist())
    q = clustered(rng, 1, centres)[0]
    assert vectors.knn(cached, info, q.tolist(), [SMALL], 10, as_of=5000.0) and small.codes is None  # exact: no codes
    got = vectors.knn(cached, info, q.tolist(), [SMALL], 10)
    assert cache._keys[SMALL] is small and small.n == 350 and small.codes is not None and in_step(small)
    assert cache.nbytes == big.nbytes + small.nbytes
    exact = vectors.knn_vec0(plain, info, q.tolist(), [SMALL], 10)
    assert len(set(ids_of(got)) & set(ids_of(exact))) >= 8


def test_codes_packed_beside_appends_cover_them_and_a_regrow_voids_them():
    rng = np.random.default_rng(9)
    rows = rng.standard_normal((50, DIM)).astype(np.float32)
    entry = KeyVectors(np.arange(40, dtype=np.int64), np.zeros(40), rows[:40])
    packed = KeyVectors.pack_codes(entry.matrix, entry.n)
    entry.add(100, 0.0, rows[40])                                # appended while packing: same arrays
    entry.install_codes(packed)
    assert entry.codes is not None and in_step(entry)
    entry = KeyVectors(np.arange(40, dtype=np.int64), np.zeros(40), rows[:40])
    packed = KeyVectors.pack_codes(entry.matrix, entry.n)
    for i in range(10):                                          # past the free rows: the arrays regrow
        entry.add(200 + i, 0.0, rows[40 + i])
    entry.install_codes(packed)
    assert entry.codes is None                                   # codes of the old arrays: dropped


def test_a_big_key_loads_with_free_rows_so_the_first_appends_copy_nothing(world, monkeypatch):
    cached, plain, cache, info, rng, centres = world
    monkeypatch.setattr(cache_keys, "INLINE_LOAD_MAX", 1000)  # 1,500 rows: a big key here
    vectors.knn(cached, info, clustered(rng, 1, centres)[0].tolist(), [BIG, SMALL], 10)
    entry, small = cache._keys[BIG], cache._keys[SMALL]
    assert len(small.ids) == small.n + 4                        # a small key: a few rows of slack only
    loaded = entry.matrix
    with plain:
        store.insert_many(plain, [NewMemory(f"more {i}", "room", owner_id=7, channel_id=1) for i in range(150)],
                          base_stability_days=7, vector_info=info, vectors_=clustered(rng, 150, centres).tolist())
    vectors.knn(cached, info, clustered(rng, 1, centres)[0].tolist(), [BIG], 10)
    assert entry.n == 1650 and entry.matrix is loaded and in_step(entry)


def test_keys_seen_together_past_the_threshold_share_one_shortlist(world, monkeypatch):
    """A viewer whose keys each hold fewer than codes_min vectors but together more (a heavy
    user in a DM at 1M) gets one shortlist by code over all of them, sized by their total."""
    cached, plain, cache, info, rng, centres = world
    cache.codes_min = 1600  # BIG (1,500) and SMALL (200) alone stay exact, together they do not
    monkeypatch.setattr(cache_keys, "CODES_KEY_MIN", 1000)  # SMALL is scored whole still
    q = clustered(rng, 1, centres)[0]
    assert ids_of(vectors.knn(cached, info, q.tolist(), [BIG], 10)) == ids_of(
        vectors.knn_vec0(plain, info, q.tolist(), [BIG], 10))
    assert cache._keys[BIG].codes is None
    sizes: list[int] = []
    real = vector_codes.search_many
    monkeypatch.setattr(vector_codes, "search_many",
                        lambda parts, *a: sizes.append(sum(part[3] for part in parts)) or real(parts, *a))
    vectors.knn(cached, info, q.tolist(), [BIG, SMALL], 10)
    assert sizes.pop() == 1500 and cache._keys[SMALL].codes is None  # under CODES_KEY_MIN: scored whole
    monkeypatch.setattr(cache_keys, "CODES_KEY_MIN", 100)
    recall = []
    for p in clustered(rng, 10, centres):
        got = vectors.knn(cached, info, p.tolist(), [BIG, SMALL], 10)
        recall.append(len(set(ids_of(got)) & set(ids_of(vectors.knn_vec0(plain, info, p.tolist(), [BIG, SMALL], 10)))) / 10)
    assert sizes == [1700] * 10 and in_step(cache._keys[BIG]) and in_step(cache._keys[SMALL])
    assert np.mean(recall) >= 0.9, recall
    assert cache.nbytes == cache._keys[BIG].nbytes + cache._keys[SMALL].nbytes


def test_one_shortlist_over_several_keys_ranks_their_rows_together():
    rng = np.random.default_rng(4)
    q = rng.standard_normal(DIM).astype(np.float32)
    q /= np.linalg.norm(q)
    keys = [rng.standard_normal((n, DIM)).astype(np.float32) for n in (700, 40, 500)]
    keys[1][3] = q                                              # the nearest row sits in the smallest key
    parts = [(vector_codes.pack(m), np.arange(n, dtype=np.int64) + 10_000 * i, m, n, False, None)
             for i, (m, n) in enumerate((m, len(m)) for m in keys)]
    got, scores = vector_codes.search_many(parts, q, 10, None)
    assert len(got) == vector_codes.rerank_count(1240, 10) and 10_003 in got.tolist()
    assert scores[got.tolist().index(10_003)] == pytest.approx(1.0, abs=1e-5)
    for ids, score in zip(got.tolist(), scores.tolist(), strict=True):  # exact scores, each from its own key
        assert score == pytest.approx(float(keys[ids // 10_000][ids % 10_000] @ q), abs=1e-5)


@pytest.mark.parametrize("meanwhile", ["evicted", "reset"])
def test_codes_packed_for_a_key_that_left_the_cache_meanwhile_count_no_bytes(world, monkeypatch, meanwhile):
    """The key is dropped (evicted, or the cache starts over) while its codes are packed off the
    lock: they are not installed, and the cache's size stays the sum of the keys it holds."""
    cached, plain, cache, info, rng, centres = world
    cache.codes_min = 0
    q = clustered(rng, 1, centres)[0]
    vectors.knn(cached, info, q.tolist(), [BIG, SMALL], 10)  # both loaded, searched whole: no codes
    entry = cache._keys[BIG]
    real = KeyVectors.pack_codes

    def packing_while_the_key_goes(matrix, n):
        with cache._lock:
            cache._drop(BIG) if meanwhile == "evicted" else cache._reset()
        return real(matrix, n)
    monkeypatch.setattr(KeyVectors, "pack_codes", staticmethod(packing_while_the_key_goes))
    cache.codes_min = 1000
    got = vectors.knn(cached, info, q.tolist(), [BIG], 10)
    assert entry.codes is None and BIG not in cache.cached_keys()
    assert cache.nbytes == sum(cache._keys[key].nbytes for key in cache.cached_keys())
    assert ids_of(got) == ids_of(vectors.knn_vec0(plain, info, q.tolist(), [BIG], 10))  # scored whole


def test_one_thread_packs_a_key_and_searches_meanwhile_score_it_whole(world, monkeypatch, tmp_path):
    """Four first searches by code at once: one packs the key's codes, the others find it being
    packed and score it exactly meanwhile (they packed it four times)."""
    cached, plain, cache, info, rng, centres = world
    cache.codes_min = 1600  # BIG (1,500) is loaded without codes; with SMALL (200, scored whole) searched by code
    monkeypatch.setattr(cache_keys, "CODES_KEY_MIN", 1000)
    entered, release = threading.Event(), threading.Event()
    packed: list[int] = []
    real = KeyVectors.pack_codes

    def slow_pack(matrix, n):
        packed.append(n)
        if len(packed) == 1:  # only the first packer waits: a second one fails fast below
            entered.set()
            assert release.wait(10)
        return real(matrix, n)
    monkeypatch.setattr(KeyVectors, "pack_codes", staticmethod(slow_pack))
    queries = clustered(rng, 4, centres)
    vectors.knn(cached, info, queries[0].tolist(), [SMALL], 10)  # the cache's mark set: no first sync races
    found: dict[int, list[int]] = {}

    def search(i: int) -> None:
        conn = db.connect(tmp_path / "v.db")
        vectors.attach_cache(conn, cache)
        try:
            found[i] = ids_of(vectors.knn(conn, info, queries[i].tolist(), [BIG, SMALL], 10))
        finally:
            conn.close()
    first = threading.Thread(target=search, args=(0,))
    first.start()
    assert entered.wait(10)
    others = [threading.Thread(target=search, args=(i,)) for i in (1, 2, 3)]
    for thread in others:
        thread.start()
    for thread in others:
        thread.join(10)
    assert packed == [1500] and cache._keys[BIG].codes is None
    for i in (1, 2, 3):  # scored whole while the key was being packed
        assert found[i] == ids_of(vectors.knn_vec0(plain, info, queries[i].tolist(), [BIG, SMALL], 10))
    release.set()
    first.join(10)
    assert 0 in found and packed == [1500] and in_step(cache._keys[BIG])
    assert cache.nbytes == sum(cache._keys[key].nbytes for key in cache.cached_keys())


def test_packed_codes_keep_the_cache_within_its_budget(world):
    """Codes packed on a first search by code add bytes: the least recently used other keys
    are evicted for them, as for a load."""
    cached, plain, cache, info, rng, centres = world
    cache.codes_min = 0
    q = clustered(rng, 1, centres)[0]
    vectors.knn(cached, info, q.tolist(), [SMALL, BIG], 10)  # loaded whole, SMALL the least recent
    cache.budget_bytes = cache.nbytes + 1000  # less than BIG's codes (1,504 rows x 16 bytes)
    cache.codes_min = 1000
    got = vectors.knn(cached, info, q.tolist(), [BIG], 10)
    assert cache.cached_keys() == [BIG] and in_step(cache._keys[BIG])
    assert cache.nbytes == cache._keys[BIG].nbytes <= cache.budget_bytes
    assert len(set(ids_of(got)) & set(ids_of(vectors.knn_vec0(plain, info, q.tolist(), [BIG], 10)))) >= 8


def test_warm_leaves_room_for_the_codes_a_search_by_code_packs(world, monkeypatch, tmp_path):
    """A key under codes_min is loaded without codes but packs them on a search by code over
    the viewer's keys together (CODES_KEY_MIN): warm counts them, so that search evicts no key
    it warmed and keeps the budget."""
    cached, plain, cache, info, rng, centres = world
    monkeypatch.setattr(cache_keys, "CODES_KEY_MIN", 100)
    row, code = DIM * 4 + 16, vector_codes.words_for(DIM) * 8
    # both fit without codes, not with
    warm = VectorCache((1504 + 204) * row + 1000, codes_min=1600, source=vectors.SQLiteVectorSource())
    conn = db.connect(tmp_path / "v.db")
    vectors.attach_cache(conn, warm)
    assert warm.warm(conn, info) == 1 and warm.cached_keys() == [BIG]
    assert warm.nbytes + 1504 * code <= warm.budget_bytes
    vectors.knn(conn, info, clustered(rng, 1, centres)[0].tolist(), [BIG, SMALL], 10)
    assert BIG in warm.cached_keys() and in_step(warm._keys[BIG])
    assert warm.nbytes == sum(warm._keys[key].nbytes for key in warm.cached_keys()) <= warm.budget_bytes
    conn.close()
