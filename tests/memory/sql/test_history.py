"""A deleted message is marked in the history and what it alone taught is taken back in one
writer job and one transaction (`history.delete_and_take_back`): a crash between the two
cannot leave a deleted message's facts behind. The edit and the delete share one take-back
(`history.take_back`)."""
from __future__ import annotations

import time

import pytest

from bot.conversation.pipeline import Pipeline
from bot.memory import records
from bot.memory.sql import history
from tests.conversation.test_pipeline import ALICE, GENERAL, GUILD

pytestmark = pytest.mark.usefixtures("backend")


async def alice_said(engine, message_id: int, text: str, fact: str) -> int:
    await engine.write(history.record, channel_id=GENERAL, guild_id=GUILD, author_id=ALICE, author_name="Alice",
                       role="user", content=text, created_at=time.time(), message_id=message_id)
    return await engine.remember(records.NewMemory(fact, "personal", owner_id=ALICE, source_message_ids=[message_id]))


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)  # apsw's commit hook counts the transactions
async def test_a_delete_and_its_take_back_are_one_transaction(engine):
    pipeline = Pipeline(engine)
    learned = await alice_said(engine, 2000, "I moved to Oslo", "Alice lives in Oslo")
    kept = await alice_said(engine, 2001, "I have a cat", "Alice has a cat")
    commits: list[int] = []
    await engine.write(lambda conn: conn.set_commit_hook(lambda: commits.append(1) or False))
    assert await pipeline.deleted([2000]) == 1
    await engine.write(lambda conn: conn.set_commit_hook(None))
    assert commits == [1]
    assert await engine.get_many([learned]) == {} and list(await engine.get_many([kept])) == [kept]
    gone = await engine.read(history.get, 2000)
    assert gone is not None and gone.content == ""


async def test_a_delete_of_a_message_the_history_no_longer_holds_takes_back_what_it_taught(engine):
    pipeline = Pipeline(engine)
    learned = await engine.remember(records.NewMemory("Alice lives in Oslo", "personal", owner_id=ALICE,
                                                    source_message_ids=[2000]))  # its message was pruned
    assert await pipeline.deleted([2000]) == 0  # no history row marked
    assert await engine.get_many([learned]) == {}
    assert await engine.write(history.take_back, [2000]) == []  # nothing left to take back
