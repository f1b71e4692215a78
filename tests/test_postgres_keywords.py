"""PostgreSQL's keyword step follows SQLite's common-word rules (bot/memory/postgres/keywords.py)."""
from __future__ import annotations

import pytest

from bot.memory import fts
from bot.memory.engine import Engine
from bot.memory.postgres import keywords
from bot.memory.scope import Viewer
from bot.memory.store import NewMemory
from tests.postgres_fixtures import TEMPLATE

ALICE, BOB = 1, 2


@pytest.fixture
async def pg_fts_engine(make_settings, postgres_url):
    async with Engine(make_settings("", MUNINN_DATABASE_URL=postgres_url)) as engine:
        yield engine


async def crowd(engine: Engine, text: str, count: int) -> list[int]:
    return await engine.remember_many([NewMemory(f"{text} number {i}", "personal", owner_id=BOB)
                                       for i in range(count)])


async def test_a_common_word_is_left_out_while_rarer_ones_are_there_and_returns_after_a_forget(pg_fts_engine):
    crowd_ids = await crowd(pg_fts_engine, "Bob ate pizza", 600)  # over COMMON_MIN_DOCS (500)
    mine = await pg_fts_engine.remember(NewMemory("Alice loves pizza with salad at lunch", "personal", owner_id=ALICE))
    words = ["pizza", "lunch", "salad"]
    assert await pg_fts_engine.read(keywords.searched_words, words) == ["lunch", "salad"]
    assert (await pg_fts_engine.recall("pizza lunch salad", Viewer(ALICE, dm=True), touch=False)).ids == [mine]
    hits = await pg_fts_engine.read(keywords.fts_candidates, "pizza lunch salad", [f"p:{ALICE}:dm"], 10, None)
    assert hits.searched == ["lunch", "salad"]  # handed to the name re-rank, not chosen again
    await pg_fts_engine.forget(crowd_ids)
    assert await pg_fts_engine.read(keywords.searched_words, words) == words  # no longer common
    only_common = await pg_fts_engine.recall("pizza", Viewer(ALICE, dm=True), touch=False)
    assert only_common.ids == [mine]


def _search_often(conn, query: str, keys: list[str], times: int) -> tuple[list[list[int]], int]:
    """The keyword search `times` over on one connection, and how many of the statements it ran
    that connection holds prepared."""
    found = [[hit.memory_id for hit in keywords.fts_candidates(conn, query, keys, 10, None)] for _ in range(times)]
    prepared = conn.pg.execute("SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE '%%ts_rank_cd%%'")
    return found, int(prepared.fetchone()[0])


async def test_the_keyword_search_is_planned_for_each_viewer_and_word_never_prepared(pg_fts_engine):
    # psycopg prepares a statement after its 5th run, and PostgreSQL may then keep one generic
    # plan for every viewer and word (a busy viewer's keyword step went from 4 to 40 ms: issue 13)
    mine = await pg_fts_engine.remember(NewMemory("Alice grows tomatoes on the balcony", "personal", owner_id=ALICE))
    found, prepared = await pg_fts_engine.read(_search_often, "tomatoes balcony", ["p:1:dm"], 8)
    assert found == [[mine]] * 8
    assert prepared == 0


def _full_ranks(conn, ids: list[int], words: list[str]) -> dict[int, float]:
    query = " || ".join(["plainto_tsquery('muninn', %s)"] * len(words))
    return {int(i): -float(s) for i, s in conn.pg.execute(
        f"SELECT id, ts_rank_cd(text_search, {query}) FROM memories WHERE id = ANY(%s)".encode(),
        [*words, ids]).fetchall()}


async def test_a_word_counted_in_no_memory_still_ranks_a_memory_stored_with_it_since(pg_fts_engine):
    # words counted in no memory are ranked only for the memories holding them (keywords._score):
    # every score must equal ts_rank_cd of the whole query, also for a memory stored after the count
    lamps = await pg_fts_engine.remember_many([NewMemory(f"the lamps of hall {i} and lamps again", "global", owner_id=1)
                                               for i in range(5)])
    words = ["lamps", "zebra", "quokka"]
    assert await pg_fts_engine.read(keywords.searched_words, words) == words  # zebra, quokka: counted 0
    zebra = await pg_fts_engine.remember(NewMemory("a zebra and a quokka under the lamps", "global", owner_id=1))
    hits = await pg_fts_engine.read(keywords.fts_candidates, "lamps zebra quokka", ["g"], 10, None)
    assert hits[0].memory_id == zebra
    assert {h.memory_id for h in hits} == {zebra, *lamps}
    full = await pg_fts_engine.read(_full_ranks, [h.memory_id for h in hits], words)
    assert {h.memory_id: h.fts_score for h in hits} == pytest.approx(full)


def _analyse_and_choose(conn, words: list[str]) -> tuple[list[str], int, int]:
    conn.pg.execute("ANALYZE memories")
    keywords.forget_counts()
    limit = fts.common_limit(conn)
    chosen = keywords.searched_words(conn, words)
    return chosen, keywords.doc_count(conn, "pizza", limit), limit


async def test_a_word_the_statistics_call_very_common_is_not_counted(make_settings, postgres_server, monkeypatch):
    # ANALYZE's estimate stands in for the count of a word over ESTIMATE_MARGIN x the common limit
    # (a count scanned its whole GIN entry); rarer words are still counted. A database of its own:
    # the statistics would outlive the shared test database's TRUNCATE.
    monkeypatch.setattr(fts, "COMMON_MIN_DOCS", 40)  # common limit 40, estimated past 80
    url = postgres_server.create_database("muninn_estimates", template=TEMPLATE)
    try:
        async with Engine(make_settings("", MUNINN_DATABASE_URL=url)) as engine:
            await crowd(engine, "Bob ate pizza", 150)
            await crowd(engine, "Bob cooked pasta", 300)
            await crowd(engine, "Bob had soup", 60)  # common, yet under the margin: counted
            chosen, pizza, limit = await engine.read(_analyse_and_choose, ["pasta", "pizza", "soup", "nowhere"])
            assert pizza == pytest.approx(150, abs=5)  # the estimate: a count stops at the limit + 1
            assert limit + 1 < 150
            assert chosen == ["soup", "nowhere"]  # only common words: the rarest, by estimate or count
            chosen, _, _ = await engine.read(_analyse_and_choose, ["pasta", "pizza", "nowhere"])
            assert chosen == ["pizza", "nowhere"]  # ordered by their estimates
    finally:
        keywords.forget_counts()
        postgres_server.drop_database("muninn_estimates")


def _choose_after(conn, words: list[str], analyse: bool) -> list[str]:
    if analyse:
        conn.pg.execute("ANALYZE memories")
    keywords.forget_counts()
    return keywords.searched_words(conn, words)


@pytest.mark.parametrize("how", ["archived_then_analysed", "deleted_since_analyse"])
async def test_estimates_are_not_used_when_many_rows_are_archived_or_gone(make_settings, postgres_server,
                                                                           monkeypatch, how):
    # ANALYZE samples archived rows too, and a mass delete outdates it: 140 of 150 pizza memories
    # gone, its estimate (~150) would make it common and drop it for soup (60)
    monkeypatch.setattr(fts, "COMMON_MIN_DOCS", 40)
    url = postgres_server.create_database("muninn_drift_" + how, template=TEMPLATE)
    try:
        async with Engine(make_settings("", MUNINN_DATABASE_URL=url)) as engine:
            pizza = await crowd(engine, "Bob ate pizza", 150)
            await crowd(engine, "Bob cooked pasta", 300)
            await crowd(engine, "Bob had soup", 60)
            assert await engine.read(_choose_after, ["pizza", "soup"], True) == ["soup"]  # both common
            if how == "archived_then_analysed":
                for memory_id in pizza[:140]:
                    await engine.archive(memory_id, "faded")
            else:
                await engine.forget(pizza[:140])
            assert await engine.read(_choose_after, ["pizza", "soup"], how == "archived_then_analysed") == ["pizza"]
    finally:
        keywords.forget_counts()
        postgres_server.drop_database("muninn_drift_" + how)


def _counted(word: str) -> bool:
    return any(word in counts for counts in keywords._counts.values())


async def test_one_archived_memory_keeps_the_common_counts_many_forgotten_drop_them(pg_fts_engine, monkeypatch):
    # maintenance archives faded memories one at a time: each dropped every cached count
    monkeypatch.setattr(fts, "COMMON_MIN_DOCS", fts.FORGET_SLACK - 10)  # pizza is common
    ids = await crowd(pg_fts_engine, "Bob ate pizza", fts.FORGET_SLACK + 1)
    keywords.forget_counts()
    await pg_fts_engine.read(keywords.searched_words, ["pizza", "salad"])
    assert _counted("salad")
    await pg_fts_engine.archive(ids[0], "faded")
    assert _counted("pizza")  # one too many for a while: pizza looks a little more common
    assert not _counted("salad")  # a rare word's count goes at once
    await pg_fts_engine.forget(ids[1:])
    assert not _counted("pizza")  # FORGET_SLACK memories gone: counted again


async def test_a_forgotten_rare_word_is_counted_again(pg_fts_engine, monkeypatch):
    # its count kept, zebulon (in no memory now) would be searched alone as the rarest word
    monkeypatch.setattr(fts, "COMMON_MIN_DOCS", 40)
    await crowd(pg_fts_engine, "Bob ate pizza", 60)
    rex = await pg_fts_engine.remember(NewMemory("Alice has a dog named zebulon", "personal", owner_id=1))
    keywords.forget_counts()
    assert await pg_fts_engine.read(keywords.searched_words, ["zebulon", "pizza"]) == ["zebulon"]
    await pg_fts_engine.forget([rex])
    assert await pg_fts_engine.read(keywords.searched_words, ["zebulon", "pizza"]) == ["zebulon", "pizza"]
