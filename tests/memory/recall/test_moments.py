"""One memory of a moment in the top list (recall/moments.py), through the real engine, on both backends."""
from __future__ import annotations

import pytest

from bot.memory.engine import Engine
from bot.memory.recall import moments
from bot.memory.recall.retrieval import Candidate
from bot.memory.records import NewMemory
from bot.memory.scope import Viewer

pytestmark = pytest.mark.usefixtures("backend")

ALICE = Viewer(user_id=1, dm=True)
T0 = 1_700_000_000.0
QUESTION = "the harbour lighthouse keeper"
# one long message imported in three parts: the same moment, key and source message, every part matching
PARTS = ["Ada: the harbour lighthouse keeper retired, part one of a long story about the harbour lighthouse keeper",
         "Ada: the harbour lighthouse keeper part two, more about the harbour lighthouse keeper and the storm",
         "Ada: the harbour lighthouse keeper part three, the harbour lighthouse keeper's last winter"]
# other messages, each said at a moment of its own, matching less
OTHERS = [f"Bo: the harbour was busy on day {i}" for i in range(4)]


async def remember(engine: Engine, texts: list[str], times: list[float], owner: int = 1,
                   source: str | None = None) -> list[int]:
    ids = []
    for text, when in zip(texts, times, strict=True):
        ids.append(await engine.remember(NewMemory(text, "personal", owner_id=owner, created_at=when,
                                                   source_message_ids=[source] if source else ())))
    return ids


async def test_parts_of_one_moment_wait_below_the_cut(make_settings):
    async with Engine(make_settings("")) as engine:
        parts = await remember(engine, PARTS, [T0] * 3, source="story-1")
        others = await remember(engine, OTHERS, [T0 + 86400 * (i + 1) for i in range(4)])
        top = (await engine.recall(QUESTION, ALICE, limit=3, touch=False)).ids
        whole = (await engine.recall(QUESTION, ALICE, limit=10, touch=False)).ids
    assert len([i for i in top if i in parts]) == 1 and top[0] in parts  # the best part leads
    assert len([i for i in top if i in others]) == 2
    assert set(whole) == set(parts) | set(others)  # fewer others than places: the parts still fill the list


async def test_memories_of_one_moment_linked_as_one_exchange_keep_their_places(make_settings):
    async with Engine(make_settings("")) as engine:
        parts = await remember(engine, PARTS, [T0] * 3, source="story-1")
        await remember(engine, OTHERS, [T0 + 86400 * (i + 1) for i in range(4)])
        for a, b in ((parts[0], parts[1]), (parts[1], parts[2]), (parts[0], parts[2])):
            await engine.write(engine.storage.add_link, a, b, "co_extracted")
        top = (await engine.recall(QUESTION, ALICE, limit=3, touch=False)).ids
    assert sorted(top) == sorted(parts)


async def test_the_same_moment_under_another_key_is_not_one_text(make_settings):
    async with Engine(make_settings("")) as engine:
        mine = await remember(engine, PARTS[:1], [T0], source="story-1")
        room = await engine.remember(NewMemory(PARTS[1], "global", created_at=T0, source_message_ids=["story-1"]))
        await remember(engine, OTHERS, [T0 + 86400 * (i + 1) for i in range(4)])
        top = (await engine.recall(QUESTION, ALICE, limit=2, touch=False)).ids
    assert sorted(top) == sorted([mine[0], room])


def test_one_each_reads_nothing_when_no_two_candidates_share_a_moment():
    class NoReads:
        def execute(self, *args):
            raise AssertionError("read")
    ranked = [Candidate(i, vitals=(T0 + i, 1.0, 0.5, T0 + i)) for i in range(5)]
    assert moments.one_each(NoReads(), ranked, 3) == ranked


async def test_lines_of_one_moment_from_no_shared_message_keep_their_places(make_settings):
    # an import whose lines carry only a date: one moment, one key, distinct texts
    async with Engine(make_settings("")) as engine:
        lines = await remember(engine, PARTS, [T0] * 3)
        apart = await remember(engine, PARTS[:2], [T0 + 60] * 2, source="story-2") + \
            await remember(engine, PARTS[2:], [T0 + 60], source="story-3")
        await remember(engine, OTHERS, [T0 + 86400 * (i + 1) for i in range(4)])
        top = (await engine.recall(QUESTION, ALICE, limit=5, touch=False)).ids
    assert set(lines) <= set(top)
    assert len([i for i in top if i in apart]) == 2  # story-2's two parts count once, story-3's apart


async def test_parts_of_one_text_are_found_in_two_statements(make_settings):
    # a bot's facts of one exchange share a moment: this step reads the candidates' sources with
    # their keys in one statement, then their co_extracted links (on PostgreSQL each a round trip)
    async with Engine(make_settings("")) as engine:
        parts = await remember(engine, PARTS, [T0] * 3, source="story-1")
        ranked = [Candidate(i, vitals=(T0, 1.0, 0.5, T0)) for i in parts]

        def counted(conn):
            sent: list[str] = []

            class Counting:
                def execute(self, sql, params=()):
                    sent.append(sql)
                    return conn.execute(sql, params)
            return moments.one_each(Counting(), ranked, 1), sent
        out, sent = await engine.read(counted)
    assert [c.memory_id for c in out] == parts  # the first part placed, the others just below the cut
    assert len(sent) == 2
