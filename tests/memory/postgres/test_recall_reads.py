"""What a PostgreSQL recall reads along the way of other statements (issue 13: round trips):
the index state with the keyword statement, the final order's decay rows (Candidate.vitals)
with the neighbour walk. Each must equal what its own statement reads."""
from __future__ import annotations

import pytest

from bot.memory.engine import Engine
from bot.memory.postgres import keywords
from bot.memory.recall import ranking, retrieval
from bot.memory.recall.retrieval import Candidate
from bot.memory.records import NewMemory
from bot.memory.scope import Viewer
from bot.memory.vectors import index as vectors


@pytest.fixture
async def pg_engine(fake_ollama, make_settings, postgres_url):
    async with Engine(make_settings(fake_ollama.url, MUNINN_DATABASE_URL=postgres_url)) as engine:
        yield engine


def _states(conn, storage) -> tuple:
    hits, carried = keywords.keyword_step(conn, "zebra zoo", ["g"], 10, None)  # read in the keyword statement
    alone = storage.fts_candidates(conn, "zebra zoo", ["g"], 10, None)
    assert hits and [hit.memory_id for hit in hits] == [hit.memory_id for hit in alone]
    assert storage.keyword_step(conn, "zebra zoo", ["g"], 10, None)[1] == carried
    # no word to search: no keyword statement ran, the storage reads the state itself
    assert keywords.keyword_step(conn, "the", ["g"], 10, None) == ([], None)
    assert storage.keyword_step(conn, "the", ["g"], 10, None) == ([], storage.index_state(conn))
    return carried, storage.index_state(conn)


async def test_the_keyword_statement_reads_the_index_state_its_own_read_does(pg_engine):
    await pg_engine.remember(NewMemory("the zebra lives in the zoo", "global"))
    carried, own = await pg_engine.read(_states, pg_engine.storage)
    assert carried == own and own[0] is not None and own[1] is False
    await pg_engine.write(lambda conn: conn.pg.execute("INSERT INTO meta VALUES (%s, '1')", (vectors.REINDEX_PENDING,)))
    carried, own = await pg_engine.read(_states, pg_engine.storage)
    assert carried == own and own[1] is True
    result = await pg_engine.recall("zebra zoo", Viewer(1, dm=True), touch=False)
    assert result.vector_status == "partial"  # the recall took the state the keyword statement read


def _orders(conn, storage, ids: list[int], now: float) -> tuple[list, list, list]:
    def fused() -> list[Candidate]:
        return [Candidate(memory_id, fts_rank=rank, fused=1.0 / (60 + rank)) for rank, memory_id in enumerate(ids, 1)]
    walked = storage.spread_to_neighbours(conn, fused(), ["g"], 0.3, None)
    carried = sorted((c.memory_id, *c.vitals) for c in walked if c.vitals is not None)
    with_rows = [c.memory_id for c in storage.final_order(conn, walked, now, time_weight=0.5)]
    walked_again = storage.spread_to_neighbours(conn, fused(), ["g"], 0.3, None)
    for c in walked_again:
        c.vitals = None  # final_order reads the rows itself
    read_again = [c.memory_id for c in ranking.final_order(conn, walked_again, now, time_weight=0.5)]
    own = sorted(tuple(r) for r in conn.execute(f"SELECT {ranking.DECAY_COLUMNS} FROM memories WHERE id = ANY(?)",
                                                (ids,)).fetchall())
    return with_rows, read_again, [carried, own]


async def test_the_neighbour_walk_reads_the_final_orders_rows(pg_engine):
    ids = await pg_engine.remember_many([NewMemory(f"the zebra {i} at the zoo", "global", importance=0.1 + i / 20,
                                                   created_at=1_700_000_000.0 + 600 * i) for i in range(12)])
    await pg_engine.recall("zebra", Viewer(1, dm=True))  # touched: last_accessed differs from created_at
    with_rows, read_again, (carried, own) = await pg_engine.read(_orders, pg_engine.storage, ids[::2],
                                                                 1_700_100_000.0)
    assert carried == own
    assert with_rows == read_again


def _both_walks(conn, storage, ranked, keys: list[str], as_of: float | None) -> tuple[list, list]:
    def lent(out: list[Candidate]) -> list:
        return [(c.memory_id, round(c.fused, 9), c.neighbour_of) for c in out]
    fresh = lambda: [Candidate(c.memory_id, fts_rank=c.fts_rank, fused=c.fused) for c in ranked]  # noqa: E731
    return (lent(storage.spread_to_neighbours(conn, fresh(), keys, 0.5, as_of)),
            lent(retrieval.spread_to_neighbours(conn, fresh(), keys, 0.5, as_of)))


async def test_the_neighbour_walk_lends_as_the_portable_one(pg_engine):
    # PostgreSQL's statement returns only neighbours that are candidates and tests their times in
    # Python: the same loans as retrieval.spread_to_neighbours (window, other keys, reach, as_of)
    t0 = 1_700_000_000.0
    room = {"channel_id": 5, "guild_id": 9}
    ids = await pg_engine.remember_many(
        [NewMemory(f"line {i}", "room", owner_id=1, created_at=t0 + (7200 if i == 6 else i), **room) for i in range(8)]
        + [NewMemory("my own note", "personal", owner_id=1, guild_id=9, created_at=t0 + 2.5)])
    keys = await pg_engine.read(pg_engine.storage.visible_keys, Viewer(1, channel_id=5, guild_id=9))
    lenders: set[int] = set()
    for chosen in (ids, ids[1::2], [ids[3], ids[5], ids[6], ids[8]], ids[:1]):
        ranked = [Candidate(m, fts_rank=r, fused=1.0 / (r + 1)) for r, m in enumerate(chosen, 1)]
        for as_of in (None, t0 + 4.5):
            own, portable = await pg_engine.read(_both_walks, pg_engine.storage, ranked, keys, as_of)
            assert own == portable
            lenders |= {lender for _, _, lender in own if lender is not None}
    assert len(lenders) >= 5  # loans were made (not all cut by the window, the key or as_of)


async def test_one_recalls_touch_and_load_are_one_statement_reading_what_get_many_reads(pg_engine):
    a, b = await pg_engine.remember_many([NewMemory("alpha", "personal", owner_id=7),
                                          NewMemory("beta", "personal", owner_id=7)])
    loaded = await pg_engine.write(pg_engine.storage.touch_and_load, [([a], 1000.0)], [a, b], growth=1.5)
    assert loaded is not None and loaded == await pg_engine.get_many([a, b])  # a as touched, b as it is
    assert (loaded[a].access_count, loaded[a].last_accessed, loaded[b].access_count) == (1, 1000.0, 0)
    # several recalls' touches keep their transaction: touch_many, then get_many
    assert await pg_engine.write(pg_engine.storage.touch_and_load, [([a], 1.0), ([b], 2.0)], [a, b],
                                 growth=1.5) is None


async def test_the_keyword_index_keeps_no_pending_list(pg_engine):
    # PostgreSQL migration 13: every keyword search read the unsorted list of new words whole
    options = await pg_engine.read(lambda conn: conn.pg.execute(
        "SELECT reloptions FROM pg_class WHERE relname = 'memories_text_search'").fetchone()[0])
    assert "fastupdate=off" in options
