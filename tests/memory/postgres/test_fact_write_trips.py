"""The round trips a PostgreSQL fact write saves (issue 13, writer processes): its planning search
is reused unless a change under its own keys (or to what it found) landed since; a search inside
the write reads the changed vectors with the change log; planning reads its log once."""
from __future__ import annotations

import numpy as np

from bot.memory.postgres.backend import PostgresStorage
from bot.memory.records import NewMemory
from bot.memory.vectors.cache import VectorCache
from tests.memory.postgres.test_vector_source import KEYS, fill, memory_for, pg_pair, random_unit  # noqa: F401  (fixture)


def begun(storage: PostgresStorage, conn, key: str, mark: str, searched: list[int]) -> bool:
    """Whether begin_fact_write finds the searches of `key` made at `mark` (which found `searched`) still hold."""
    with conn.transaction():
        _, unchanged, _ = storage.begin_fact_write(conn, [key], "m", 3, mark, [], 50, searched)
    return unchanged


def another_writers_fact(pg_pair, seed: int, count: int, key: str, marker: int):  # noqa: F811
    """A cache with every key loaded and the log read, then a fact (its vector the query's) that
    another connection stored under `key` since: (index info, the query, the fact's id, the cache)."""
    cached, conn, plain, other = pg_pair
    rng = np.random.default_rng(seed)
    info = fill(plain, other, rng, count)
    q = random_unit(rng)
    cached.knn(conn, info, q, KEYS, 5)
    (added,) = plain.insert(other, [memory_for(key, marker)], base_stability_days=7, model="m", vecs=[q], now=None)
    cache = cached.vector_cache
    assert isinstance(cache, VectorCache)
    return info, q, added, cache


def test_a_planning_search_holds_unless_its_own_keys_or_its_finds_changed(postgres_url):
    storage = PostgresStorage(postgres_url)
    conn = storage.open_writer()
    try:
        own = NewMemory("Alice keeps bees", "global")
        other = NewMemory("the room likes tea", "room", owner_id=1, channel_id=5, guild_id=9)
        found, elsewhere = storage.insert(conn, [own, other], base_stability_days=7, model="m",
                                          vecs=[[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]], now=None)
        mark = storage.change_mark(conn)
        storage.insert(conn, [NewMemory("the room likes cake", "room", owner_id=1, channel_id=5, guild_id=9)],
                       base_stability_days=7, model="m", vecs=[[0.0, 0.0, 1.0]], now=None)
        storage.delete(conn, [elsewhere])
        assert begun(storage, conn, own.vis_key, mark, [found])       # other keys' changes: the search holds
        assert not storage.unchanged_since(conn, mark)                 # (the log did move)
        storage.insert(conn, [NewMemory("Alice keeps wasps", "global")], base_stability_days=7, model="m",
                       vecs=[[0.9, 0.1, 0.0]], now=None)
        assert not begun(storage, conn, own.vis_key, mark, [found])    # a new vector under its key
        mark = storage.change_mark(conn)
        storage.delete(conn, [found])
        assert not begun(storage, conn, own.vis_key, mark, [found])    # what it found is gone
    finally:
        storage.close(conn)


def test_a_search_inside_a_write_reads_the_changed_vectors_with_the_log(pg_pair, monkeypatch):  # noqa: F811
    cached, conn, _, _ = pg_pair
    info, q, added, cache = another_writers_fact(pg_pair, 3, 40, "r:1", 99)

    def no_more_reads(*args: object) -> object:
        raise AssertionError("the changed rows were read again")
    monkeypatch.setattr(cache.source, "read_vectors", no_more_reads)
    with conn.transaction():                                           # as a fact write's search under its lock
        assert cached.knn(conn, info, q, ["r:1"], 3)[0][0] == added
    monkeypatch.undo()


def test_planning_reads_the_change_log_once(pg_pair):  # noqa: F811
    cached, conn, plain, other = pg_pair
    rng = np.random.default_rng(4)
    info = fill(plain, other, rng, 30)
    cache = cached.vector_cache
    assert isinstance(cache, VectorCache)
    polls: list[object] = []
    source = cache.source
    poll = source.poll

    def counted(*args: object) -> object:
        polls.append(args)
        return poll(*args)  # type: ignore[misc]
    source.poll = counted  # type: ignore[method-assign]
    cached.knn(conn, info, random_unit(rng), KEYS, 5)
    plain.insert(other, [memory_for("g", 98)], base_stability_days=7, model="m", vecs=[random_unit(rng)], now=None)
    polls.clear()
    with cached.one_log_read(conn):
        for _ in range(3):
            cached.knn(conn, info, random_unit(rng), ["g"], 5)
    assert len(polls) == 1
    cached.knn(conn, info, random_unit(rng), ["g"], 5)                 # outside the block: each search reads it
    assert len(polls) == 2


def test_plan_state_reads_the_personal_keys_and_the_exact_text_checks(postgres_url):
    from bot.memory import scope
    from bot.memory.sqlite import fts
    storage = PostgresStorage(postgres_url)
    conn = storage.open_writer()
    try:
        facts = [NewMemory("Alice keeps bees", "personal", owner_id=7, channel_id=5, guild_id=9),
                 NewMemory("Alice keeps bees", "personal", owner_id=7, channel_id=None, guild_id=None)]
        ids = storage.insert(conn, facts, base_stability_days=7, model="m", vecs=None, now=None)
        probes = [(f.vis_key, fts.tokens(f.text)) for f in facts] + [("g", [])]
        state = storage.plan_state(conn, "m", [7, 8], probes, 50)
        assert state.personal == {7: scope.personal_keys(conn, 7), 8: []} and len(state.personal[7]) == 2  # type: ignore[arg-type]
        assert state.same_words == [[(ids[0], "Alice keeps bees")], [(ids[1], "Alice keeps bees")], []]
        assert state.info is None and state.mark
    finally:
        storage.close(conn)


def test_plan_state_reads_the_change_log_for_the_planning_searches(pg_pair):  # noqa: F811
    cached, conn, _, _ = pg_pair
    info, q, added, cache = another_writers_fact(pg_pair, 5, 30, "g", 97)
    source = cache.source
    polls: list[object] = []
    poll = source.poll

    def counted(*args: object) -> object:
        polls.append(args)
        return poll(*args)  # type: ignore[misc]
    source.poll = counted  # type: ignore[method-assign]
    with cached.one_log_read(conn):
        state = cached.plan_state(conn, "m")
        assert cached.knn(conn, info, q, ["g"], 3)[0][0] == added     # the change applied from plan_state's read
    assert not polls and state.info == info and cached.unchanged_since(conn, state.mark)
