"""The vector cache on PostgreSQL (postgres/vector_source.py): it answers like the server's exact
search and stays in step with every write: other connections and engines, an open
transaction's own rows, rollbacks, transactions that commit out of `seq` order, a pruned log."""
from __future__ import annotations

import json
import threading
from typing import Iterator

import numpy as np
import pytest

from bot.memory.engine import Engine
from bot.memory.postgres import vector_source
from bot.memory.postgres.backend import PostgresStorage
from bot.memory.postgres.connection import PgConnection
from bot.memory.records import NewMemory
from bot.memory.scope import Viewer
from bot.memory.sqlite import vec0 as vectors
from bot.memory.vectors.cache import VectorCache
from bot.memory.vectors.index import cosine_from_distance

DIM = 8
KEYS = ["g", "r:1", "r:2", "p:7:dm", "p:7:1"]


def random_unit(rng: np.random.Generator) -> list[float]:
    v = rng.standard_normal(DIM)
    return (v / np.linalg.norm(v)).tolist()


def memory_for(key: str, i: int) -> NewMemory:
    scope = {"g": "global", "r": "room", "p": "personal"}[key[0]]
    return NewMemory(f"memory {i}", scope, owner_id=7, channel_id=int(key[2:]) if key[0] == "r" else None,
                     guild_id=1 if key == "p:7:1" else None)


def fill(storage: PostgresStorage, conn: PgConnection, rng: np.random.Generator, count: int) -> vectors.IndexInfo:
    for i in range(count):
        key = KEYS[int(rng.integers(0, len(KEYS))) if i % 3 else 1]  # r:1 is the busy one
        storage.insert(conn, [memory_for(key, i)], base_stability_days=7, model="m", vecs=[random_unit(rng)],
                       now=1000.0 + i)
    info = storage.index_info(conn)
    assert info is not None
    return info


def filled_and_loaded(pg_pair, seed: int, count: int) -> tuple[np.random.Generator, vectors.IndexInfo, list[float]]:
    """`count` vectors stored through the plain backend, then one search through the cached one
    (every key loaded); the generator, the index and that search's query."""
    cached, conn, plain, other = pg_pair
    rng = np.random.default_rng(seed)
    info = fill(plain, other, rng, count)
    q = random_unit(rng)
    cached.knn(conn, info, q, KEYS, 5)
    return rng, info, q


def same(cached: list[tuple[int, float]], exact: list[tuple[int, float]]) -> bool:
    return [m for m, _ in cached] == [m for m, _ in exact] and np.allclose(
        [d for _, d in cached], [d for _, d in exact], atol=1e-5)


@pytest.fixture
def pg_pair(postgres_url: str) -> Iterator[tuple[PostgresStorage, PgConnection, PostgresStorage, PgConnection]]:
    """A storage searching through a vector cache, and a plain one on its own connection (another process)."""
    cached = PostgresStorage(postgres_url, VectorCache(64 << 20))
    plain = PostgresStorage(postgres_url)
    cached_conn, plain_conn = cached.open_writer(), plain.open_writer()
    yield cached, cached_conn, plain, plain_conn
    cached_conn.close()
    plain_conn.close()


def test_the_cache_answers_like_the_servers_exact_search(pg_pair):
    cached, conn, plain, other = pg_pair
    rng = np.random.default_rng(1)
    info = fill(plain, other, rng, 200)
    for trial in range(12):
        q = random_unit(rng)
        keys = list(rng.choice(KEYS, size=int(rng.integers(1, 4)), replace=False))
        as_of = None if trial % 2 else 1000.0 + float(rng.integers(0, 200))
        assert same(cached.knn(conn, info, q, keys, 10, as_of), plain._server_knn(other, info, q, keys, 10, as_of))
    assert cached.vector_cache is not None and set(cached.vector_cache.cached_keys()) == set(KEYS)
    items = [(int(mid), str(key)) for mid, key in other.pg.execute("SELECT id, vis_key FROM memories ORDER BY id")]
    batched = cached.neighbours_many(conn, info, items, 4)
    for memory_id, key in items[::9]:
        server = [(mid, cosine_from_distance(d)) for mid, d in
                  plain._server_similar(other, info, memory_id, [key], 4)]
        assert [m for m, _ in batched[memory_id]] == [m for m, _ in server]


def test_a_key_loads_a_batch_at_a_time_exactly_as_stored(pg_pair, monkeypatch):
    monkeypatch.setattr(vector_source, "LOAD_ROWS", 7)
    cached, conn, plain, other = pg_pair
    info = fill(plain, other, np.random.default_rng(4), 60)
    assert cached.vector_cache is not None
    ids, created, matrix = cached.vector_cache.source.load_key(conn, info, "r:1")
    stored = {int(m): (float(c), json.loads(e)) for m, c, e in other.pg.execute(
        "SELECT memory_id, created_at, embedding::text FROM memory_vectors WHERE vis_key = 'r:1'")}
    assert len(ids) == len(stored) > 2 * 7 and set(ids.tolist()) == set(stored)
    for row, memory_id in enumerate(ids.tolist()):
        assert created[row] == stored[memory_id][0]
        assert np.allclose(matrix[row], stored[memory_id][1])
    assert conn.get_autocommit()  # the load's transaction is over


def test_other_connections_writes_and_out_of_order_commits_are_seen(pg_pair, postgres_url):
    cached, conn, plain, other = pg_pair
    rng, info, q = filled_and_loaded(pg_pair, 2, 90)  # every key loaded
    nearest = plain._server_knn(other, info, q, ["r:1"], 1)[0][0]
    plain.archive(other, nearest, "test")                             # removed elsewhere
    replaced = plain._server_knn(other, info, q, ["r:2"], 3)[-1][0]
    plain.store_vectors(other, "m", [replaced], [q])                  # a replaced vector, exactly the query
    got = cached.knn(conn, info, q, KEYS, 5)
    assert got[0][0] == replaced and nearest not in [m for m, _ in got]
    assert same(got, plain._server_knn(other, info, q, KEYS, 5))
    # PostgreSQL numbers log rows at insert: the first transaction to log commits last.
    late_conn = PostgresStorage(postgres_url).open_writer()
    try:
        with late_conn.pg.transaction():
            late = plain.insert(late_conn, [memory_for("g", 1)], base_stability_days=7, model="m", vecs=[q], now=None)[0]
            early = plain.insert(other, [memory_for("r:1", 2)], base_stability_days=7, model="m",
                                 vecs=[random_unit(rng)], now=None)[0]
            assert early in [m for m, _ in cached.knn(conn, info, q, KEYS, 200)]   # the committed one: seen
            assert late not in [m for m, _ in cached.knn(conn, info, q, KEYS, 200)]
        assert cached.knn(conn, info, q, ["g"], 1)[0][0] == late  # committed after a later seq: seen too
        plain.delete(late_conn, [late])                             # and removed by a cascade
        assert same(cached.knn(conn, info, q, KEYS, 9), plain._server_knn(other, info, q, KEYS, 9))
    finally:
        late_conn.close()


def test_an_open_transaction_is_searched_exactly_and_a_rollback_leaves_no_trace(pg_pair):
    cached, conn, plain, other = pg_pair
    rng = np.random.default_rng(3)
    info = fill(cached, conn, rng, 60)
    q = random_unit(rng)
    cached.knn(conn, info, q, KEYS, 5)

    class Abort(Exception):
        pass
    with pytest.raises(Abort):
        with conn.pg.transaction():
            new_id = cached.insert(conn, [memory_for("r:2", 0)], base_stability_days=7, model="m", vecs=[q], now=None)[0]
            inside = cached.knn(conn, info, q, ["r:2"], 3)
            assert inside[0][0] == new_id and inside[0][1] < 1e-3  # its own write, not yet committed
            assert cached.vector_cache is not None
            assert cached.vector_cache.cosines(conn, info, q, [new_id]) == {}  # never in the shared cache
            raise Abort
    after = cached.knn(conn, info, q, ["r:2"], 3)
    assert new_id not in [m for m, _ in after]
    assert same(after, plain._server_knn(other, info, q, ["r:2"], 3))
    fill(plain, other, rng, 20)
    assert same(cached.knn(conn, info, q, KEYS, 8), plain._server_knn(other, info, q, KEYS, 8))


def test_a_cache_behind_a_pruned_log_starts_over_and_one_that_saw_it_does_not(pg_pair):
    cached, conn, plain, other = pg_pair
    rng, info, q = filled_and_loaded(pg_pair, 7, 40)  # every key loaded
    cache = cached.vector_cache
    assert cache is not None
    fill(plain, other, rng, 40)
    assert vectors.prune_changes(other, keep=3) > 0  # type: ignore[arg-type]  # the cache never saw them
    generation = cache._generation
    assert same(cached.knn(conn, info, q, KEYS, 9), plain._server_knn(other, info, q, KEYS, 9))
    assert cache._generation == generation + 1  # started over
    fill(plain, other, rng, 5)
    cached.knn(conn, info, q, KEYS, 5)
    assert vectors.prune_changes(other, keep=2) > 0  # type: ignore[arg-type]  # all of them seen already
    assert same(cached.knn(conn, info, q, KEYS, 9), plain._server_knn(other, info, q, KEYS, 9))
    assert cache._generation == generation + 1


async def test_two_engines_see_each_others_writes_at_the_next_recall(fake_ollama, make_settings, postgres_url):
    settings = make_settings(fake_ollama.url, MUNINN_DATABASE_URL=postgres_url)
    async with Engine(settings) as one, Engine(settings) as two:
        first = await one.remember(NewMemory("the raven Huginn flies at dawn", "global", owner_id=1))
        viewer = Viewer(3, dm=True)
        assert first in (await two.recall("raven Huginn", viewer, touch=False)).ids
        assert "g" in two.vector_cache.cached_keys()  # answered by the cache
        second = await two.remember(NewMemory("the raven Muninn flies at dusk", "global", owner_id=1))
        assert second in (await one.recall("raven Muninn dusk", viewer, touch=False)).ids
        await one.forget([second])
        again = await two.recall("raven Muninn dusk", viewer, touch=False)
        assert second not in again.ids and first in again.ids
        await two.archive(first, "test")
        vector = (await one.ollama.embed(["the raven Huginn flies at dawn"]))[0]
        found = await one.read(lambda conn: one.storage.knn(conn, one.storage.index_info(conn), vector, ["g"], 5))
        assert found == []


async def test_start_warms_the_cache_on_postgresql(fake_ollama, make_settings, postgres_url):
    settings = make_settings(fake_ollama.url, MUNINN_DATABASE_URL=postgres_url)
    async with Engine(settings, warm=False) as writer:
        await writer.remember_many([NewMemory(f"fact {i}", "room", channel_id=i % 3 + 1, guild_id=1)
                                    for i in range(12)])
    async with Engine(settings) as engine:
        assert await engine.warmed() == 3
        assert set(engine.vector_cache.cached_keys()) == {"r:1", "r:2", "r:3"}
        result = await engine.recall("fact 4", Viewer(3, channel_id=2, guild_id=1), touch=False)
        assert result.ids and {r.memory.vis_key for r in result.memories} == {"r:2"}


def test_postgresqls_neighbour_walk_lends_like_the_portable_one(pg_pair):
    """backend.spread_to_neighbours (its own statement) against retrieval's portable SQL on the
    same rows: the same loans, with and without as_of, archived memories skipped."""
    from bot.memory.recall import retrieval
    from bot.memory.recall.retrieval import Candidate
    _, conn, plain, other = pg_pair
    rng = np.random.default_rng(9)
    for i in range(120):
        key = KEYS[int(rng.integers(0, 3))]
        plain.insert(other, [memory_for(key, i)], base_stability_days=7, model="m", vecs=None,
                     now=1000.0 + 900.0 * i + float(rng.integers(0, 900)))
    for memory_id in rng.choice(np.arange(1, 121), size=15, replace=False).tolist():
        plain.archive(other, int(memory_id), "test")
    for trial in range(6):
        chosen = rng.choice(np.arange(1, 121), size=25, replace=False).tolist()

        def ranked(chosen: list[int] = chosen) -> list[Candidate]:
            return [Candidate(int(mid), fused=1.0 / (rank + 1)) for rank, mid in enumerate(chosen)]
        as_of = None if trial % 2 else 1000.0 + 900.0 * float(rng.integers(20, 120))
        ours = plain.spread_to_neighbours(conn, ranked(), KEYS[:3], 0.5, as_of)
        portable = retrieval.spread_to_neighbours(conn, ranked(), KEYS[:3], 0.5, as_of)  # type: ignore[arg-type]
        assert [(c.memory_id, round(c.fused, 9), c.neighbour_of) for c in ours] == \
               [(c.memory_id, round(c.fused, 9), c.neighbour_of) for c in portable]
        assert any(c.neighbour_of for c in ours) or trial


def test_after_a_warm_an_empty_key_needs_no_read_until_it_gets_a_vector(pg_pair):
    import threading
    cached, conn, plain, other = pg_pair
    rng = np.random.default_rng(10)
    for i in range(30):  # vectors under g, r:1 and r:2 only: p:7:dm and p:7:1 stay empty
        plain.insert(other, [memory_for(KEYS[i % 3], i)], base_stability_days=7, model="m",
                     vecs=[random_unit(rng)], now=1000.0 + i)
    info = plain.index_info(other)
    assert info is not None
    cache = cached.vector_cache
    assert cache is not None
    assert cached.warm(conn, info, threading.Event()) == 3
    reads: list[str] = []
    source = cache.source
    real_size, real_load = source.key_size_at_least, source.load_key
    source.key_size_at_least = lambda *a: reads.append("size") or real_size(*a)  # type: ignore[method-assign]
    source.load_key = lambda *a: reads.append("load") or real_load(*a)  # type: ignore[method-assign]
    q = random_unit(rng)
    assert cached.knn(conn, info, q, ["p:7:dm", "p:7:1"], 3) == [] and reads == []
    assert same(cached.knn(conn, info, q, ["g", "p:7:dm"], 5), plain._server_knn(other, info, q, ["g"], 5))
    assert reads == []
    new_id = plain.insert(other, [memory_for("p:7:dm", 1)], base_stability_days=7, model="m", vecs=[q], now=None)[0]
    assert cached.knn(conn, info, q, ["p:7:dm", "p:7:1"], 3)[0][0] == new_id  # its first vector: read now
    assert reads == ["load"]


def test_a_key_beyond_the_memory_budget_is_searched_in_the_server(postgres_url):
    small = PostgresStorage(postgres_url, VectorCache(DIM * 4 * 10))  # room for 10 vectors
    plain = PostgresStorage(postgres_url)
    conn, other = small.open_writer(), plain.open_writer()
    try:
        rng = np.random.default_rng(4)
        info = fill(plain, other, rng, 90)
        q = random_unit(rng)
        assert same(small.knn(conn, info, q, KEYS, 7), plain._server_knn(other, info, q, KEYS, 7))
        assert small.vector_cache is not None and "r:1" not in small.vector_cache.cached_keys()
        assert small.vector_cache.nbytes <= DIM * 4 * 10 + 2000
    finally:
        conn.close()
        other.close()


async def test_the_engine_loads_a_big_cold_key_on_its_loader_thread_on_postgresql(
        fake_ollama, make_settings, postgres_url, monkeypatch):
    import asyncio

    from bot.memory.vectors import keys as cache_keys
    monkeypatch.setattr(cache_keys, "INLINE_LOAD_MAX", 5)
    settings = make_settings(fake_ollama.url, MUNINN_DATABASE_URL=postgres_url)
    async with Engine(settings, warm=False) as engine:
        await engine.remember_many([NewMemory(f"busy fact {i}", "room", channel_id=1, guild_id=1) for i in range(12)])
        await engine.remember_many([NewMemory(f"quiet fact {i}", "global", owner_id=2) for i in range(3)])
        viewer = Viewer(9, channel_id=1, guild_id=1)
        first = await engine.recall("busy fact 3", viewer, touch=False)  # r:1 from the server
        assert "g" in engine.vector_cache.cached_keys() and "r:1" not in engine.vector_cache.cached_keys()
        # met once, not loaded (admission.SecondHit); met again soon: loaded on the loader thread
        assert (await engine.recall("busy fact 3", viewer, touch=False)).ids == first.ids
        for _ in range(100):
            if "r:1" in engine.vector_cache.cached_keys():
                break
            await asyncio.sleep(0.02)
        assert "r:1" in engine.vector_cache.cached_keys()
        again = await engine.recall("busy fact 3", viewer, touch=False)
        assert again.ids == first.ids and first.ids


def test_a_change_pruned_before_the_cache_saw_it_starts_the_cache_over(pg_pair, postgres_url):
    """A long transaction logs a vector's move first (low seq) and commits after newer changes
    the cache already applied; maintenance prunes its row. Nothing is left to read, but the
    cache must not keep the vector under its old key (a personal memory found by everyone)."""
    cached, conn, plain, other = pg_pair
    rng = np.random.default_rng(6)
    info = fill(plain, other, rng, 30)
    q = random_unit(rng)
    target = plain._server_knn(other, info, q, ["g"], 1)[0][0]
    cached.knn(conn, info, q, KEYS, 5)
    late = PostgresStorage(postgres_url).open_writer()
    try:
        with late.pg.transaction():
            late.pg.execute("UPDATE memories SET vis_key = 'p:9:dm' WHERE id = %s", (target,))
            fill(plain, other, rng, 6)              # newer changes, committed first
            cached.knn(conn, info, q, KEYS, 5)      # the cache applies those
        assert vectors.prune_changes(other, keep=3) > 0  # the move's log row goes
        for _ in range(2):
            assert target not in [m for m, _ in cached.knn(conn, info, q, ["g"], 3)]
    finally:
        late.close()


def test_too_many_changes_at_once_start_the_cache_over(pg_pair, monkeypatch):
    from bot.memory.vectors import keys as cache_keys
    cached, conn, plain, other = pg_pair
    rng, info, q = filled_and_loaded(pg_pair, 7, 20)  # every key loaded
    monkeypatch.setattr(cache_keys, "MAX_APPLY", 5)  # as if another process had imported 70k vectors
    fill(plain, other, rng, 12)
    assert same(cached.knn(conn, info, q, KEYS, 5), plain._server_knn(other, info, q, KEYS, 5))


class _HeldPoll:
    """The cache's source, with the change-log read of one thread held until released."""

    def __init__(self, source: object, held: threading.Thread) -> None:
        self.source, self.held = source, held
        self.reading, self.release = threading.Event(), threading.Event()

    def poll(self, *args: object) -> object:
        if threading.current_thread() is self.held:
            self.reading.set()
            self.release.wait(10)
        return self.source.poll(*args)  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> object:
        return getattr(self.source, name)


def test_a_search_does_not_wait_behind_another_threads_read_of_the_change_log(pg_pair):
    # the log is read outside the cache's lock (vector_cache._sync): a search of the process went
    # on while one thread waited for the server's answer, and the change lands once either way
    cached, conn, plain, other = pg_pair
    rng, info, q = filled_and_loaded(pg_pair, 11, 60)  # every key loaded
    cache = cached.vector_cache
    assert cache is not None
    added = plain.insert(other, [memory_for("r:1", 1)], base_stability_days=7, model="m", vecs=[q], now=None)[0]
    slow_conn = cached.open_reader()
    found: dict[str, list[tuple[int, float]]] = {}
    slow = threading.Thread(target=lambda: found.update(slow=cached.knn(slow_conn, info, q, KEYS, 5)))
    held = _HeldPoll(cache.source, slow)
    cache.source = held  # type: ignore[assignment]
    try:
        slow.start()
        assert held.reading.wait(10)
        other_search = threading.Thread(target=lambda: found.update(other=cached.knn(conn, info, q, KEYS, 5)))
        other_search.start()
        other_search.join(5)
        assert not other_search.is_alive() and not held.release.is_set()  # done while the slow read waits
        held.release.set()
        slow.join(10)
    finally:
        held.release.set()
        cache.source = held.source  # type: ignore[assignment]
        slow_conn.close()
    exact = plain._server_knn(other, info, q, KEYS, 5)
    assert found["other"][0][0] == added and same(found["other"], exact) and same(found["slow"], exact)
    entry = cache._keys["r:1"]
    assert int((entry.ids[:entry.n] == added).sum()) == 1  # applied once: no copy beside it
