"""The keyword path's MATCH building and its common-word pruning, on a real FTS5 index."""
from __future__ import annotations

import re
import time

import pytest

from bot.memory.recall import bm25, keywords
from bot.memory.records import NewMemory
from bot.memory.scope import Viewer, visible_keys
from bot.memory.sql import store
from bot.memory.sqlite import db, fts

ALICE, BOB = 1, 2
# FTS5 itself: its MATCH syntax, its index's counts and segments. PostgreSQL's keyword step
# follows the same rules through its own SQL: tests/memory/postgres/test_keywords.py; keyword recall
# on both backends: test_retrieval.py, test_subqueries.py, test_scope.py.
pytestmark = pytest.mark.sqlite_only("FTS5's MATCH syntax and index internals (fts.py)")


async def crowd(engine, word: str, count: int) -> list[int]:
    """`count` of Bob's memories holding `word` (enough to make it common)."""
    return await engine.write(lambda conn: store.insert_many(
        conn, [NewMemory(f"Bob ate {word} number {i}", "personal", owner_id=BOB) for i in range(count)],
        base_stability_days=7.0))


def test_match_expression_quotes_every_token():
    assert fts.match_expression('say "NEAR(x)" AND *y*') == '"say" OR "near" OR "x" OR "y"'
    assert fts.match_expression("the and of") is None
    assert fts.quote('a"b') == '"a""b"'


async def test_a_common_word_is_kept_when_the_other_words_match_nothing(fts_engine):
    await crowd(fts_engine, "pizza", 600)
    mine = await fts_engine.remember(NewMemory("Alice loves pizza", "personal", owner_id=ALICE))
    result = await fts_engine.recall("what pizza should I order tonight", Viewer(ALICE, dm=True))
    assert result.ids == [mine]


async def test_a_common_word_dropped_from_a_long_query_returns_after_a_forget(fts_engine):
    crowd_ids = await crowd(fts_engine, "pizza", 600)
    mine = await fts_engine.remember(NewMemory("Alice loves pizza with salad at lunch", "personal", owner_id=ALICE))
    words = ["pizza", "lunch", "salad"]
    kept = await fts_engine.write(fts.selective, words)
    assert "pizza" not in kept  # common: left out
    await fts_engine.forget(crowd_ids)
    assert "pizza" in await fts_engine.write(fts.selective, words)  # no longer common
    assert (await fts_engine.recall("pizza lunch salad", Viewer(ALICE, dm=True))).ids == [mine]


async def test_a_forgotten_rare_word_is_counted_again(fts_engine, monkeypatch):
    # its count kept, zebulon (in no memory now) would be searched alone as the rarest word; also
    # when a recall counted it while the delete was being written (counts go after the commit)
    await crowd(fts_engine, "pizza", 600)
    rare = await fts_engine.remember(NewMemory("Alice has a dog named zebulon", "personal", owner_id=ALICE))
    keywords.forget_counts(None)
    assert await fts_engine.write(fts.selective, ["zebulon", "pizza"]) == ["zebulon"]
    reader = db.connect(fts_engine.settings.db_path)
    real = store.vectors.remove

    def remove(conn, ids):  # inside the delete's transaction, a recall on a read connection counts
        fts.doc_count(reader, "zebulon", 1000)
        return real(conn, ids)
    monkeypatch.setattr(store.vectors, "remove", remove)
    await fts_engine.forget([rare])
    assert await fts_engine.write(fts.selective, ["zebulon", "pizza"]) == ["zebulon", "pizza"]
    reader.close()


@pytest.mark.parametrize("query", ['"', "(", ")", "*", "^", ":", "NEAR(", "AND", "OR NOT", "\x00", "🦜"])
def test_syntax_characters_never_reach_fts(query):
    expression = fts.match_expression(f"gpu {query} server")
    assert re.fullmatch(r'"\w+"( OR "\w+")*', expression) and expression.startswith('"gpu"')


def hits_of(conn, text: str, keys: list[str], as_of: float | None) -> tuple[str, list]:
    hits = fts.plan(conn, text, keys, as_of).hits
    assert hits is not None
    return hits


async def busy_channel(engine) -> list[int]:
    """600 memories of channel 5, then Bob's personal zebra and the channel's own zebra."""
    await engine.write(lambda conn: store.insert_many(
        conn, [NewMemory(f"the channel talked about lamps number {i}", "room", channel_id=5, guild_id=9)
               for i in range(600)], base_stability_days=7.0))
    bob = await engine.remember(NewMemory("Bob keeps a zebra and lamps", "personal", owner_id=BOB, guild_id=9))
    room = await engine.remember(NewMemory("a zebra walked past the lamps", "room", channel_id=5, guild_id=9))
    return [bob, room]


async def test_rare_words_are_matched_first_and_still_scoped(fts_engine):
    bob_zebra, room_zebra = await busy_channel(fts_engine)
    in_channel = Viewer(ALICE, channel_id=5, guild_id=9)
    keys = await fts_engine.read(visible_keys, in_channel)
    hits, _ = await fts_engine.read(hits_of, "zebra lamps", keys, None)
    assert hits.startswith("hits AS")  # 2 matches against 601 visible memories: match first
    result = await fts_engine.recall("zebra lamps", in_channel, touch=False)
    assert result.ids[0] == room_zebra and bob_zebra not in result.ids  # the common "lamps" was left out
    as_of = await fts_engine.recall("zebra", in_channel, touch=False, as_of=1.0)
    assert as_of.ids == []  # created after that moment


async def test_common_words_with_few_visible_read_the_visible_set_first(fts_engine):
    await busy_channel(fts_engine)
    mine = await fts_engine.remember(NewMemory("Alice bought lamps", "personal", owner_id=ALICE))
    hits, _ = await fts_engine.read(hits_of, "lamps", ["g", f"p:{ALICE}:dm"], None)
    assert hits.startswith("visible(id)")  # 500+ matches, 1 visible memory
    assert (await fts_engine.recall("lamps", Viewer(ALICE, dm=True), touch=False)).ids == [mine]


async def test_mid_frequency_words_join_only_within_the_match_budget(fts_engine, monkeypatch):
    await crowd(fts_engine, "pizza", 700)
    await crowd(fts_engine, "pasta", 900)
    await crowd(fts_engine, "salad", 20)
    await crowd(fts_engine, "soup", 10)
    monkeypatch.setattr(keywords, "COMMON_MIN_DOCS", 100)  # above it a word is frequent: it must fit the budget
    monkeypatch.setattr(keywords, "COMMON_SHARE", 0.9)     # nothing here is common
    monkeypatch.setattr(keywords, "MATCH_BUDGET", 1000)
    keywords.forget_counts(None)
    kept = await fts_engine.write(fts.selective, ["pizza", "pasta", "salad", "soup", "nowhere"])
    assert kept == ["pizza", "salad", "soup", "nowhere"]  # soup + salad + pizza = 730 matches; pasta would pass 1000


async def test_a_query_of_common_words_ranks_only_the_newest_visible_matches(fts_engine):
    await busy_channel(fts_engine)
    in_channel = Viewer(ALICE, channel_id=5, guild_id=9)
    keys = await fts_engine.read(visible_keys, in_channel)
    hits, _ = await fts_engine.read(hits_of, "lamps channel", keys, None)
    assert hits.startswith("visible(id)") and f"LIMIT {keywords.COMMON_HITS}" in hits
    result = await fts_engine.recall("lamps channel", in_channel, touch=False)
    assert len(result.ids) == fts_engine.settings.recall_limit


async def test_a_viewer_who_sees_much_walks_a_common_word_from_the_fts_side(fts_engine, monkeypatch):
    await busy_channel(fts_engine)
    monkeypatch.setattr(keywords, "DENSE_VISIBLE", 100)  # the 601 memories of channel 5 count as "much"
    in_channel = Viewer(ALICE, channel_id=5, guild_id=9)
    keys = await fts_engine.read(visible_keys, in_channel)
    hits, _ = await fts_engine.read(hits_of, "lamps channel", keys, None)
    assert hits.startswith("hits AS") and f"LIMIT {keywords.COMMON_HITS}" in hits
    result = await fts_engine.recall("lamps channel", in_channel, touch=False)
    assert len(result.ids) == fts_engine.settings.recall_limit
    bob = await fts_engine.recall("lamps", Viewer(BOB, channel_id=6, guild_id=9), touch=False)
    assert all(m.memory.owner_id == BOB for m in bob.memories)  # his own lamps only, never channel 5's


async def test_a_query_of_only_common_words_keeps_the_rarest_of_them(fts_engine):
    await crowd(fts_engine, "pasta", 900)
    await crowd(fts_engine, "pizza", 600)  # both common (COMMON_MIN_DOCS 500), of equal length
    keywords.forget_counts(None)
    assert await fts_engine.write(fts.selective, ["pasta", "pizza", "nowhere"]) == ["pizza", "nowhere"]


def by_hand(texts: dict[int, str], counts: list[int], words: list[str]) -> dict[int, float]:
    """The scorer's BM25 computed here: each searched word a memory holds adds its idf once, the
    sum scaled by the memory's length in tokens against the average; negated, as the hits carry it."""
    lengths = {i: len(re.findall(r"\w+", text)) for i, text in texts.items()}
    average = sum(lengths.values()) / len(lengths)
    out = {}
    for i, text in texts.items():
        held = set(re.findall(r"\w+", text.lower()))
        weight = sum(bm25.idf(n, len(texts)) for w, n in zip(words, counts, strict=True) if w in held)
        out[i] = -weight * (bm25.K1 + 1) / (1 + bm25.K1 * (1 - bm25.B + bm25.B * lengths[i] / average))
    return out


async def test_the_scorer_counts_each_word_once_per_memory(fts_engine):
    """Repeats add nothing, length and rarity do: the scores are BM25's with binary word counts
    (the same form as PostgreSQL's bm25.py), the counts given by the caller."""
    texts = [" ".join(["lamps"] * (1 + i % 3) + ["filler"] * (i % 7) + ["zebra"] * (i % 13 == 0)) for i in range(40)]
    ids = await fts_engine.write(lambda conn: store.insert_many(conn, [
        NewMemory(text, "personal", owner_id=BOB) for text in texts] + [NewMemory("no such word here", "personal",
                                                                                owner_id=BOB)],
        base_stability_days=7.0))
    texts.append("no such word here")

    def scores(conn, expression: str, *counts: int) -> dict[int, float]:
        fts.register_scorer(conn)
        marks = ", ?" * len(counts)
        return dict(conn.execute(f"SELECT rowid, {fts.SCORER}(memories_fts{marks}) FROM memories_fts "
                                 "WHERE memories_fts MATCH ?", (*counts, expression)).fetchall())
    # "zebra" in 4 of them, "nowhere" in none (a word stored since it was counted still scores)
    ours = await fts_engine.read(scores, '"lamps" OR "zebra" OR "nowhere"', 40, 4, 0)
    expected = by_hand(dict(zip(ids, texts, strict=True)), [40, 4, 0], ["lamps", "zebra", "nowhere"])
    assert len(ours) == 40 and ours == pytest.approx({i: expected[i] for i in ours})
    once, thrice = ids[21], ids[14]  # "lamps" against "lamps lamps lamps": saying it again adds nothing
    assert ours[once] < ours[thrice]


async def test_a_common_word_is_scored_by_its_counted_documents_not_walked_again(fts_engine, monkeypatch):
    await fts_engine.write(lambda conn: store.insert_many(conn, [
        NewMemory(" ".join(["lamps"] * (1 + i % 3) + ["words"] * (i % 11)), "room", channel_id=5, guild_id=9)
        for i in range(700)], base_stability_days=7.0))
    monkeypatch.setattr(keywords, "COMMON_HITS", 200)
    for dense in (100, 10_000):  # match first, visible set first
        monkeypatch.setattr(keywords, "DENSE_VISIBLE", dense)
        keys = await fts_engine.read(visible_keys, Viewer(ALICE, channel_id=5, guild_id=9))
        hits, params = await fts_engine.read(hits_of, "lamps", keys, None)
        assert f"{fts.SCORER}(memories_fts, ?)" in hits and "bm25(memories_fts)" not in hits
        assert 700 in params  # the word's count, from the count cache

        def ranked(conn, cte: str, params: list) -> list[tuple[int, float, int]]:
            return conn.execute(f"WITH {cte} SELECT h.id, h.relevance, m.text FROM hits h JOIN memories m "
                                "ON m.id = h.id ORDER BY relevance, h.id DESC", params).fetchall()
        ours = await fts_engine.read(ranked, hits, params)
        assert len(ours) == 200 and len({score for _, score, _ in ours}) > 5
        # one word, held once by each: the shorter memory first, however often it says "lamps"
        lengths = [len(text.split()) for _, _, text in ours]
        assert lengths == sorted(lengths)


async def test_each_match_is_checked_in_the_small_key_index(fts_engine):
    """Match first: a match's key comes from the (id, vis_key) index (migration 12), one seek,
    not from its row; a recall as of a past moment reads the row (it needs created_at)."""
    await busy_channel(fts_engine)
    keys = await fts_engine.read(visible_keys, Viewer(ALICE, channel_id=5, guild_id=9))

    def plan_of(conn, as_of: float | None) -> str:
        cte, params = hits_of(conn, "zebra", keys, as_of)
        return " ".join(row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN WITH {cte} SELECT id FROM hits", params))
    assert "COVERING INDEX memories_id_vis (id=?)" in await fts_engine.read(plan_of, None)
    assert "memories_id_vis" not in await fts_engine.read(plan_of, time.time())


async def test_one_archived_memory_keeps_the_common_counts_many_forgotten_drop_them(fts_engine, monkeypatch):
    monkeypatch.setattr(keywords, "COMMON_MIN_DOCS", keywords.FORGET_SLACK - 10)  # pizza is common
    ids = await crowd(fts_engine, "pizza", keywords.FORGET_SLACK + 1)
    keywords.forget_counts(None)
    await fts_engine.write(fts.selective, ["pizza", "salad"])
    counted = lambda word: any(word in counts for counts in keywords._counts.values())  # noqa: E731
    assert counted("salad")
    await fts_engine.archive(ids[0], "faded")
    assert counted("pizza") and not counted("salad")  # a rare word's count goes at once
    await fts_engine.forget(ids[1:])
    assert not counted("pizza")
