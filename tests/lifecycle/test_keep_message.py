""""Remember this" (bot/lifecycle/keep_message.py) on a real engine, both backends: the scope the
keeper picks, the room memory mode, attribution to the message's author, the sensitive filter,
no secrets, the author's pause, and the same message kept twice."""
from __future__ import annotations

import pytest

from bot.lifecycle import keep_message
from bot.lifecycle.keep_message import Keeper, Refused, Said, keep
from bot.memory.records import PENDING_REASON
from bot.memory.scope import Viewer
from bot.memory.sql.rooms import APPROVED, SET
from tests.helpers import ALICE, BOB, CHANNEL, GUILD, OWNER

pytestmark = pytest.mark.usefixtures("backend")

CAROL = 303  # a moderator
MESSAGE = 987654321012345678


def bobs(content: str, *, guild: int | None = GUILD, message_id: int = MESSAGE) -> Said:
    return Said(message_id=message_id, channel_id=CHANNEL, guild_id=guild, author_id=BOB, author_name="Bob",
                content=content, created_at=1_765_000_000.0)


ALICE_KEEPS = Keeper(ALICE)
CAROL_KEEPS = Keeper(CAROL, moderator=True)


async def test_personal_is_the_keepers_memory_naming_the_author(fts_engine):
    engine = fts_engine
    kept = await keep(engine, bobs("game night is on Thursdays now"), ALICE_KEEPS, "personal")
    memory = await engine.get(kept.memory_id)
    assert (kept.standing, memory.scope, memory.owner_id) == (keep_message.PERSONAL, "personal", ALICE)
    assert memory.text == "Bob said: game night is on Thursdays now"
    assert memory.source_message_ids == [str(MESSAGE)] and memory.created_at == 1_765_000_000.0
    assert await engine.mentioned(memory.id) == {BOB}  # Bob may export and erase it
    assert (await engine.list_visible(Viewer(BOB, CHANNEL, GUILD)))[1] == 0  # but never sees it
    own = await keep(engine, bobs("I host game night on Thursdays"), Keeper(BOB), "personal")
    mine = await engine.get(own.memory_id)
    assert (mine.owner_id, mine.text, await engine.mentioned(mine.id)) == (
        BOB, "I host game night on Thursdays", set())


async def test_the_same_message_kept_again_gives_the_same_memory(fts_engine):
    first = await keep(fts_engine, bobs("game night is on Thursdays now"), ALICE_KEEPS, "personal")
    again = await keep(fts_engine, bobs("game night is on Thursdays now"), ALICE_KEEPS, "personal")
    assert again.again and again.memory_id == first.memory_id
    other = await keep(fts_engine, bobs("game night is on Thursdays now"), Keeper(CAROL), "personal")
    assert not other.again and other.memory_id != first.memory_id


@pytest.mark.parametrize("mode, keeper, standing, waiting, approval", [
    ("moderated", ALICE_KEEPS, keep_message.WAITING, True, None),
    ("open", ALICE_KEEPS, keep_message.CLAIM, False, None),
    ("moderated", CAROL_KEEPS, keep_message.APPROVED_BY_YOU, False, (APPROVED, CAROL)),
    ("open", Keeper(BOB, moderator=True), keep_message.SET_BY_YOU, False, (SET, BOB)),
])
async def test_a_room_memory_is_the_authors_claim_under_the_servers_mode(fts_engine, mode, keeper, standing, waiting,
                                                                         approval):
    engine = fts_engine
    await engine.rooms.set_mode(GUILD, mode, moderator_id=CAROL, channel_id=CHANNEL)
    kept = await keep(engine, bobs("quiz night starts at nine"), keeper, "room")
    memory = await engine.get(kept.memory_id)
    assert (kept.standing, memory.scope, memory.owner_id, memory.text) == (
        standing, "room", BOB, "quiz night starts at nine")
    assert (memory.archive_reason == PENDING_REASON) is waiting
    vouched = (await engine.rooms.attribution(CHANNEL, [memory])).approvals.get(memory.id)
    assert (None if vouched is None else (vouched.how, vouched.moderator_id)) == approval
    if approval is not None and approval[1] != BOB:
        assert [(e.action, e.moderator_id, e.memory_id) for e in await engine.rooms.log(CHANNEL)][0] == (
            "approve", CAROL, memory.id)


async def test_refusals_store_nothing(fts_engine):
    engine = fts_engine
    await engine.rooms.set_mode(GUILD, "off", moderator_id=CAROL, channel_id=CHANNEL)
    cases = [
        (bobs("quiz night starts at nine"), CAROL_KEEPS, "room", "off in this server"),
        (bobs("quiz night starts at nine", guild=None), ALICE_KEEPS, "room", "belongs to a server channel"),
        (bobs("quiz night starts at nine"), ALICE_KEEPS, "global", "Only the bot's owner"),
        (bobs("the wifi password is hunter2-Quokka"), Keeper(BOB), "personal", "no passwords"),
        (bobs("the wifi password is hunter2-Quokka"), Keeper(OWNER, operator=True), "global", "no passwords"),
        (bobs("I was diagnosed with diabetes last year"), ALICE_KEEPS, "personal", "sensitive (health)"),
        (bobs("   "), ALICE_KEEPS, "personal", "no text"),
    ]
    for said, keeper, scope, why in cases:
        with pytest.raises(Refused, match=why.replace("(", r"\(").replace(")", r"\)")):
            await keep(engine, said, keeper, scope)
    assert (await engine.stats())["active"] == 0
    # Bob's own health fact stays his to keep, for himself.
    kept = await keep(engine, bobs("I was diagnosed with diabetes last year"), Keeper(BOB), "personal")
    assert (await engine.get(kept.memory_id)).owner_id == BOB


async def test_nothing_of_a_person_who_paused_their_memory(fts_engine):
    engine = fts_engine
    await engine.pause_memory(BOB)
    with pytest.raises(Refused, match="Its author asked"):
        await keep(engine, bobs("quiz night starts at nine"), ALICE_KEEPS, "personal")
    with pytest.raises(Refused, match="paused"):
        await keep(engine, bobs("quiz night starts at nine"), Keeper(BOB), "personal")
    assert (await engine.stats())["active"] == 0


async def test_global_is_the_operators_note_attributed_to_the_author(fts_engine):
    kept = await keep(fts_engine, bobs("the server rules are pinned"), Keeper(OWNER, operator=True), "global")
    memory = await fts_engine.get(kept.memory_id)
    assert (memory.scope, memory.owner_id, memory.text) == ("global", OWNER, "Bob said: the server rules are pinned")
