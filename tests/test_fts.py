"""The keyword path's MATCH building and its common-word pruning, on a real FTS5 index."""
from __future__ import annotations

import re

import pytest

from bot.memory import fts, store
from bot.memory.scope import Viewer
from bot.memory.store import NewMemory

ALICE, BOB = 1, 2


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


@pytest.mark.parametrize("query", ['"', "(", ")", "*", "^", ":", "NEAR(", "AND", "OR NOT", "\x00", "🦜"])
def test_syntax_characters_never_reach_fts(query):
    expression = fts.match_expression(f"gpu {query} server")
    assert re.fullmatch(r'"\w+"( OR "\w+")*', expression) and expression.startswith('"gpu"')
