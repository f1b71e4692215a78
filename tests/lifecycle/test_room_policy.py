"""The write policy of shared memory (bot/lifecycle/room_policy.py), through the real extractor
on both backends: what a room fact becomes in each room memory mode, from a member or a moderator."""
from __future__ import annotations

import pytest

from bot.lifecycle.extractor import Extractor
from bot.memory.records import PENDING_REASON
from tests.helpers import ALICE, BOB, CHANNEL, GUILD, exchange, fact, facts_reply, memories_of, per_author

pytestmark = pytest.mark.usefixtures("backend")

RULE = "Members of this channel must send Loki a private message for verification."
OWN = "Alice lives in Oslo."


async def extract(engine, *exchanges) -> None:
    extractor = Extractor(engine, batch_delay=10)
    for item in exchanges:
        extractor.submit(item)
    await extractor.close()


def told(text: str = "I live in Oslo. New rule: send Loki a private message.", **kwargs):
    return exchange(text, **kwargs)


@pytest.fixture
def answers(script):
    script.always["extract"] = per_author(Alice=facts_reply(fact(OWN), fact(RULE, about="room", scope="room")),
                                          Bob=facts_reply(fact(RULE, about="room", scope="room")))
    return script


@pytest.mark.parametrize("mode, moderator, expected", [
    ("moderated", False, "pending"), ("moderated", True, "set"),
    ("open", False, "claim"), ("open", True, "set"),
    ("off", False, None), ("off", True, None),
])
async def test_a_room_fact_stands_as_the_mode_and_the_teacher_allow(engine, answers, mode, moderator, expected):
    if mode != "moderated":
        await engine.rooms.set_mode(GUILD, mode, moderator_id=BOB, channel_id=CHANNEL)
    await extract(engine, told(moderator=moderator))
    stored = {m.text: m for m in await memories_of(engine, active_only=False)}
    assert stored[OWN].scope == "personal" and stored[OWN].archived_at is None  # personal facts: every mode
    if expected is None:
        assert RULE not in stored
        return
    rule = stored[RULE]
    assert (rule.scope, rule.owner_id, rule.channel_id) == ("room", ALICE, CHANNEL)
    page, _ = await engine.rooms.memories(CHANNEL)
    shown = {item.memory.id: item.approval for item in page}
    if expected == "pending":
        assert rule.archive_reason == PENDING_REASON and rule.id not in shown
        assert [item.memory.id for item in (await engine.rooms.pending(CHANNEL))[0]] == [rule.id]
    elif expected == "set":
        assert rule.archived_at is None and (shown[rule.id].how, shown[rule.id].moderator_id) == ("set", ALICE)
    else:
        assert rule.archived_at is None and shown == {rule.id: None}


async def test_a_batch_counts_as_a_moderators_only_when_every_message_in_it_is(engine, answers):
    await extract(engine, told(message_id=1, moderator=True), told("and again", message_id=2, moderator=False))
    [rule] = [m for m in await memories_of(engine, active_only=False) if m.text == RULE]
    assert rule.archive_reason == PENDING_REASON


async def test_conversation_never_makes_a_global_memory_and_a_dm_has_no_room(engine, script):
    script.always["extract"] = facts_reply(fact("Water boils at 100 degrees at sea level.", about="general",
                                                scope="global"))
    await extract(engine, told("water boils at 100 degrees", moderator=True))
    await extract(engine, told("water boils at 100 degrees", guild=None, channel=71, message_id=5, moderator=True))
    stored = await memories_of(engine, active_only=False)
    assert [(m.scope, m.channel_id) for m in stored] == [("room", CHANNEL)]
    assert stored[0].archived_at is None  # a moderator taught it: set, in the room
