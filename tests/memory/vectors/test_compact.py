"""Compact vectors in the cache (MUNINN_VECTOR_FORM=int8): a quarter of the bytes, the same
answers. Int8 rows choose a short list and the store's float32 vectors rescore it, so a search
returns the exact distances of (nearly always) the exact top k; the log's changes reach the
int8 rows; the budget counts their smaller bytes. On both backends."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np
import pytest

from bot.memory.postgres.backend import PostgresStorage
from bot.memory.records import NewMemory
from bot.memory.sql import store
from bot.memory.sqlite import db
from bot.memory.sqlite import vec0 as vectors
from bot.memory.vectors.arrays import KeyVectors, quantise, scores_of
from bot.memory.vectors.cache import VectorCache
from bot.settings import SettingsError, load_settings

DIM = 64
KEYS = ["g", "r:1", "r:2", "p:7:dm", "p:7:1"]


def embeddings(rng: np.random.Generator, count: int) -> np.ndarray:
    """Unit vectors shaped like a sentence model's: a shared mean direction, a few heavy
    dimensions, topics (clusters) and near-duplicates, so that the nearest ones are close
    together (the hard case for a quantised short list)."""
    mean = rng.standard_normal(DIM)
    topics = rng.standard_normal((24, DIM))
    heavy = np.ones(DIM)
    heavy[:3] = 6.0
    rows = 0.8 * mean + topics[rng.integers(0, len(topics), count)] + 0.5 * rng.standard_normal((count, DIM))
    rows *= heavy
    twins = rng.integers(0, count, count // 5)
    rows[twins[1:]] = rows[twins[:-1]] + 0.05 * rng.standard_normal((len(twins) - 1, DIM))
    return (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)


def memory_for(key: str, i: int) -> NewMemory:
    scope = {"g": "global", "r": "room", "p": "personal"}[key[0]]
    return NewMemory(f"memory {i}", scope, owner_id=7, channel_id=int(key[2:]) if key[0] == "r" else None,
                     guild_id=1 if key == "p:7:1" else None)


@dataclass
class Side:
    """One backend: a connection searching through an int8 cache, and plain exact reads."""
    cache: VectorCache
    search: Callable[..., list[tuple[int, float]]]           # (q, keys, k, as_of=None) through the cache
    cosines: Callable[[list[float], list[int]], dict[int, float]]
    neighbours: Callable[[list[tuple[int, str]], int], dict[int, list[tuple[int, float]]]]
    insert: Callable[[str, list[float], int], int]
    archive: Callable[[int], None]
    set_vector: Callable[[int, list[float]], None]
    stored: Callable[[], dict[int, tuple[str, np.ndarray]]]   # id -> (key, float32 vector), from the store
    connection: Any = None                                    # the searching side's own (a background load's)
    index: Callable[[], Any] = lambda: None                   # the vector index's info


def _sqlite_side(tmp_path, form: str, budget: int) -> Iterator[Side]:
    cached, plain = db.connect(tmp_path / "v.db"), db.connect(tmp_path / "v.db")
    cache = VectorCache(budget, source=vectors.SQLiteVectorSource(), form=form)
    vectors.attach_cache(cached, cache)
    with plain:
        info = vectors.index_info(plain) or vectors.create_index(plain, "m", DIM)

    def insert(key: str, vector: list[float], i: int) -> int:
        with plain:
            return store.insert_many(plain, [memory_for(key, i)], base_stability_days=7, vector_info=info,
                                     vectors_=[vector], now=1000.0 + i)[0]

    def set_vector(memory_id: int, vector: list[float]) -> None:
        with plain:
            store.set_vector(plain, info, memory_id, vector)

    def stored() -> dict[int, tuple[str, np.ndarray]]:
        keys = dict(plain.execute("SELECT id, vis_key FROM memories WHERE embedded = 1 AND archived_at IS NULL"))
        found = {mid: vectors.read_vector(plain, info, mid) for mid in keys}  # not read_vectors: the rescoring's own read
        return {mid: (keys[mid], vector) for mid, vector in found.items() if vector is not None}

    yield Side(cache, lambda q, keys, k, as_of=None: vectors.knn(cached, info, q, keys, k, as_of),
               lambda q, ids: vectors.cosines(cached, info, q, ids),
               lambda items, k: vectors.neighbours_many(cached, info, items, k),
               insert, lambda memory_id: store.archive(plain, memory_id, "test"), set_vector, stored, cached,
               lambda: info)
    cached.close()
    plain.close()


def _postgres_side(url: str, form: str, budget: int) -> Iterator[Side]:
    cache = VectorCache(budget, form=form)
    cached, plain = PostgresStorage(url, cache), PostgresStorage(url)
    conn, other = cached.open_writer(), plain.open_writer()

    def index() -> Any:  # made by the first insert (of any side on the database)
        return plain.index_info(other)

    def insert(key: str, vector: list[float], i: int) -> int:
        return plain.insert(other, [memory_for(key, i)], base_stability_days=7, model="m", vecs=[vector],
                            now=1000.0 + i)[0]

    def stored() -> dict[int, tuple[str, np.ndarray]]:
        keys = {int(mid): str(key) for mid, key in other.pg.execute(
            "SELECT id, vis_key FROM memories WHERE embedded = 1 AND archived_at IS NULL")}
        found = cache.source.read_vectors(other, index(), list(keys))
        return {mid: (keys[mid], vector) for mid, vector in found.items()}

    yield Side(cache, lambda q, keys, k, as_of=None: cached.knn(conn, index(), q, keys, k, as_of),
               lambda q, ids: cache.cosines(conn, index(), q, ids),
               lambda items, k: cached.neighbours_many(conn, index(), items, k),
               insert, lambda memory_id: plain.archive(other, memory_id, "test"),
               lambda memory_id, vector: plain.store_vectors(other, "m", [memory_id], [vector]), stored, conn,
               index)
    conn.close()
    other.close()


@pytest.fixture
def make_side(backend, tmp_path) -> Iterator[Callable[..., Side]]:
    """Sides on the backend under test, all on one database: make_side(form="int8", budget=64 MB)."""
    made: list[Iterator[Side]] = []

    def make(form: str = "int8", budget: int = 64 << 20) -> Side:
        side = _postgres_side(backend, form, budget) if backend else _sqlite_side(tmp_path, form, budget)
        made.append(side)
        return next(side)

    yield make
    for side in made:
        next(side, None)


def fill(side: Side, rng: np.random.Generator, count: int) -> np.ndarray:
    rows = embeddings(rng, count)
    for i, row in enumerate(rows):
        side.insert(KEYS[int(rng.integers(0, len(KEYS))) if i % 3 else 1], row.tolist(), i)  # r:1 is the busy one
    return rows


def exact_knn(side: Side, q: np.ndarray, keys: list[str], k: int) -> list[tuple[int, float]]:
    """The exact answer, in numpy over the store's float32 vectors."""
    rows = [(mid, float(np.sqrt(max(0.0, 2.0 - 2.0 * float(vector @ q)))))
            for mid, (key, vector) in side.stored().items() if key in keys]
    return sorted(rows, key=lambda pair: (pair[1], pair[0]))[:k]


def queries_near(rng: np.random.Generator, rows: np.ndarray, count: int) -> list[np.ndarray]:
    """Queries close to stored rows: their nearest neighbours crowd together."""
    picked = rows[rng.integers(0, len(rows), count)] + 0.1 * rng.standard_normal((count, DIM)).astype(np.float32)
    return [q / np.linalg.norm(q) for q in picked]


def test_int8_search_gives_the_exact_top_k_with_exact_distances(make_side, backend):
    side = make_side()
    rng = np.random.default_rng(1)
    rows = fill(side, rng, 900)
    overlap = []
    for q in queries_near(rng, rows, 30):
        keys = list(rng.choice(KEYS, size=int(rng.integers(1, 4)), replace=False))
        got, exact = side.search(q.tolist(), keys, 10), exact_knn(side, q, keys, 10)
        truth = dict(exact_knn(side, q, keys, 10_000))
        # rescored: every distance is the exact one of that memory, and the order is exact
        assert all(abs(distance - truth[mid]) < 1e-5 for mid, distance in got)
        assert [distance for _, distance in got] == sorted(distance for _, distance in got)
        overlap.append(len({m for m, _ in got} & {m for m, _ in exact}) / len(exact))
    assert np.mean(overlap) >= 0.99, overlap
    held = side.cache._keys
    assert set(held) == set(KEYS) and all(entry.matrix.dtype == np.int8 for entry in held.values())


def test_int8_cosines_and_neighbours_are_exact(make_side, backend):
    side = make_side()
    rng = np.random.default_rng(2)
    rows = fill(side, rng, 300)
    q = queries_near(rng, rows, 1)[0]
    side.search(q.tolist(), KEYS, 5)  # every key loaded
    stored = side.stored()
    ids = sorted(stored)[::7]
    cosines = side.cosines(q.tolist(), ids)
    assert set(cosines) == set(ids)
    assert all(abs(cosines[mid] - float(stored[mid][1] @ q)) < 1e-5 for mid in ids)
    items = [(mid, stored[mid][0]) for mid in ids]
    found = side.neighbours(items, 4)
    for mid, key in items:
        truth = sorted(((other, float(np.sqrt(max(0.0, 2 - 2 * float(vector @ stored[mid][1])))))
                        for other, (k, vector) in stored.items() if k == key and other != mid),
                       key=lambda pair: (pair[1], pair[0]))[:4]
        assert [m for m, _ in found[mid]] == [m for m, _ in truth]
        # PostgreSQL's storage gives (id, cosine), SQLite's (id, distance)
        expected = [1.0 - d * d / 2.0 if backend else d for _, d in truth]
        assert np.allclose([d for _, d in found[mid]], expected, atol=1e-5)


def test_changes_from_the_log_reach_the_int8_rows(make_side, backend):
    side = make_side()
    rng = np.random.default_rng(3)
    rows = fill(side, rng, 400)
    q = queries_near(rng, rows, 1)[0]
    side.search(q.tolist(), KEYS, 5)  # every key loaded, as int8
    nearest = side.search(q.tolist(), ["r:1"], 1)[0][0]
    side.archive(nearest)                                                 # removed
    replaced = side.search(q.tolist(), ["r:2"], 3)[-1][0]
    side.set_vector(replaced, q.tolist())                                 # replaced by the query itself
    added = side.insert("g", (-q).tolist(), 10_000)                       # a new one, the farthest possible
    got = side.search(q.tolist(), KEYS, 5)
    assert got[0] == (replaced, pytest.approx(0.0, abs=1e-3)) and nearest not in [m for m, _ in got]
    assert got == [(m, pytest.approx(d, abs=1e-5)) for m, d in exact_knn(side, q, KEYS, 5)]
    assert side.search((-q).tolist(), ["g"], 1)[0] == (added, pytest.approx(0.0, abs=1e-3))
    held = side.cache._keys
    assert added in held["g"].row_of and held["g"].matrix.dtype == np.int8
    assert replaced in held["r:2"].row_of and nearest not in held["r:1"].row_of


def test_the_budget_counts_the_smaller_int8_rows(make_side, backend):
    """A budget a float32 copy of the vectors overflows (keys evicted, searched in the store)
    holds every key as int8; both answer the same."""
    rng = np.random.default_rng(4)
    row32 = DIM * 4 + 16
    budget = 700 * row32 // 2  # half of the float32 rows, twice the int8 ones
    small32, small8 = make_side("float32", budget), make_side("int8", budget)  # one database
    q = queries_near(rng, fill(small32, rng, 700), 1)[0]
    for key in KEYS:  # each key loaded in turn: the float32 cache evicts, the int8 one keeps them all
        small32.search(q.tolist(), [key], 3)
        small8.search(q.tolist(), [key], 3)
    assert set(small8.cache.cached_keys()) == set(KEYS) and set(small32.cache.cached_keys()) != set(KEYS)
    assert small8.cache.nbytes <= budget and small32.cache.nbytes <= budget
    assert small8.cache.nbytes < small32.cache.nbytes
    assert small8.search(q.tolist(), KEYS, 10) == [(m, pytest.approx(d, abs=1e-5))
                                                   for m, d in small32.search(q.tolist(), KEYS, 10)]


def test_int8_rows_keep_their_scales_through_appends_removals_and_compaction():
    rng = np.random.default_rng(5)
    rows = embeddings(rng, 400)
    entry = KeyVectors(np.arange(100, dtype=np.int64), np.zeros(100), rows[:100], form="int8")
    for i in range(100, 400):
        entry.add(i, float(i), rows[i])
    for i in range(0, 400, 2):
        entry.discard(i)  # enough to compact
    ids, _, matrix, n, scales = entry.view()
    assert scales is not None and matrix.dtype == np.int8 and entry.dead < 200
    live = ids[:n] >= 0
    q = rows[7]
    close = scores_of(matrix[:n], q, scales[:n])[live]
    exact = rows[ids[:n][live]] @ q
    step = np.max(np.abs(rows[ids[:n][live]]), axis=1) / 127
    assert np.all(np.abs(close - exact) <= step * np.sqrt(DIM) / 2 + 1e-6)
    assert entry.nbytes < len(matrix) * (DIM * 4 + 16) / 3


def test_quantise_maps_each_row_to_its_own_range():
    rows = np.array([[0.5, -0.25, 0.0], [0.0, 0.0, 0.0], [1e-3, 2e-3, -4e-3]], dtype=np.float32)
    codes, scales = quantise(rows)
    assert codes.dtype == np.int8 and np.abs(codes).max() == 127
    assert scales[1] == 0.0 and not codes[1].any()
    assert np.allclose(codes * scales[:, None], rows, atol=float(scales.max()) / 2 + 1e-9)
    assert np.all(np.abs(codes * scales[:, None] - rows) <= scales[:, None] / 2 + 1e-9)


def test_the_form_is_a_setting(tmp_path):
    env = {"DISCORD_TOKEN": "x", "MUNINN_DB_PATH": str(tmp_path / "m.db")}
    assert load_settings({**env, "MUNINN_VECTOR_FORM": "Float32"}).vector_form == "float32"
    assert load_settings(env).vector_form == "int8"
    with pytest.raises(SettingsError, match="MUNINN_VECTOR_FORM='float16' must be int8 or float32"):
        load_settings({**env, "MUNINN_VECTOR_FORM": "float16"})
    with pytest.raises(ValueError, match="vector form"):
        VectorCache(1 << 20, form="float16")


def test_sqlite_reads_many_stored_vectors_at_once_as_one_by_one(tmp_path):
    """vec0.read_vectors (the rescoring's read: each vector's bytes cut out of its chunk, all in
    one row) gives what a read of each vector alone gives, across chunks, leaving out ids without
    a vector; bytes that are zeros or no UTF-8 pass as they are."""
    conn = db.connect(tmp_path / "r.db")
    rng = np.random.default_rng(6)
    rows = embeddings(rng, 90)
    rows[7] = np.eye(DIM, dtype=np.float32)[0]  # all but one component 0.0: zero bytes
    rows[8] = np.full(DIM, -1 / np.sqrt(DIM), dtype=np.float32)  # 0xbf... bytes, no UTF-8
    with conn:
        info = vectors.create_index(conn, "m", DIM)
        ids = store.insert_many(conn, [memory_for(KEYS[i % len(KEYS)], i) for i in range(90)], base_stability_days=7,
                                vector_info=info, vectors_=rows.tolist(), now=1000.0)
    store.archive(conn, ids[5], "test")
    wanted = ids[::-1] + [ids[3], 10**9]  # any order, a repeat, an unknown id
    got = vectors.read_vectors(conn, info, wanted)
    alone = {mid: vectors.read_vector(conn, info, mid) for mid in set(wanted)}
    assert set(got) == {mid for mid, vector in alone.items() if vector is not None} and ids[5] not in got
    assert all(np.array_equal(got[mid], alone[mid]) for mid in got)
    assert np.array_equal(got[ids[7]], rows[7]) and np.array_equal(got[ids[8]], rows[8])
    conn.close()



def fill_keys(side: Side, rng: np.random.Generator, counts: dict[str, int]) -> None:
    """`counts[key]` vectors under each key, interleaved as a community writes them."""
    order = [key for key, count in counts.items() for _ in range(count)]
    rng.shuffle(order)
    for i, (key, row) in enumerate(zip(order, embeddings(rng, len(order)), strict=True)):
        side.insert(key, row.tolist(), i)


def test_a_key_whose_arrays_exceed_the_budget_is_searched_in_the_store_and_evicts_nothing(make_side, backend):
    """The busy channel's key: its int8 vectors alone fit the budget, its arrays (ids, times,
    scales, free rows: what the budget counts) do not. Loaded, it evicted every other key and
    was evicted by the next one loaded, so every key was read again and again; it is too big."""
    rng = np.random.default_rng(11)
    side = make_side("int8", 64 << 20)
    fill_keys(side, rng, {"r:1": 200, "g": 20, "r:2": 20})
    side.cache.budget_bytes = 200 * DIM + 100  # the busy key's int8 vectors, not its arrays
    assert side.cache.key_bytes(200, DIM) > side.cache.budget_bytes
    q = embeddings(rng, 20)[0]
    for keys in (["g"], ["r:2"], ["g", "r:2", "r:1"], ["g", "r:2", "r:1"]):
        assert side.search(q.tolist(), keys, 10) == [(m, pytest.approx(d, abs=1e-5))
                                                     for m, d in exact_knn(side, q, keys, 10)]
    assert sorted(side.cache.cached_keys()) == ["g", "r:2"]
    assert side.cache.nbytes <= side.cache.budget_bytes


def test_a_big_key_is_counted_before_it_is_read_for_the_background_load(make_side, backend, monkeypatch):
    """A key too big for the budget, loaded in the background: counted up to what fits, never
    read whole (a busy channel's key is seconds of reading), and not tried again at the next search."""
    from bot.memory.vectors import keys as cache_keys
    monkeypatch.setattr(cache_keys, "INLINE_LOAD_MAX", 10)
    rng = np.random.default_rng(12)
    side = make_side("int8", 64 << 20)
    fill_keys(side, rng, {"r:1": 120, "g": 20})
    side.cache.budget_bytes = side.cache.key_bytes(40, DIM)
    assert side.cache.fitting_rows(DIM) == 40
    loads: list[str] = []
    real_load = side.cache.source.load_key
    monkeypatch.setattr(side.cache.source, "load_key", lambda c, i, key: loads.append(key) or real_load(c, i, key))
    jobs: list[Callable[[Any], object]] = []
    side.cache.background = jobs.append
    q = embeddings(rng, 20)[0]
    for _ in range(2):
        assert side.search(q.tolist(), ["g", "r:1"], 10) == [(m, pytest.approx(d, abs=1e-5))
                                                             for m, d in exact_knn(side, q, ["g", "r:1"], 10)]
        while jobs:
            jobs.pop()(side.connection)
    assert loads.count("r:1") == 0 and "g" in loads
    assert side.cache.cached_keys() == ["g"]


@pytest.mark.parametrize("backend", ["postgresql"], indirect=True)
def test_postgresql_loads_a_cold_key_of_a_few_hundred_vectors_in_the_background(make_side, backend):
    """On PostgreSQL a load brings each vector over the connection, many times the server's scan
    of them: a cold key of more than the source's `inline_load_max` is searched in the server and
    loaded on the loader thread, not inside the search that met it, and only when met again soon
    (admission.SecondHit): met once, it loads nothing and evicts nothing."""
    from bot.memory.postgres.vector_source import PostgresVectorSource
    from bot.memory.vectors import keys as cache_keys
    most = PostgresVectorSource.inline_load_max
    assert most < cache_keys.INLINE_LOAD_MAX
    rng = np.random.default_rng(13)
    side = make_side("int8", 64 << 20)
    fill_keys(side, rng, {"r:1": most + 20, "g": 10})
    jobs: list[Callable[[Any], object]] = []
    side.cache.background = jobs.append
    q = embeddings(rng, 20)[0]
    expected = [(m, pytest.approx(d, abs=1e-5)) for m, d in exact_knn(side, q, ["g", "r:1"], 10)]
    assert side.search(q.tolist(), ["g", "r:1"], 10) == expected
    assert side.cache.cached_keys() == ["g"] and not jobs  # met once: r:1 answered by the server
    assert side.search(q.tolist(), ["g", "r:1"], 10) == expected
    assert side.cache.cached_keys() == ["g"] and len(jobs) == 1  # met again: loaded in the background
    jobs.pop()(side.connection)
    assert sorted(side.cache.cached_keys()) == ["g", "r:1"]
    assert side.search(q.tolist(), ["g", "r:1"], 10) == expected and not jobs


def test_after_the_warm_a_load_evicts_the_smallest_keys_first(make_side, backend):
    """The warm loads the biggest keys first; left in that order, the biggest was the first evicted
    for a small key a recall loaded (and reloaded slowly on its next search)."""
    rng = np.random.default_rng(14)
    side = make_side("int8", 64 << 20)
    fill_keys(side, rng, {"r:1": 120, "g": 60, "r:2": 30, "p:7:1": 20})
    side.cache.budget_bytes = sum(side.cache.key_bytes(n, DIM) for n in (120, 60, 30)) + 100
    assert side.cache.warm(side.connection, side.index()) == 3  # the three biggest fit
    q = embeddings(rng, 20)[0]
    assert side.search(q.tolist(), ["p:7:1"], 5) == [(m, pytest.approx(d, abs=1e-5))
                                                     for m, d in exact_knn(side, q, ["p:7:1"], 5)]
    assert sorted(side.cache.cached_keys()) == ["g", "p:7:1", "r:1"]  # r:2, the smallest, made room
