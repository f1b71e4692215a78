"""Recall that no single member can crowd out (bot/memory/recall/fair_share.py): the cut of the
final order and the graph walk, with the real engine and the fake Ollama, on both backends."""
from __future__ import annotations

import pytest

from bot.memory.engine import Engine
from bot.memory.recall import fair_share
from bot.memory.recall.retrieval import Candidate
from bot.memory.records import NewMemory
from bot.memory.scope import Viewer

pytestmark = pytest.mark.usefixtures("backend")

GUILD, CHANNEL, OTHER_CHANNEL = 1, 10, 20
FLOODER, BOB, CAROL = 11, 12, 13
LIMIT = 5
SHARE = fair_share.share_of(LIMIT)
T0 = 1_700_000_000.0


def room(text: str, owner: int, at: float, channel: int = CHANNEL) -> NewMemory:
    return NewMemory(text, "room", owner_id=owner, channel_id=channel, guild_id=GUILD, created_at=at)


async def flood(engine: Engine) -> tuple[list[int], list[int]]:
    """The flooder teaches 200 room memories that match "lantern festival" better than any of
    Bob's 5 (both words, twice), each linked to the next; Bob's are linked to each other too."""
    flooded = await engine.remember_many(
        [room(f"lantern festival news: the lantern festival stall {n} sells tea{n}", FLOODER, T0 + 7200 * n)
         for n in range(200)])
    bobs = await engine.remember_many(
        [room(f"The lantern festival parade goes past the harbour gate {n} lane{n}", BOB, T0 + 7200 * (300 + n))
         for n in range(5)])
    for ids in (flooded, bobs):
        for a, b in zip(ids, ids[1:], strict=False):
            await engine.write(engine.storage.add_link, b, a, "co_extracted", now=T0)
    return flooded, bobs


def taught_by(result, ids: list[int]) -> int:
    return sum(1 for memory_id in result.ids if memory_id in set(ids))


async def test_one_member_takes_at_most_half_of_what_another_is_told(engine):
    flooded, bobs = await flood(engine)
    carol = Viewer(CAROL, channel_id=CHANNEL, guild_id=GUILD)
    result = await engine.recall("When is the lantern festival?", carol, limit=LIMIT, touch=False)
    fused = [r for r in result.memories if r.candidate.link is None]
    assert len(fused) == LIMIT
    # the flooder's memories match best, yet take at most their share, linked ones included
    assert taught_by(result, flooded) <= SHARE and [r.memory.id for r in fused][0] in flooded
    assert sum(1 for r in fused if r.memory.id in bobs) == LIMIT - SHARE
    assert all(r.memory.id in bobs for r in result.memories if r.candidate.link is not None)

    # the flooder's own recall: their own memories never count against them
    mine = await engine.recall("When is the lantern festival?", Viewer(FLOODER, channel_id=CHANNEL, guild_id=GUILD),
                               limit=LIMIT, touch=False)
    assert taught_by(mine, flooded) > SHARE


async def test_when_only_one_members_memories_are_relevant_the_list_is_still_full(engine):
    flooded, _ = await flood(engine)
    carol = Viewer(CAROL, channel_id=CHANNEL, guild_id=GUILD)
    result = await engine.recall("which stall sells tea?", carol, limit=LIMIT, touch=False)
    fused = [r for r in result.memories if r.candidate.link is None]
    assert len(fused) == LIMIT and all(r.memory.id in flooded for r in fused)
    assert taught_by(result, flooded) == len(result.ids)  # and their links may follow: nothing else was relevant


async def test_the_fair_share_keeps_the_scope(engine):
    """Another channel's viewer sees none of it, however the shares fall; a DM sees no room memory."""
    await flood(engine)
    elsewhere = await engine.recall("lantern festival", Viewer(CAROL, channel_id=OTHER_CHANNEL, guild_id=GUILD),
                                    touch=False)
    in_dm = await engine.recall("lantern festival", Viewer(CAROL, channel_id=99, dm=True), touch=False)
    assert elsewhere.ids == [] and in_dm.ids == []


async def test_a_viewers_personal_memories_and_global_ones_count_against_no_one(engine):
    await engine.remember_many(
        [NewMemory(f"Carol's lantern festival plan {n} note{n}", "personal", owner_id=CAROL, guild_id=GUILD,
                   created_at=T0 + n) for n in range(4)]
        + [NewMemory(f"the lantern festival is a global tradition {n} rite{n}", "global", owner_id=1,
                     created_at=T0 + 10 + n) for n in range(4)])
    result = await engine.recall("lantern festival", Viewer(CAROL, channel_id=CHANNEL, guild_id=GUILD),
                                 limit=LIMIT, touch=False)
    assert len(result.ids) >= LIMIT  # nobody's share was in the way


def test_the_cut_is_the_plain_cut_without_anyone_over_their_share():
    # no connection needed: every candidate's teacher is read already
    ranked = [Candidate(i, fts_rank=i, fused=1.0 / i, teacher=100 + i % 3, teacher_read=True) for i in range(1, 20)]
    fair = fair_share.FairShare(CAROL, 3)
    cut = fair_share.fair_cut(None, ranked, 5, fair, lambda c: True)  # type: ignore[arg-type]
    assert [c.memory_id for c in cut] == [1, 2, 3, 4, 5] and not fair.filled


def test_a_held_back_relevant_memory_beats_an_irrelevant_filler():
    # teacher 7 has ranks 1-4 (all relevant); rank 5 is someone else's but irrelevant
    ranked = [Candidate(i, fused=1.0 / i, teacher=7 if i <= 4 else 8, teacher_read=True) for i in range(1, 7)]
    fair = fair_share.FairShare(CAROL, 2)
    cut = fair_share.fair_cut(None, ranked, 3, fair, lambda c: c.memory_id <= 4)  # type: ignore[arg-type]
    assert [c.memory_id for c in cut] == [1, 2, 3] and fair.filled  # 3 was held back, then filled: nothing relevant left
    fair = fair_share.FairShare(CAROL, 2)
    cut = fair_share.fair_cut(None, ranked, 3, fair, lambda c: True)  # type: ignore[arg-type]
    assert [c.memory_id for c in cut] == [1, 2, 5] and not fair.filled
