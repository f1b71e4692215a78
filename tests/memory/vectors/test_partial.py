"""Keys held partially (vectors/partial.py, partial_keys.py): a key the budget cannot hold whole
keeps its ids and sign codes, and its search reads its best candidates back from vec0. On real
sqlite-vec: the answers are vec0's where the candidates cover the key, a forgotten memory never
comes back, a key's vectors are only ever its own, and a key moves between whole, partial and
not held as the budget and its size change."""
from __future__ import annotations

import numpy as np
import pytest

from bot.memory.records import NewMemory
from bot.memory.sql import queries, store
from bot.memory.sqlite import db
from bot.memory.sqlite import vec0 as vectors
from bot.memory.sqlite.partial_source import SQLitePartialSource, read_key_vectors
from bot.memory.vectors import codes as vector_codes
from bot.memory.vectors import keys as cache_keys
from bot.memory.vectors import partial_keys
from bot.memory.vectors.arrays import KeyVectors
from bot.memory.vectors.cache import VectorCache
from bot.memory.vectors.partial import PartialKey, candidates

pytestmark = pytest.mark.sqlite_only("keys held partially read vec0's shadow tables (sqlite/partial_source.py)")

DIM = 16
BUSY = "r:1"


def unit(rng: np.random.Generator) -> list[float]:
    v = rng.standard_normal(DIM)
    return (v / np.linalg.norm(v)).tolist()


def add(conn, rng: np.random.Generator, key: str, count: int) -> list[int]:
    """`count` memories with random vectors under `key` (r:N, p:7:dm or g); their ids."""
    with conn:
        info = vectors.index_info(conn) or vectors.create_index(conn, "m", DIM)
        scope = {"g": "global", "r": "room", "p": "personal"}[key[0]]
        memories = [NewMemory(f"memory {key} {i}", scope, owner_id=7,
                              channel_id=int(key[2:]) if key[0] == "r" else None) for i in range(count)]
        assert {memory.vis_key for memory in memories} == {key}
        before = int(queries.query_value(conn, "SELECT coalesce(max(id), 0) FROM memories"))
        store.insert_many(conn, memories, base_stability_days=7, vector_info=info,
                          vectors_=[unit(rng) for _ in memories], now=1000.0)
    return list(range(before + 1, before + count + 1))


def whole_bytes(count: int) -> int:
    return count * KeyVectors.row_bytes(DIM, "float32")


def partial_cache(path, budget: int, partial_min: int = 100):
    """A connection searching through a cache of `budget` bytes that holds keys partially."""
    conn = db.connect(path)
    cache = VectorCache(budget, partial_min=partial_min)
    cache.source = SQLitePartialSource()
    vectors.attach_cache(conn, cache)
    return conn, cache


def same(got, exact) -> bool:
    return [m for m, _ in got] == [m for m, _ in exact] and np.allclose(
        [d for _, d in got], [d for _, d in exact], atol=1e-5)


@pytest.fixture
def world(tmp_path):
    """A database with a busy key (300 vectors) and a few small ones; a plain connection to it."""
    plain = db.connect(tmp_path / "v.db")
    rng = np.random.default_rng(5)
    add(plain, rng, BUSY, 300)
    for key in ("g", "r:2", "p:7:dm"):
        add(plain, rng, key, 20)
    yield tmp_path / "v.db", plain, rng
    plain.close()


def exact_search_of(cache, monkeypatch) -> list[list[str]]:
    """Records the keys each of the cache's vec0 searches covers."""
    searched: list[list[str]] = []
    real = cache.source.search
    monkeypatch.setattr(cache.source, "search", lambda c, i, q, keys, k, as_of: searched.append(list(keys))
                        or real(c, i, q, keys, k, as_of))
    return searched


def test_asymmetric_scores_are_the_query_against_each_code_as_plus_minus_one():
    rng = np.random.default_rng(1)
    rows = rng.standard_normal((50, 100)).astype(np.float32)
    q = rng.standard_normal(100).astype(np.float32)
    got = vector_codes.asymmetric(vector_codes.pack(rows), q)
    assert np.allclose(got, np.where(rows > 0, 1.0, -1.0) @ q, atol=1e-4)


def test_a_key_too_big_for_the_budget_is_held_partially_and_answers_like_vec0(world, monkeypatch):
    path, plain, rng = world
    conn, cache = partial_cache(path, whole_bytes(120))
    info = vectors.index_info(conn)
    assert cache.warm(conn, info) > 0
    assert cache.partial_keys() == [BUSY] and BUSY not in cache.cached_keys()
    assert cache.nbytes <= cache.budget_bytes
    searched = exact_search_of(cache, monkeypatch)
    for _ in range(10):
        q = unit(rng)
        keys = [BUSY, "g", "p:7:dm"]
        # the key is smaller than the candidates read back: the answer is vec0's exactly
        assert same(vectors.knn(conn, info, q, keys, 8), vectors.knn_vec0(plain, info, q, keys, 8))
    assert all(BUSY not in keys for keys in searched)  # never vec0's scan of the busy key
    # as of a past moment: vec0's exact search
    vectors.knn(conn, info, unit(rng), [BUSY], 5, as_of=2000.0)
    assert [BUSY] in searched


def test_a_forgotten_memory_never_comes_back(world):
    path, plain, rng = world
    conn, cache = partial_cache(path, whole_bytes(120))
    info = vectors.index_info(conn)
    cache.warm(conn, info)
    q = unit(rng)
    nearest = vectors.knn(conn, info, q, [BUSY], 3)[0][0]
    second = vectors.knn(conn, info, q, [BUSY], 3)[1][0]
    store.delete(plain, [nearest])             # forgotten, by another connection
    store.archive(plain, second, "test")       # and one archived
    got = [m for m, _ in vectors.knn(conn, info, q, [BUSY], 10)]
    assert nearest not in got and second not in got
    assert got == [m for m, _ in vectors.knn_vec0(plain, info, q, [BUSY], 10)]
    # Even codes not yet told of the removal: the read back takes only what vec0 holds under the key.
    assert set(read_key_vectors(conn, info, BUSY, [nearest, second, got[0]])) == {got[0]}


def test_a_partial_key_gives_only_its_own_vectors(world):
    path, plain, rng = world
    conn, cache = partial_cache(path, whole_bytes(120))
    info = vectors.index_info(conn)
    cache.warm(conn, info)
    busy = {int(i) for (i,) in plain.execute("SELECT id FROM memories WHERE vis_key = ?", (BUSY,))}
    other = int(queries.query_value(plain, "SELECT min(id) FROM memories WHERE vis_key = 'r:2'"))
    for _ in range(5):
        q = unit(rng)
        assert {m for m, _ in vectors.knn(conn, info, q, [BUSY], 20)} <= busy
        assert not {m for m, _ in vectors.knn(conn, info, q, ["g", "r:2"], 20)} & busy
    assert read_key_vectors(conn, info, BUSY, [other]) == {}  # another key's memory: not read under this one
    # a memory that moves to another key leaves the partial key (its vector goes with the move)
    moved = min(busy)
    with plain:
        plain.execute("UPDATE memories SET vis_key = 'r:2', channel_id = 2 WHERE id = ?", (moved,))
    assert moved not in {m for m, _ in vectors.knn(conn, info, vectors.vector_of(plain, info, moved) or unit(rng),
                                                     [BUSY], 300)}


def test_a_partial_key_follows_new_vectors(world):
    path, plain, rng = world
    conn, cache = partial_cache(path, whole_bytes(120))
    info = vectors.index_info(conn)
    cache.warm(conn, info)
    q = unit(rng)
    newest = add(plain, rng, BUSY, 1)[0]
    with plain:
        store.set_vector(plain, info, newest, q)  # exactly the query: the nearest of all
    assert vectors.knn(conn, info, q, [BUSY], 1)[0][0] == newest
    assert cache.partial_keys() == [BUSY]


def test_a_key_moves_between_whole_partial_and_not_held(world, monkeypatch):
    path, plain, rng = world
    conn, cache = partial_cache(path, whole_bytes(120))
    info = vectors.index_info(conn)
    cache.warm(conn, info)
    assert cache.partial_keys() == [BUSY]
    # partial -> whole: the key shrinks until it fits the budget; at its next load it is read whole
    busy = [int(i) for (i,) in plain.execute("SELECT id FROM memories WHERE vis_key = ? ORDER BY id", (BUSY,))]
    store.delete(plain, busy[:200])  # 100 left: whole, they take 104 rows of the 120
    monkeypatch.setattr(cache_keys, "TOO_BIG_RETRY_S", 0.0)
    q = unit(rng)
    assert same(vectors.knn(conn, info, q, [BUSY], 5), vectors.knn_vec0(plain, info, q, [BUSY], 5))
    assert BUSY in cache.cached_keys() and cache.partial_keys() == []
    # whole -> partial: evicted to make room for another key, it keeps its codes instead of going
    monkeypatch.setattr(cache_keys, "TOO_BIG_RETRY_S", 600.0)
    cache.budget_bytes = whole_bytes(70)
    add(plain, rng, "r:3", 40)
    vectors.knn(conn, info, q, [BUSY], 5)  # the busy key is used, then r:3 is loaded
    assert same(vectors.knn(conn, info, q, ["r:3"], 5), vectors.knn_vec0(plain, info, q, ["r:3"], 5))
    assert "r:3" in cache.cached_keys() and BUSY in cache.partial_keys() and BUSY not in cache.cached_keys()
    assert same(vectors.knn(conn, info, q, [BUSY], 5), vectors.knn_vec0(plain, info, q, [BUSY], 5))
    # partial -> not held: the room goes to a whole key, the partial one is dropped; vec0 answers it
    cache.budget_bytes = whole_bytes(45)
    add(plain, rng, "r:4", 30)
    assert same(vectors.knn(conn, info, q, ["r:4"], 5), vectors.knn_vec0(plain, info, q, ["r:4"], 5))
    assert BUSY not in cache.partial_keys() and BUSY not in cache.cached_keys()
    assert same(vectors.knn(conn, info, q, [BUSY], 5), vectors.knn_vec0(plain, info, q, [BUSY], 5))


def test_with_partial_holding_off_a_big_key_stays_in_vec0(world, monkeypatch):
    path, plain, rng = world
    conn, cache = partial_cache(path, whole_bytes(120), partial_min=0)
    info = vectors.index_info(conn)
    cache.warm(conn, info)
    assert cache.partial_keys() == [] and BUSY not in cache.cached_keys()
    searched = exact_search_of(cache, monkeypatch)
    vectors.knn(conn, info, unit(rng), [BUSY], 5)
    assert [BUSY] in searched


def test_candidates_leave_out_removed_and_skipped_rows():
    rng = np.random.default_rng(3)
    rows = rng.standard_normal((3000, 64)).astype(np.float32)
    ids = np.arange(10, 3010, dtype=np.int64)
    key = PartialKey(ids, vector_codes.pack(rows))
    q = rows[0] / np.linalg.norm(rows[0])
    assert 10 in candidates(key.view(), q, 5, None)  # the query's own row
    key.discard(10)
    assert 10 not in candidates(key.view(), q, 5, None)
    assert 11 not in candidates(key.view(), rows[1] / np.linalg.norm(rows[1]), 5, np.array([11]))
    got = candidates(key.view(), q, 5, None)
    assert len(got) == 160 and len(set(got)) == 160


def test_a_small_cold_key_that_would_evict_goes_to_the_loader(world):
    """With keys held partially and the cache full, a small cold key is searched in vec0 and
    loaded on the loader (the search that meets it no longer reads it and evicts others first);
    with room, inline."""
    path, plain, rng = world
    conn, cache = partial_cache(path, 64 << 20)
    info = vectors.index_info(conn)
    jobs: list = []
    cache.background = jobs.append
    q = unit(rng)
    vectors.knn(conn, info, q, ["r:2"], 5)  # room: loaded inline
    assert cache.cached_keys() == ["r:2"] and not jobs
    cache.budget_bytes = cache.nbytes + 100  # full: the next cold key would push r:2 out
    assert same(vectors.knn(conn, info, q, ["g"], 5), vectors.knn_vec0(plain, info, q, ["g"], 5))
    assert cache.cached_keys() == ["r:2"] and len(jobs) == 1
    jobs[0](plain)
    assert "g" in cache.cached_keys()
    cache.partial_min = 0  # holding nothing partially: as before, inline
    vectors.knn(conn, info, q, ["p:7:dm"], 5)
    assert "p:7:dm" in cache.cached_keys() and len(jobs) == 1


def test_a_cold_key_of_hundreds_goes_to_the_loader_even_with_room(world):
    """With keys held partially, a cold key of more than partial_keys.INLINE_LOAD_MAX vectors is
    searched in vec0 and loaded on the loader, room or not: read, quantised and coded inside the
    recall that met it, it cost that recall more than vec0's search of it."""
    path, plain, rng = world
    conn, cache = partial_cache(path, 64 << 20)
    info = vectors.index_info(conn)
    jobs: list = []
    cache.background = jobs.append
    q = unit(rng)
    assert 20 <= partial_keys.INLINE_LOAD_MAX < 300
    assert same(vectors.knn(conn, info, q, [BUSY], 5), vectors.knn_vec0(plain, info, q, [BUSY], 5))
    assert cache.cached_keys() == [] and len(jobs) == 1
    jobs[0](plain)
    assert cache.cached_keys() == [BUSY]
    assert same(vectors.knn(conn, info, q, [BUSY], 5), vectors.knn_vec0(plain, info, q, [BUSY], 5))
