"""The big keys' own HNSW indexes on PostgreSQL (postgres/ann.py): made and dropped as keys cross
the threshold, remade when a build left one INVALID, used by the server's search, which finds the
exact top results of a small world and never another key's rows."""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator

import numpy as np
import pytest
from psycopg import sql

from bot.memory import vector_indexes
from bot.memory.postgres import ann, recall_sql
from bot.memory.postgres.backend import PostgresStorage
from bot.memory.postgres.connection import PgConnection
from bot.memory.records import NewMemory
from bot.memory.vector_indexes import carried_out, planned
from bot.memory.vectors.index import IndexInfo

DIM = 8
SIZES = {"r:1": 240, "r:2": 30, "g": 60}  # r:1 is big, g is under the threshold, r:2 far under


def unit(rng: np.random.Generator) -> list[float]:
    v = rng.standard_normal(DIM)
    return (v / np.linalg.norm(v)).tolist()


def memory_for(key: str, i: int) -> NewMemory:
    if key == "g":
        return NewMemory(f"memory {i}", "global")
    return NewMemory(f"memory {i}", "room", owner_id=7, channel_id=int(key[2:]), guild_id=1)


@pytest.fixture
def world(postgres_url: str) -> Iterator[tuple[PostgresStorage, PgConnection, IndexInfo, dict[str, list[int]]]]:
    storage = PostgresStorage(postgres_url)
    conn = storage.open_writer()
    rng = np.random.default_rng(11)
    ids: dict[str, list[int]] = {}
    for key, count in SIZES.items():
        ids[key] = storage.insert(conn, [memory_for(key, i) for i in range(count)], base_stability_days=7,
                                  model="m", vecs=[unit(rng) for _ in range(count)], now=1000.0)
    info = storage.index_info(conn)
    assert info is not None
    yield storage, conn, info, ids
    conn.close()


def made(storage: PostgresStorage, conn: PgConnection, minimum: int) -> tuple[int, int]:
    job = planned(conn, minimum)
    assert job is not None
    return carried_out(job, 0)


def test_keys_past_the_threshold_get_an_index_and_lose_it_under_half(world):
    storage, conn, info, ids = world
    job = planned(conn, 50)
    assert job is not None and [key for key, _ in job.plan.create] == ["r:1", "g"]  # biggest first
    assert made(storage, conn, 100) == (1, 0)
    assert [row.name for row in ann.listed(conn) if row.valid] == [ann.index_name("r:1", info.dim)]
    assert made(storage, conn, 100) == (0, 0)  # nothing to do: the index is there
    storage.delete(conn, ids["r:1"][:150])      # 90 left: under the threshold, over half of it: kept
    assert made(storage, conn, 100) == (0, 0)
    storage.delete(conn, ids["r:1"][150:200])   # 40 left: under half
    assert made(storage, conn, 100) == (0, 1)
    assert ann.listed(conn) == []
    assert made(storage, conn, 50) == (1, 0)    # g (60) crosses a lower threshold
    assert [row.name for row in ann.listed(conn)] == [ann.index_name("g", info.dim)]
    assert made(storage, conn, 0) == (0, 1)     # 0: none at all


def test_an_index_left_invalid_is_dropped_and_made_again(world, caplog):
    storage, conn, info, _ = world
    made(storage, conn, 100)
    name = ann.index_name("r:1", info.dim)
    # what a cancelled CREATE INDEX CONCURRENTLY leaves behind: the index, marked not valid
    conn.pg.execute(sql.SQL("UPDATE pg_index SET indisvalid = false WHERE indexrelid = {}::regclass").format(
        sql.Literal(name)))
    assert [(row.name, row.valid) for row in ann.listed(conn)] == [(name, False)]
    job = planned(conn, 100)
    assert job is not None and job.plan.invalid == [name] and job.plan.create == [("r:1", name)]
    assert carried_out(job, 0) == (1, 1)
    assert [(row.name, row.valid) for row in ann.listed(conn)] == [(name, True)]
    assert any("left invalid" in record.getMessage() for record in caplog.records)


def test_a_cancelled_build_leaves_the_key_exact_and_the_next_run_makes_it(world, caplog):
    storage, conn, info, _ = world
    job = planned(conn, 100)
    assert job is not None
    builder, writer = storage.open_reader(), storage.open_writer()
    try:
        # A write in flight: the build makes its index (invalid until done), then waits for that
        # transaction, and gives up after lock_timeout; so does its clean-up's drop.
        with writer.transaction():
            storage.insert(writer, [memory_for("r:2", 1)], base_stability_days=7, model="m",
                           vecs=[unit(np.random.default_rng(1))], now=1000.0)
            builder.pg.execute("SET lock_timeout = '300ms'")
            assert ann.carry_out(builder, info, job.plan, 0) == (0, 0)
    finally:
        builder.close()
        writer.close()
    assert [row.valid for row in ann.listed(conn)] == [False]
    assert any("could not make vector index" in record.getMessage() for record in caplog.records)
    q = unit(np.random.default_rng(2))
    storage.ann.forget()
    assert storage.knn(conn, info, q, ["r:1"], 5) == recall_sql.server_knn(conn, info, q, ["r:1"], 5)
    assert made(storage, conn, 100) == (1, 1)  # the invalid one dropped, made again
    assert [(row.name, row.valid) for row in ann.listed(conn)] == [(ann.index_name("r:1", info.dim), True)]


def test_the_indexed_search_finds_the_exact_top_results_and_only_the_keys_asked(world):
    storage, conn, info, ids = world
    made(storage, conn, 100)
    key_of = {mid: key for key, members in ids.items() for mid in members}
    conn.pg.execute("SET enable_seqscan = off")  # a world this small would be scanned: make the index answer
    conn.pg.execute("SET enable_bitmapscan = off")
    plan = "\n".join(row[0] for row in conn.pg.execute(
        sql.SQL("EXPLAIN SELECT memory_id FROM memory_vectors WHERE {} ORDER BY {} <-> %s::halfvec({}) LIMIT 5").format(
            ann._predicate("r:1", info.dim), ann._cast(info.dim), sql.SQL(str(DIM))), (str(unit(np.random.default_rng(0))),)))
    assert ann.index_name("r:1", info.dim) in plan
    rng = np.random.default_rng(5)
    overlap = []
    for keys in (["r:1"], ["r:1", "g"], ["r:2", "g"], ["r:2", "r:1"], ["g"]):
        for _ in range(8):
            q = unit(rng)
            got = storage.knn(conn, info, q, keys, 10)
            exact = recall_sql.server_knn(conn, info, q, keys, 10)
            assert {key_of[mid] for mid, _ in got} <= set(keys)  # never another key's rows
            assert [d for _, d in got] == sorted(d for _, d in got)
            overlap.append(len({m for m, _ in got} & {m for m, _ in exact}) / len(exact))
            if "r:1" not in keys:
                assert got == exact  # keys without an index: the exact scan itself
    assert np.mean(overlap) >= 0.95  # a walk of 200 over a graph of 240 vectors: all but exact


def test_a_search_as_of_a_past_moment_or_in_a_transaction_is_right(world):
    storage, conn, info, ids = world
    made(storage, conn, 100)
    rng = np.random.default_rng(8)
    q = unit(rng)
    assert storage.knn(conn, info, q, ["r:1"], 5, as_of=999.0) == []  # before anything was stored: exact, empty
    with conn.transaction():
        fresh = storage.insert(conn, [memory_for("r:1", 999)], base_stability_days=7, model="m", vecs=[q], now=2000.0)
        assert storage.knn(conn, info, q, ["r:1"], 1)[0][0] == fresh[0]  # its own uncommitted row, through the index
        conn.pg.execute("SELECT 1")
    assert storage.knn(conn, info, q, ["r:1"], 1)[0][0] == fresh[0]


def test_a_build_is_cancelled_at_once_when_the_bot_stops(world):
    storage, conn, info, _ = world
    job = planned(conn, 100)
    assert job is not None
    writer = storage.open_writer()
    got: list[tuple[int, int]] = []
    try:
        with writer.transaction():  # a write in flight: the build waits for it
            storage.insert(writer, [memory_for("r:2", 1)], base_stability_days=7, model="m",
                           vecs=[unit(np.random.default_rng(1))], now=1000.0)
            builder = threading.Thread(target=lambda: got.append(carried_out(job, 0)))
            builder.start()
            deadline = time.monotonic() + 10
            while not ann.listed(conn) and time.monotonic() < deadline:  # the build has begun
                time.sleep(0.05)
            job.cancel()
            builder.join(10)
            assert not builder.is_alive() and got == [(0, 0)]
    finally:
        writer.close()
    assert [row.valid for row in ann.listed(conn)] == [False]  # left for the next run
    assert made(storage, conn, 100) == (1, 1)


def test_a_key_is_quoted_as_a_literal_and_named_by_its_hash(world):
    _, conn, _, _ = world
    odd = "r:1'; DROP TABLE memories; --"
    assert ann._predicate(odd, DIM).as_string(conn.pg) == \
        "vis_key = 'r:1''; DROP TABLE memories; --' AND vector_dims(embedding) = 8"
    name = ann.index_name(odd, DIM)
    assert name.startswith(ann.PREFIX) and len(name) < 64 and name.replace("_", "").isalnum()
    assert ann.index_name("r:1", DIM) != ann.index_name("r:2", DIM) != ann.index_name("r:2", DIM + 1)


def test_keys_the_vector_cache_holds_get_no_index(world, postgres_url):
    from bot.memory.vectors.cache import VectorCache
    _, conn, info, _ = world
    row = 8 + 4 + 16  # an int8 row of 8 dimensions with its scale, id and time
    # held: the biggest keys that fit half the budget, r:1 (240) skipped when it does not; g (60)
    # fits three quarters of row * 100 but not half: a key at the budget's edge gets its index
    for budget, indexed in ((10 << 20, []), (row * 200, ["r:1"]), (row * 100, ["r:1", "g"]),
                            (row * 40, ["r:1", "g"])):
        cached = PostgresStorage(postgres_url, VectorCache(budget, form="int8"))
        reader = cached.open_reader()
        try:
            job = planned(reader, 50)
        finally:
            reader.close()
        # a big budget holds every key: no index would be searched, each would cost writes
        assert job is not None and [key for key, _ in job.plan.create] == indexed, budget


def test_the_keys_held_at_another_share_are_counted_without_changing_the_shipped_one():
    from bot.memory.vectors.cache import VectorCache
    cache = VectorCache((8 + 4 + 16) * 100, form="int8")  # room for 100 int8 rows of 8 dimensions
    sizes = [("r:1", 240), ("g", 60), ("r:2", 10)]
    shipped = vector_indexes.HELD_SHARE
    assert vector_indexes.held_by_cache(cache, DIM, sizes) == {"r:2"}  # half the budget: g does not fit
    assert vector_indexes.held_by_cache(cache, DIM, sizes, 0.75) == {"g", "r:2"}  # bench.pg_index_plan's table
    assert vector_indexes.held_by_cache(cache, DIM, sizes, shipped) == {"r:2"}
    assert vector_indexes.HELD_SHARE == shipped


def test_a_search_runs_its_scan_and_all_walks_but_one_on_other_readers_with_the_same_answer(world):
    storage, conn, info, _ = world
    assert made(storage, conn, 50) == (2, 0)  # r:1 and g; r:2 stays exact
    local = threading.local()
    pids: list[int] = []
    readers: list[PgConnection] = []

    def on_reader(fn, *args):
        if getattr(local, "conn", None) is None:
            local.conn = storage.open_reader()
            readers.append(local.conn)
        pids.append(local.conn.pg.info.backend_pid)
        return fn(local.conn, *args)
    pool = ThreadPoolExecutor(2)
    try:
        rng = np.random.default_rng(3)
        keys = ["r:1", "g", "r:2"]
        for _ in range(5):
            q = unit(rng)
            storage.read_beside(None)
            alone = storage.knn(conn, info, q, keys, 10)
            storage.read_beside(lambda fn, *args: pool.submit(on_reader, fn, *args))
            pids.clear()
            assert storage.knn(conn, info, q, keys, 10) == alone
            assert len(pids) == 2 and conn.pg.info.backend_pid not in pids  # the scan of r:2 and one walk
        gate = threading.Event()
        busy = [pool.submit(gate.wait) for _ in range(2)]  # every reader taken: the parts run here
        pids.clear()
        assert storage.knn(conn, info, q, keys, 10) == alone and pids == []
        gate.set()
        [future.result() for future in busy]
    finally:
        storage.read_beside(None)
        pool.shutdown()
        for reader in readers:
            reader.close()
