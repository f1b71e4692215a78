"""The vector search: numpy over per-key vectors (vector_cache) answers exactly like sqlite-vec,
stays in step with every write (own transaction, other connections, rollbacks), and old
bucketed databases are upgraded to per-key partitions."""
from __future__ import annotations

import asyncio

import numpy as np
import pytest

from bot.memory.engine import Engine
from bot.memory.records import NewMemory
from bot.memory.scope import Viewer
from bot.memory.sql import queries, store
from bot.memory.sqlite import db
from bot.memory.sqlite import vec0 as vectors
from bot.memory.vectors.cache import VectorCache
from bot.memory.writing import facts as fact_writes

# sqlite-vec's vec0 table, its layout upgrades and the in-process vector cache that mirrors it.
# Vector recall on both backends: test_retrieval.py, test_scope.py, test_scope_change.py.
pytestmark = pytest.mark.sqlite_only("vec0 and the SQLite vector cache (vectors.py, vector_cache.py)")

DIM = 8
KEYS = ["g", "r:1", "r:2", "p:7:dm", "p:7:1"]


def random_unit(rng: np.random.Generator) -> list[float]:
    v = rng.standard_normal(DIM)
    return (v / np.linalg.norm(v)).tolist()


def fill(conn, rng: np.random.Generator, count: int) -> vectors.IndexInfo:
    with conn:
        info = vectors.index_info(conn) or vectors.create_index(conn, "m", DIM)
        for i in range(count):
            key = KEYS[int(rng.integers(0, len(KEYS))) if i % 3 else 1]  # r:1 is the busy one
            scope = {"g": "global", "r": "room", "p": "personal"}[key[0]]
            memory = NewMemory(f"memory {i}", scope, owner_id=7, channel_id=int(key[2:]) if key[0] == "r" else None,
                               guild_id=1 if key == "p:7:1" else None)
            assert memory.vis_key == key
            store.insert_many(conn, [memory], base_stability_days=7, vector_info=info,
                              vectors_=[random_unit(rng)], now=1000.0 + i)
    return info


def same(cached, exact) -> bool:
    return [m for m, _ in cached] == [m for m, _ in exact] and np.allclose(
        [d for _, d in cached], [d for _, d in exact], atol=1e-5)


def test_cache_answers_like_vec0_with_filters(pair):
    cached, plain = pair
    rng = np.random.default_rng(1)
    info = fill(plain, rng, 300)
    for trial in range(20):
        q = random_unit(rng)
        keys = list(rng.choice(KEYS, size=int(rng.integers(1, 4)), replace=False))
        as_of = None if trial % 2 else 1000.0 + float(rng.integers(0, 300))
        assert same(vectors.knn(cached, info, q, keys, 10, as_of), vectors.knn_vec0(plain, info, q, keys, 10, as_of))
    assert set(vectors.cache_of(cached).cached_keys()) == set(KEYS)


def test_cache_follows_writes_of_other_connections(pair):
    cached, plain = pair
    rng = np.random.default_rng(2)
    info = fill(plain, rng, 120)
    q = random_unit(rng)
    vectors.knn(cached, info, q, KEYS, 5)  # every key loaded
    nearest = vectors.knn_vec0(plain, info, q, ["r:1"], 1)[0][0]
    store.archive(plain, nearest, "test")                       # removed elsewhere
    newest = fill(plain, rng, 1) and queries.query_value(plain, "SELECT max(id) FROM memories")
    with plain:
        store.set_vector(plain, info, newest, q)                # a replaced vector, exactly the query
    got = vectors.knn(cached, info, q, KEYS, 5)
    assert got[0][0] == newest and nearest not in [m for m, _ in got]
    assert same(got, vectors.knn_vec0(plain, info, q, KEYS, 5))


def test_open_transaction_is_searched_exactly_and_a_rollback_leaves_no_trace(pair):
    cached, plain = pair
    rng = np.random.default_rng(3)
    info = fill(cached, rng, 60)
    q = random_unit(rng)
    vectors.knn(cached, info, q, KEYS, 5)

    class Abort(Exception):
        pass
    with pytest.raises(Abort):
        with cached:
            new_id = store.insert_many(cached, [NewMemory("x", "room", channel_id=2)], base_stability_days=7,
                                       vector_info=info, vectors_=[q])[0]
            inside = vectors.knn(cached, info, q, ["r:2"], 3)
            assert inside[0][0] == new_id and inside[0][1] < 1e-3  # its own write, not yet committed
            raise Abort
    after = vectors.knn(cached, info, q, ["r:2"], 3)
    assert new_id not in [m for m, _ in after]
    assert same(after, vectors.knn_vec0(plain, info, q, ["r:2"], 3))
    fill(cached, rng, 30)  # later commits reuse the rolled-back sequence numbers: still in step
    assert same(vectors.knn(cached, info, q, KEYS, 8), vectors.knn_vec0(plain, info, q, KEYS, 8))


def test_a_key_beyond_the_memory_budget_is_searched_in_vec0(tmp_path):
    conn = db.connect(tmp_path / "v.db")
    vectors.attach_cache(conn, VectorCache(DIM * 4 * 10))  # room for 10 vectors
    rng = np.random.default_rng(4)
    info = fill(conn, rng, 90)
    plain = db.connect(tmp_path / "v.db")
    q = random_unit(rng)
    assert same(vectors.knn(conn, info, q, KEYS, 7), vectors.knn_vec0(plain, info, q, KEYS, 7))
    assert "r:1" not in vectors.cache_of(conn).cached_keys()
    assert vectors.cache_of(conn).nbytes <= DIM * 4 * 10 + 2000


def test_a_key_too_big_for_the_budget_is_not_read_again_at_each_new_vector(tmp_path, monkeypatch):
    """A busy channel's key beyond the budget: its every new message cleared the mark, so the
    next search read the whole key again only to find it still too big."""
    from bot.memory.vectors import keys as cache_keys
    conn = db.connect(tmp_path / "v.db")
    cache = VectorCache(DIM * 4 * 10)
    vectors.attach_cache(conn, cache)
    rng = np.random.default_rng(4)
    info = fill(conn, rng, 90)
    plain = db.connect(tmp_path / "v.db")
    loads: list[str] = []
    real_load = cache.source.load_key
    monkeypatch.setattr(cache.source, "load_key", lambda c, i, key: loads.append(key) or real_load(c, i, key))
    for _ in range(3):
        fill(plain, rng, 3)  # r:1 (the busy one) gets a new vector each time
        q = random_unit(rng)
        assert same(vectors.knn(conn, info, q, KEYS, 7), vectors.knn_vec0(plain, info, q, KEYS, 7))
    assert loads.count("r:1") <= 1 and "r:1" not in cache.cached_keys()
    before = loads.count("r:1")
    monkeypatch.setattr(cache_keys, "TOO_BIG_RETRY_S", 0.0)  # after a while (removals may make it fit): tried again
    vectors.knn(conn, info, random_unit(rng), KEYS, 7)
    assert loads.count("r:1") == before + 1


def test_neighbours_in_one_product_match_one_search_each(pair):
    cached, plain = pair
    rng = np.random.default_rng(5)
    info = fill(plain, rng, 200)
    items = [(mid, key) for mid, key in plain.execute("SELECT id, vis_key FROM memories ORDER BY id")]
    batched = vectors.neighbours_many(cached, info, items, 4)
    for memory_id, key in items[::7]:
        assert same(batched[memory_id], vectors.similar_to_memory(plain, info, memory_id, [key], 4))


async def test_an_old_bucketed_database_is_upgraded_at_start(tmp_path, fake_ollama, make_settings):
    path = tmp_path / "muninn.db"
    conn = db.connect(path)
    rng = np.random.default_rng(6)
    with conn:  # the layout of databases made before per-key partitions
        conn.execute("CREATE VIRTUAL TABLE vec_memories USING vec0(memory_id INTEGER PRIMARY KEY, bucket INTEGER "
                     "PARTITION KEY, vis_key TEXT, created_at FLOAT, embedding FLOAT[768], chunk_size=32)")
        for key, value in (("embed_model", "nomic-embed-text"), ("embed_dim", "768"), ("vec_buckets", "256")):
            queries.set_meta(conn, key, value)
        for i in range(20):
            memory_id = store.insert_many(conn, [NewMemory(f"old fact number {i}", "personal", owner_id=1)],
                                          base_stability_days=7)[0]
            v = rng.standard_normal(768).astype(np.float32)
            conn.execute("INSERT INTO vec_memories(memory_id, bucket, vis_key, created_at, embedding) "
                         "VALUES (?, 3, 'p:1:dm', 0.0, ?)", (memory_id, (v / np.linalg.norm(v)).tobytes()))
            conn.execute("UPDATE memories SET embedded = 1 WHERE id = ?", (memory_id,))
    conn.close()
    async with Engine(make_settings(fake_ollama.url)) as engine:
        assert await engine.write(queries.get_meta, "vec_layout") == vectors.LAYOUT
        assert await engine.write(queries.query_value, "SELECT count(DISTINCT partition00) FROM vec_memories_chunks") == 1
        assert await engine.write(queries.query_value, "SELECT count(*) FROM memories WHERE embedded = 1") == 20
        result = await engine.recall("old fact number 3", Viewer(1, dm=True))
        assert result.mode == "hybrid" and len(result.ids) > 0
    async with Engine(make_settings(fake_ollama.url)) as engine:  # a second start moves nothing
        assert not await engine.write(vectors.needs_upgrade)


async def test_recall_searches_on_read_connections_beside_an_open_write(engine):
    """A write transaction held open on the writer does not stop a recall."""
    memory_id = await engine.remember(NewMemory("the lighthouse keeper feeds gulls", "global", owner_id=1))
    import asyncio
    import threading
    release = threading.Event()

    def hold(conn):
        with conn:
            conn.execute("UPDATE memories SET importance = importance WHERE id = ?", (memory_id,))
            release.wait(5)
    holder = asyncio.ensure_future(engine.write(hold))
    await asyncio.sleep(0.05)
    result = await asyncio.wait_for(engine.recall("lighthouse gulls", Viewer(2, dm=True), touch=False), 2)
    release.set()
    await holder
    assert result.ids == [memory_id]


def test_a_cache_behind_a_pruned_change_log_starts_over(pair):
    cached, plain = pair
    rng = np.random.default_rng(7)
    info = fill(plain, rng, 40)
    q = random_unit(rng)
    vectors.knn(cached, info, q, KEYS, 5)
    fill(plain, rng, 40)
    assert vectors.prune_changes(plain, keep=3) > 0  # the cache never saw the pruned changes
    assert same(vectors.knn(cached, info, q, KEYS, 9), vectors.knn_vec0(plain, info, q, KEYS, 9))


async def test_personal_keys_are_found_through_the_index(fts_engine):
    from bot.memory.scope import personal_keys
    await fts_engine.remember_many([NewMemory(f"fact {i}", "personal", owner_id=4, guild_id=i % 3 or None)
                                    for i in range(30)])
    await fts_engine.remember(NewMemory("other", "personal", owner_id=5))
    assert await fts_engine.read(personal_keys, 4) == ["p:4:1", "p:4:2", "p:4:dm"]
    assert await fts_engine.read(personal_keys, 6) == []


async def test_a_fact_write_reuses_the_planning_search_only_if_no_vector_changed(engine):
    await engine.remember(NewMemory("the index exists now", "global", owner_id=1))
    rng = np.random.default_rng(8)
    v = rng.standard_normal(768)
    vec = (v / np.linalg.norm(v)).tolist()
    settings = engine.settings

    async def plan(memory):
        return await engine.read(fact_writes.plan_updates, settings.embed_model, [memory], [vec], settings, ["Carol"])

    async def write(memory, planned):
        return await engine.write(fact_writes.write_facts, [memory], [vec], [None], settings=settings, now=1e9,
                                  searched=planned[1], searched_mark=planned[2])
    first = NewMemory("Carol keeps bees", "room", channel_id=7, guild_id=1)
    planned = await plan(first)
    assert planned[1] == [[]] and (await write(first, planned)).inserted  # nothing near yet: stored
    again = NewMemory("Carol has beehives", "room", channel_id=7, guild_id=1)
    planned = await plan(again)  # finds the first one (same vector): a duplicate
    assert planned[1][0][0][0] == (await write(again, planned)).reinforced[0]
    late = NewMemory("Carol tends bee colonies", "room", channel_id=8, guild_id=1)
    planned = await plan(late)  # channel 8 is empty when planned ...
    def sneak(conn):  # ... then a vector arrives there before the write
        info = vectors.current_index(conn, settings.embed_model)
        return store.insert_many(conn, [NewMemory("Carol's bee colonies", "room", channel_id=8, guild_id=1)],
                                 base_stability_days=7, vector_info=info, vectors_=[vec])[0]
    sneaked = await engine.write(sneak)
    assert (await write(late, planned)).reinforced == [sneaked]  # the stale search was not reused


def test_a_key_loading_elsewhere_is_searched_in_vec0_and_changes_meanwhile_are_caught_up(pair, tmp_path, monkeypatch):
    """The load runs outside the cache's lock: a search on another connection goes on meanwhile
    (the loading key from vec0), and what it applied while the loaded rows were read is applied
    to them before they are published."""
    cached, plain = pair
    rng = np.random.default_rng(11)
    info = fill(plain, rng, 150)
    cache = vectors.cache_of(cached)
    other = db.connect(tmp_path / "v.db")
    vectors.attach_cache(other, cache)
    q = random_unit(rng)
    real_load = vectors.load_key
    seen_during: list = []

    def slow_load(conn, info_, key):
        loaded = real_load(conn, info_, key)  # the rows as they were when the load read them
        if key == "r:1" and not seen_during:
            nearest = vectors.knn_vec0(plain, info, q, ["r:1"], 1)[0][0]
            store.archive(plain, nearest, "test")
            newest = fill(plain, rng, 1) and queries.query_value(plain, "SELECT max(id) FROM memories")
            with plain:
                store.set_vector(plain, info, newest, q)
            seen_during.append(vectors.knn(other, info, q, KEYS, 5))  # syncs the change, r:1 from vec0
        return loaded

    monkeypatch.setattr(vectors, "load_key", slow_load)
    try:
        got = vectors.knn(cached, info, q, ["r:1"], 5)
        assert same(seen_during[0], vectors.knn_vec0(plain, info, q, KEYS, 5))
        assert same(got, vectors.knn_vec0(plain, info, q, ["r:1"], 5))
        assert "r:1" in cache.cached_keys()
        assert same(vectors.knn(cached, info, q, KEYS, 9), vectors.knn_vec0(plain, info, q, KEYS, 9))
    finally:
        other.close()


def test_a_big_cold_key_is_searched_in_vec0_while_the_loader_loads_it(pair, monkeypatch):
    """Keys above INLINE_LOAD_MAX vectors go to the background loader; vec0 answers meanwhile,
    and a small key still loads inline."""
    from bot.memory.vectors import keys as cache_keys
    cached, plain = pair
    rng = np.random.default_rng(12)
    info = fill(plain, rng, 120)
    cache = vectors.cache_of(cached)
    jobs: list = []
    cache.background = jobs.append
    monkeypatch.setattr(cache_keys, "INLINE_LOAD_MAX", 30)  # r:1 holds ~50: big; the others are small
    q = random_unit(rng)
    assert same(vectors.knn(cached, info, q, KEYS, 7), vectors.knn_vec0(plain, info, q, KEYS, 7))
    assert "r:1" not in cache.cached_keys() and set(cache.cached_keys()) == set(KEYS) - {"r:1"}
    assert len(jobs) == 1
    vectors.knn(cached, info, q, KEYS, 7)
    assert len(jobs) == 1  # loading already: not queued twice
    jobs[0](plain)
    assert set(cache.cached_keys()) == set(KEYS)
    assert same(vectors.knn(cached, info, q, KEYS, 7), vectors.knn_vec0(plain, info, q, KEYS, 7))


async def test_the_engine_loads_a_big_cold_key_on_its_loader_thread(tmp_path, make_settings, monkeypatch):
    import threading

    from bot.memory.vectors import keys as cache_keys
    monkeypatch.setattr(cache_keys, "INLINE_LOAD_MAX", 25)  # r:1 holds ~40, g ~10
    real_load, loaded_on = vectors.load_key, {}

    def load_key(conn, info, key):
        loaded_on[key] = threading.current_thread().name
        return real_load(conn, info, key)
    monkeypatch.setattr(vectors, "load_key", load_key)
    rng = np.random.default_rng(13)
    conn = db.connect(tmp_path / "muninn.db")
    fill(conn, rng, 90)
    conn.close()
    async with Engine(make_settings(OLLAMA_EMBED_MODEL="m"), warm=False) as engine:
        q = random_unit(rng)
        viewer = Viewer(9, channel_id=1, guild_id=1)  # sees g and r:1
        first = await engine.recall("nothing", viewer, query_vector=q, touch=False)
        for _ in range(100):
            if "r:1" in engine.vector_cache.cached_keys():
                break
            await asyncio.sleep(0.02)
        assert "r:1" in engine.vector_cache.cached_keys()
        again = await engine.recall("nothing", viewer, query_vector=q, touch=False)
        assert again.ids == first.ids and first.ids
        assert loaded_on["r:1"].startswith("muninn-vecload") and loaded_on["g"].startswith("muninn-read")

