"""PostgreSQL's keyword step follows SQLite's common-word rules (bot/memory/postgres/keywords.py)."""
from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import AsyncIterator

import pytest

from bot.memory.engine import Engine
from bot.memory.postgres import bm25, keywords
from bot.memory.recall import keywords as shared_keywords
from bot.memory.records import MAX_TEXT_CHARS, NewMemory
from bot.memory.scope import Viewer
from tests.postgres_fixtures import TEMPLATE

ALICE, BOB = 1, 2


@pytest.fixture
async def pg_fts_engine(make_settings, postgres_url):
    async with Engine(make_settings("", MUNINN_DATABASE_URL=postgres_url)) as engine:
        yield engine


@contextlib.asynccontextmanager
async def own_database(make_settings, postgres_server, name: str) -> AsyncIterator[tuple[Engine, str]]:
    """An engine on a database of its own (the statistics would outlive the shared test database's
    TRUNCATE), and its URL; this process's counts and estimates are dropped after, and the database."""
    url = postgres_server.create_database(name, template=TEMPLATE)
    try:
        async with Engine(make_settings("", MUNINN_DATABASE_URL=url)) as engine:
            yield engine, url
    finally:
        keywords.forget_counts()
        postgres_server.drop_database(name)


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


def _bm25_by_hand(conn, ids: list[int], words: list[str]) -> dict[int, float]:
    """bm25.py's score computed here from each memory's words and length: negated, as the hits carry it."""
    memories = keywords.newest_id(conn)
    average = bm25.average_length(conn, keywords._database(conn))
    counts = {w: keywords.doc_count(conn, w, 10_000) for w in words}
    out = {}
    for memory_id, held, length in conn.pg.execute(
            "SELECT id, array(SELECT lexeme FROM unnest(text_search)), length(text_search) FROM memories "
            "WHERE id = ANY(%s)", [ids]).fetchall():
        weight = sum(bm25.idf(counts[w], memories) for w in words if w in held)  # english stems: these words stem to themselves
        out[int(memory_id)] = -weight * (bm25.K1 + 1) / (1 + bm25.K1 * (1 - bm25.B + bm25.B * length / average))
    return out


async def test_a_word_counted_in_no_memory_still_ranks_a_memory_stored_with_it_since(pg_fts_engine):
    # words counted in no memory (zebra, quokka) weigh the most; a memory stored after the count
    # that holds them ranks first, and every score is BM25's as bm25.py defines it
    lamps = await pg_fts_engine.remember_many([NewMemory(f"the lamps of hall {i} and lamps again", "global", owner_id=1)
                                               for i in range(5)])
    words = ["lamp", "zebra", "quokka"]
    assert await pg_fts_engine.read(keywords.searched_words, words) == words  # zebra, quokka: counted 0
    zebra = await pg_fts_engine.remember(NewMemory("a zebra and a quokka under the lamps", "global", owner_id=1))
    hits = await pg_fts_engine.read(keywords.fts_candidates, "lamp zebra quokka", ["g"], 10, None)
    assert hits[0].memory_id == zebra
    assert {h.memory_id for h in hits} == {zebra, *lamps}
    by_hand = await pg_fts_engine.read(_bm25_by_hand, [h.memory_id for h in hits], words)
    assert {h.memory_id: h.fts_score for h in hits} == pytest.approx(by_hand)


def _analyse_and_choose(conn, words: list[str]) -> tuple[list[str], int, int]:
    conn.pg.execute("ANALYZE memories")
    keywords.forget_counts()
    keywords.refresh_estimates(conn)  # a recall would have the engine's loader read them
    limit = shared_keywords.common_limit(conn)
    chosen = keywords.searched_words(conn, words)
    return chosen, keywords.doc_count(conn, "pizza", limit), limit


async def test_a_word_the_statistics_put_in_many_memories_is_not_counted(make_settings, postgres_server, monkeypatch):
    # ANALYZE's estimate stands in for the count of a word in ESTIMATE_MIN memories or more (a
    # count scanned its GIN entry up to the limit); rarer words are still counted. A database of
    # its own: the statistics would outlive the shared test database's TRUNCATE.
    monkeypatch.setattr(shared_keywords, "COMMON_MIN_DOCS", 40)  # common limit 40
    monkeypatch.setattr(keywords, "ESTIMATE_MIN", 80)
    async with own_database(make_settings, postgres_server, "muninn_estimates") as (engine, _):
        await crowd(engine, "Bob ate pizza", 150)
        await crowd(engine, "Bob cooked pasta", 300)
        await crowd(engine, "Bob had soup", 60)  # common, yet under ESTIMATE_MIN: counted
        chosen, pizza, limit = await engine.read(_analyse_and_choose, ["pasta", "pizza", "soup", "nowhere"])
        assert pizza == 150  # the estimate (every row sampled: exact); a count stops at the limit + 1
        assert limit + 1 < 150
        assert chosen == ["soup", "nowhere"]  # only common words: the rarest, by estimate or count
        chosen, _, _ = await engine.read(_analyse_and_choose, ["pasta", "pizza", "nowhere"])
        assert chosen == ["pizza", "nowhere"]  # ordered by their estimates


def _how_known(conn, words: list[str]) -> dict[str, tuple[int, int]]:
    """Each word's cached (count, how far counted) after choosing among `words` with fresh estimates."""
    conn.pg.execute("ANALYZE memories")
    keywords.forget_counts()
    keywords.refresh_estimates(conn)
    keywords.searched_words(conn, words)
    cache = keywords._counts[keywords._database(conn)]
    return {w: cache[w][:2] for w in words}


async def test_words_from_250_memories_on_are_estimated_rarer_ones_counted(make_settings, postgres_server):
    async with own_database(make_settings, postgres_server, "muninn_estimate_floor") as (engine, _):
        await crowd(engine, "Bob cooked pasta", keywords.ESTIMATE_MIN)
        await crowd(engine, "Bob had soup", keywords.ESTIMATE_MIN - 1)
        known = await engine.read(_how_known, ["pasta", "soup"])
        limit = shared_keywords.common_limit(None, keywords.ESTIMATE_MIN * 2)
        assert known["pasta"] == (keywords.ESTIMATE_MIN, shared_keywords.COMMON_EXACT)  # the estimate: never counted
        assert known["soup"] == (keywords.ESTIMATE_MIN - 1, limit)  # counted up to the limit


def _choose_after(conn, words: list[str], analyse: bool) -> list[str]:
    if analyse:
        conn.pg.execute("ANALYZE memories")
    keywords.forget_counts()
    keywords.refresh_estimates(conn)
    return keywords.searched_words(conn, words)


def _estimates_after_analyse(conn) -> dict[str, int]:
    conn.pg.execute("ANALYZE memories")
    return keywords.refresh_estimates(conn)


async def test_estimates_are_of_active_memories_and_off_after_a_mass_delete(make_settings, postgres_server, monkeypatch):
    # The statistics (migration 14) leave archived memories out, so estimates hold in a bot whose
    # maintenance archives; a mass delete since the last ANALYZE outdates them: 140 of 150 pizza
    # memories gone, pizza's estimate (150) would make it common and drop it for soup (60)
    monkeypatch.setattr(shared_keywords, "COMMON_MIN_DOCS", 40)
    monkeypatch.setattr(keywords, "ESTIMATE_MIN", 50)
    async with own_database(make_settings, postgres_server, "muninn_drift") as (engine, _):
        pizza = await crowd(engine, "Bob ate pizza", 150)
        pasta = await crowd(engine, "Bob cooked pasta", 300)
        await crowd(engine, "Bob had soup", 60)
        assert await engine.read(_choose_after, ["pizza", "soup"], True) == ["soup"]  # both common
        for memory_id in pasta[:100]:  # a fifth of all memories archived
            await engine.archive(memory_id, "faded")
        found = await engine.read(_estimates_after_analyse)
        assert (found["pasta"], found["pizza"], found["soup"]) == (200, 150, 60)
        await engine.forget(pizza[:140])
        assert await engine.read(_choose_after, ["pizza", "soup"], False) == ["pizza"]


def _stale_estimates(conn) -> None:
    conn.pg.execute("ANALYZE memories")
    keywords.forget_counts()
    keywords._estimates[keywords._database(conn)] = ({}, time.monotonic() - shared_keywords.COUNT_TTL_S, [])


async def test_a_recall_uses_the_last_estimates_and_the_loader_reads_new_ones(make_settings, postgres_server):
    # the statistics read (~65 ms at 100k, 300 at 1M) is off the recall: the engine's loader
    # thread reads them on a connection of its own while recalls use the last ones
    async with own_database(make_settings, postgres_server, "muninn_estimate_refresh") as (engine, url):
        await crowd(engine, "Bob cooked pasta", keywords.ESTIMATE_MIN)
        await engine.read(_stale_estimates)
        assert await engine.read(keywords.estimates) == {}  # the last read, stale: a new one started
        for _ in range(200):
            fresh = keywords._estimates[url]
            if fresh[0]:
                break
            await asyncio.sleep(0.02)
        assert fresh[0]["pasta"] == keywords.ESTIMATE_MIN
        assert await engine.read(keywords.estimates) == fresh[0]


def _hits_and_words(conn, queries: list[str], keys: list[str]) -> list[tuple[list[str], list[tuple[int, float]]]]:
    keywords.forget_counts()
    keywords.refresh_estimates(conn)
    found = []
    for query in queries:
        hits = keywords.fts_candidates(conn, query, keys, 20, None)
        found.append((hits.searched, [(h.memory_id, round(h.fts_score, 6)) for h in hits]))
    return found


async def test_estimates_choose_and_find_as_exact_counts_do(make_settings, postgres_server, monkeypatch):
    # every row sampled (a small table): the estimates are the counts, so the words searched and
    # the hits are the same as with every word counted exactly
    monkeypatch.setattr(shared_keywords, "COMMON_MIN_DOCS", 40)
    monkeypatch.setattr(shared_keywords, "MATCH_BUDGET", 150)
    monkeypatch.setattr(keywords, "ESTIMATE_MIN", 30)
    async with own_database(make_settings, postgres_server, "muninn_estimate_same") as (engine, _):
        for word, count in (("pizza", 150), ("pasta", 90), ("soup", 45), ("salad", 35), ("bread", 20)):
            await engine.remember_many([NewMemory(f"Bob ate {word} with friend {i % 7}", "personal", owner_id=BOB)
                                        for i in range(count)])
        await engine.read(lambda conn: conn.pg.execute("ANALYZE memories"))
        queries = ["pizza pasta", "soup salad bread", "pizza soup", "pasta salad", "pizza", "pasta soup friend"]
        estimated = await engine.read(_hits_and_words, queries, [f"p:{BOB}:dm"])
        monkeypatch.setattr(keywords, "ESTIMATE_MIN", 10**9)
        counted = await engine.read(_hits_and_words, queries, [f"p:{BOB}:dm"])
        assert estimated == counted
        assert any(len(words) > 1 for words, _ in counted)


async def test_estimates_read_while_memories_left_are_not_kept(make_settings, postgres_server, monkeypatch):
    # a background read that began before a mass delete may have counted the memories it removed:
    # the delete's forget wins, and the next recall reads them again
    async with own_database(make_settings, postgres_server, "muninn_estimate_race") as (engine, url):
        await crowd(engine, "Bob cooked pasta", keywords.ESTIMATE_MIN)
        await engine.read(lambda conn: conn.pg.execute("ANALYZE memories"))
        read = keywords.read_estimates

        def read_then_forget(conn):
            found = read(conn)
            keywords.forget_counts(conn)  # as a delete committing meanwhile does
            return found
        monkeypatch.setattr(keywords, "read_estimates", read_then_forget)
        assert (await engine.read(keywords.refresh_estimates))["pasta"] == keywords.ESTIMATE_MIN
        assert url not in keywords._estimates


def longest_text(seed: str) -> str:
    """A memory as long as one may be, of distinct words: its tsvector is larger than a btree
    index row may be (2,704 bytes)."""
    letters = "bcdfghjklmnpqrstvwz"
    words, i = [seed], 0
    while len(" ".join(words)) < MAX_TEXT_CHARS:
        words.append("".join(letters[(i // len(letters) ** n) % len(letters)] for n in range(3)) + "o")
        i += 1
    return " ".join(words)[:MAX_TEXT_CHARS]


async def test_a_memory_of_the_longest_text_is_stored_and_found_by_a_common_word(pg_fts_engine):
    await crowd(pg_fts_engine, "Bob ate pizza", 600)  # "pizza" is a common word: the newest matches, walked per key
    text = longest_text("pizza")
    assert len(text) == MAX_TEXT_CHARS
    long_id = await pg_fts_engine.remember(NewMemory(text, "personal", owner_id=ALICE))
    short_id = await pg_fts_engine.remember(NewMemory("Alice had pizza on Friday", "personal", owner_id=ALICE))
    # common (left out beside a rarer word): alone, it is searched by the walk of the newest matches
    assert await pg_fts_engine.read(keywords.searched_words, ["pizza", "friday"]) == ["friday"]
    found = await pg_fts_engine.read(keywords.fts_candidates, "pizza", [f"p:{ALICE}:dm"], 10, None)
    assert {hit.memory_id for hit in found} == {long_id, short_id}
    recalled = await pg_fts_engine.recall("pizza", Viewer(ALICE, dm=True), touch=False)
    assert set(recalled.ids) == {long_id, short_id}


async def test_the_rarest_word_outranks_a_long_memory_repeating_a_commoner_one(pg_fts_engine):
    """BM25 (bm25.py): a word's rarity counts and a long memory is scaled down. Cover density
    ranked the long memory first (it holds "dashboard" many times, and no rarity is known)."""
    await crowd(pg_fts_engine, "the dashboard shows sales", 40)
    long_one = await pg_fts_engine.remember(NewMemory(
        "Alice rebuilt the dashboard: " + ", ".join(f"the dashboard panel {i} shows dashboard totals"
                                                     for i in range(12)), "personal", owner_id=ALICE))
    short_one = await pg_fts_engine.remember(NewMemory("Alice picked Grafana", "personal", owner_id=ALICE))
    found = await pg_fts_engine.read(keywords.fts_candidates, "which dashboard is Grafana", [f"p:{ALICE}:dm"], 10,
                                     None)
    assert [hit.memory_id for hit in found][:2] == [short_one, long_one]
    assert found[0].fts_score is not None and found[1].fts_score is not None
    assert found[0].fts_score < found[1].fts_score < 0  # negated: lower is better, as SQLite's bm25


def _read_back(conn, literal: str) -> list[str]:
    return conn.pg.execute("SELECT %s::text[]", (literal,)).fetchone()[0]


async def test_the_stems_not_counted_reach_the_count_statement_as_they_are(pg_fts_engine):
    # the count statement takes them as one array literal: any stem must read back as itself
    stems = ['pasta', 'a"b', "c\\d", "NULL", "", "x,y", "{z}", " sp ", "zoë", "it's"]
    assert await pg_fts_engine.read(_read_back, keywords._array(stems)) == stems
    assert await pg_fts_engine.read(_read_back, keywords._array([])) == []


def _statements_of_keyword_steps(conn, queries: list[str], keys: list[str]) -> list[int]:
    """How many statements each keyword step sent, one query after the other on this connection."""
    keywords.newest_id(conn), bm25.average_length(conn, keywords._database(conn))  # cached for minutes: read first
    keywords.estimates(conn)
    sent: list[object] = []
    execute = conn.pg.execute

    def counted(query, params=None, **kwargs):
        sent.append(query)
        return execute(query, params, **kwargs)
    conn.pg.execute = counted
    try:
        made = []
        for query in queries:
            sent.clear()
            keywords.keyword_step(conn, query, keys, 10, None)
            made.append(len(sent))
        return made
    finally:
        del conn.pg.execute


async def test_a_keyword_step_sends_the_word_counts_and_the_keyword_statement_at_most(pg_fts_engine):
    await pg_fts_engine.remember(NewMemory("Alice grows tomatoes and basil on the balcony", "personal", owner_id=ALICE))
    keywords.forget_counts()
    made = await pg_fts_engine.read(_statements_of_keyword_steps,
                                    ["tomatoes balcony", "tomatoes balcony", "basil tomatoes", "the"], ["p:1:dm"])
    # new words: counted in one statement, then the keyword statement; counted words: one statement
    assert made == [2, 1, 2, 0]


def _keyword_statement(conn, query: str, keys: list[str]) -> tuple[bytes, list]:
    """The keyword statement a keyword step sends for `query` (after the counts it needs)."""
    sent: list[tuple[bytes, list]] = []
    execute = conn.pg.execute

    def kept(statement, params=None, **kwargs):
        sent.append((statement, params))
        return execute(statement, params, **kwargs)
    conn.pg.execute = kept
    try:
        keywords.keyword_step(conn, query, keys, 10, None)
    finally:
        del conn.pg.execute
    return next((s, p) for s, p in sent if b"score" in (s if isinstance(s, bytes) else s.encode()))


def _analyse(conn) -> None:
    conn.pg.execute("ANALYZE memories")


def _long_walk_plan(conn, query: str, keys: list[str]) -> list[str]:
    """The indexes read under the long memories' walk of the keyword statement, as planned."""
    statement, params = _keyword_statement(conn, query, keys)
    plan = conn.pg.execute(b"EXPLAIN (FORMAT JSON) " + statement, params, prepare=False).fetchone()[0]
    plan = plan if isinstance(plan, list) else json.loads(plan)
    found: list[str] = []

    def indexes(node: dict) -> list[str]:
        own = [node["Index Name"]] if "Index Name" in node else []
        return own + [name for child in node.get("Plans", []) for name in indexes(child)]

    def walk(node: dict) -> None:
        if "> 1500" in node.get("Filter", "") + node.get("Recheck Cond", ""):
            found.extend(indexes(node))
        for child in node.get("Plans", []):
            walk(child)
    walk(plan[0]["Plan"])
    return found


async def test_the_long_memories_walk_never_reads_the_word_index(pg_fts_engine):
    # the planner read every match of the common word in the key from the word index (a bitmap
    # of thousands of rows, each one's tsvector cast to text) to find the few long memories
    await crowd(pg_fts_engine, "Bob walked the dog", 2000)  # a big key that seldom says it
    await pg_fts_engine.read(_analyse)  # before "pizza" is said: the statistics (sampled, or old) call it rare
    await pg_fts_engine.remember_many([NewMemory(f"Alice ate pizza number {i}", "personal", owner_id=ALICE)
                                       for i in range(600)])  # pizza: a common word
    long_id = await pg_fts_engine.remember(NewMemory(longest_text("pizza"), "personal", owner_id=BOB))
    keywords.forget_counts()
    read = await pg_fts_engine.read(_long_walk_plan, "pizza", [f"p:{BOB}:dm"])
    assert read and "memories_text_search" not in read
    found = await pg_fts_engine.read(keywords.fts_candidates, "pizza", [f"p:{BOB}:dm"], 10, None)
    assert [hit.memory_id for hit in found] == [long_id]


async def test_estimates_follow_a_bot_that_grew_since_the_last_analyse(make_settings, postgres_server, monkeypatch):
    # the statistics give each stem's share of the memories at the last ANALYZE: times the active
    # memories now, not then (a bot that doubled since would see its words at half their counts)
    monkeypatch.setattr(keywords, "ESTIMATE_MIN", 30)
    async with own_database(make_settings, postgres_server, "muninn_estimate_growth") as (engine, _):
        await crowd(engine, "Bob cooked pasta", 60)
        await crowd(engine, "Bob had soup", 60)
        assert (await engine.read(_estimates_after_analyse))["pasta"] == 60
        await crowd(engine, "Bob cooked pasta again", 60)
        await crowd(engine, "Bob had soup again", 60)
        found = await engine.read(keywords.refresh_estimates)  # the same statistics, twice the memories
        assert (found["pasta"], found["soup"], found["bob"]) == (120, 120, 240)


def _analysed_rows(conn) -> float:
    row = conn.pg.execute("SELECT reltuples FROM pg_class WHERE oid = 'memories'::regclass").fetchone()
    return float(row[0])


async def test_an_import_leaves_statistics_of_every_memory_it_stored(make_settings, postgres_server, monkeypatch):
    # statistics autovacuum takes halfway through an import describe a smaller table with other
    # words: the import ANALYZEs at its end, and recall's estimates are read from that
    from bot.cli.importer import import_lines
    monkeypatch.setattr(keywords, "ESTIMATE_MIN", 30)
    async with own_database(make_settings, postgres_server, "muninn_import_stats") as (engine, url):
        await crowd(engine, "Bob cooked pasta", 40)
        assert (await engine.read(_estimates_after_analyse))["pasta"] == 40  # read and kept for a while
        lines = [json.dumps({"text": f"Bob had soup number {i}", "scope": "global"}) for i in range(90)]
        report = await import_lines(engine, lines, batch=25)
        assert report.imported == 90
        assert await engine.read(_analysed_rows) == 130
        assert url not in keywords._estimates  # the kept read was dropped: the next recall reads anew
        found = await engine.read(keywords.refresh_estimates)
        assert (found["soup"], found["pasta"]) == (90, 40)
