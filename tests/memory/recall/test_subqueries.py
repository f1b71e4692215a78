"""The name sub-query of the keyword path (bot/memory/recall/subqueries.py), through a real engine."""
from __future__ import annotations

import pytest

from bot.memory.recall import subqueries
from bot.memory.recall.retrieval import Candidate
from bot.memory.records import NewMemory
from bot.memory.scope import Viewer, visible_keys
from bot.memory.sqlite import fts, recall_sql

pytestmark = pytest.mark.usefixtures("backend")  # engine tests on SQLite and PostgreSQL

ASKER = Viewer(user_id=1, channel_id=10, guild_id=100)


def test_names_are_capitalised_words_inside_the_sentence():
    assert subqueries.names("What did Caroline research?") == ["caroline"]
    assert subqueries.names("When did Melanie's kids go camping in July?") == ["melanie"]  # not the month
    assert subqueries.names("Did John and Maria meet on Monday? And Gina?") == ["john", "maria", "gina"]
    assert subqueries.names("Caroline went where?") == []  # a sentence's first word is capitalised anyway
    assert subqueries.names("what did caroline do?") == []
    assert subqueries.names("What did Zoë paint for José and McKenzie?") == ["zoë", "josé", "mckenzie"]  # any script
    assert subqueries.names("Is Øyvind’s boat in the USA?") == ["øyvind"]   # curly possessive; capitals are no name


def test_keyword_lists_fuse_by_reciprocal_rank():
    plain = [Candidate(1, fts_rank=1, fts_score=-3.0), Candidate(2, fts_rank=2, fts_score=-2.0),
             Candidate(3, fts_rank=3, fts_score=-1.0)]
    named = [Candidate(3, fts_rank=1, fts_score=-9.0), Candidate(4, fts_rank=2, fts_score=-8.0)]
    fused = subqueries.fuse_keyword_lists(plain, named, 10, weight=1.0, k=3.0)
    assert [c.memory_id for c in fused] == [3, 1, 2, 4]  # 1/6+1/4 > 1/4 > 1/5 = 1/5: ties keep the plain order
    assert [c.fts_rank for c in fused] == [1, 2, 3, 4]
    assert fused[0].fts_score == -1.0 and fused[3].fts_score == -8.0  # the plain query's BM25 when it has one
    assert subqueries.fuse_keyword_lists(plain, [], 10) is plain
    assert len(subqueries.fuse_keyword_lists(plain, named, 2)) == 2


async def test_a_name_too_common_to_search_still_separates_the_askers_memory_from_the_room(fts_engine):
    # The asker talks a lot: "caroline" is in more memories than keywords.COMMON_MIN_DOCS, so the
    # plain keyword query leaves it out and only "sunrise" is searched.
    chatter = [NewMemory(f"Caroline: small talk number {i} about the weather", "personal", owner_id=1, guild_id=100)
               for i in range(510)]
    await fts_engine.remember_many(chatter)
    mine = await fts_engine.remember(NewMemory("Caroline: I watched the sunrise over the fjord with my sister "
                                               "before breakfast", "personal", owner_id=1, guild_id=100))
    room = await fts_engine.remember(NewMemory("Dave: sunrise, what a sunrise", "room", channel_id=10, guild_id=100))
    hidden = await fts_engine.remember(NewMemory("Caroline: a sunrise secret", "personal", owner_id=2, guild_id=100))
    plain = await fts_engine.recall("which sunrise did caroline see?", ASKER, touch=False)
    assert plain.ids[:2] == [room, mine]  # without a name query the room's lines lead
    named = await fts_engine.recall("Which sunrise did Caroline see?", ASKER, touch=False)
    assert named.ids[0] == mine
    assert hidden not in named.ids  # another person's memory never comes through the name query
    keyword_hits = [Candidate(room, fts_rank=1), Candidate(mine, fts_rank=2)]
    hits = await fts_engine.read(subqueries.name_hits, "Which sunrise did Caroline see?", keyword_hits)
    assert [h.memory_id for h in hits] == [mine]  # the room's line lacks the name
    assert await fts_engine.read(subqueries.name_hits, "Which sunrise did Caroline see?", []) == []


async def test_a_name_the_plain_query_searches_is_not_queried_again(fts_engine):
    mine = await fts_engine.remember(NewMemory("Caroline: I watched the sunrise", "personal", owner_id=1,
                                               guild_id=100))
    assert await fts_engine.read(subqueries.name_hits, "Which sunrise did Caroline see?",
                                 [Candidate(mine, fts_rank=1)]) == []
    assert (await fts_engine.recall("Which sunrise did Caroline see?", ASKER, touch=False)).ids == [mine]


@pytest.mark.sqlite_only("calls SQLite's keyword path (recall_sql.fts_candidates, fts.selective) directly")
async def test_the_keyword_path_hands_its_searched_words_to_the_name_query(fts_engine):
    chatter = [NewMemory(f"Caroline: small talk number {i} about the weather", "personal", owner_id=1, guild_id=100)
               for i in range(510)]
    await fts_engine.remember_many(chatter)
    mine = await fts_engine.remember(NewMemory("Caroline: the sunrise over the fjord", "personal", owner_id=1,
                                               guild_id=100))
    keys = await fts_engine.read(visible_keys, ASKER)
    hits = await fts_engine.read(recall_sql.fts_candidates, "Which sunrise did Caroline see?", keys, 10)
    assert hits.searched == ["sunrise", "see"]  # "caroline" is too common here: left out, as fts.selective says
    assert hits.searched == await fts_engine.read(fts.selective, fts.tokens("Which sunrise did Caroline see?"))
    assert [h.memory_id for h in await fts_engine.read(subqueries.name_hits, "Which sunrise did Caroline see?",
                                                       hits)] == [mine]
    # the words the hits carry are the ones used: had the plain query searched the name, no name query
    hits.searched = ["sunrise", "see", "caroline"]
    assert await fts_engine.read(subqueries.name_hits, "Which sunrise did Caroline see?", hits) == []
