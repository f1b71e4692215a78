"""Recalled memories as claims (bot/conversation/claims.py): who stands behind each, from the
memory's scope, its approval and the names people last used in the channel."""
from __future__ import annotations

import pytest

from bot.conversation import prompt
from bot.conversation.claims import claim, claims
from bot.memory.records import Memory, NewMemory
from bot.memory.rooms import APPROVED, Approval, Attribution
from bot.memory.sql import history

BOB, CAROL, DAVE = 2, 3, 4


def memory(memory_id: int, scope: str, owner: int | None) -> Memory:
    return Memory(id=memory_id, text=f"memory {memory_id}", scope=scope, owner_id=owner, channel_id=10, guild_id=1,
                  vis_key="x", importance=0.5, stability=1.0, access_count=0, last_accessed=None, created_at=1e9,
                  updated_at=1e9, archived_at=None, archive_reason=None)


def test_each_scope_and_approval_makes_its_kind_of_claim():
    found = Attribution(approvals={3: Approval(APPROVED, CAROL, 1e9), 4: Approval("set", CAROL, 1e9),
                                   5: Approval(APPROVED, None, 1e9)},
                        names={BOB: "Bob", CAROL: "Carol"})
    made = [claim(m, found, viewer_id=DAVE, viewer_name="Dave") for m in (
        memory(1, "personal", DAVE), memory(2, "room", BOB), memory(3, "room", BOB), memory(4, "room", CAROL),
        memory(5, "room", DAVE), memory(6, "global", None), memory(7, "personal", BOB))]
    assert [(c.kind, c.by, c.moderator) for c in made] == [
        (prompt.OWN, "Dave", None), (prompt.MEMBER, "Bob", None), (prompt.APPROVED, "Bob", "Carol"),
        (prompt.MODERATOR, None, "Carol"), (prompt.APPROVED, None, None), (prompt.OPERATOR, None, None),
        (prompt.MEMBER, None, None)]
    assert all(c.said_at == 1e9 and c.text.startswith("memory ") for c in made)


@pytest.mark.usefixtures("backend")
async def test_claims_read_the_names_once_and_survive_a_failed_read(engine, monkeypatch):
    await engine.write(history.record, channel_id=10, guild_id=1, author_id=BOB, author_name="Bob", role="user",
                       content="hi", created_at=1e9, message_id=77)
    room = await engine.remember(NewMemory("game night is on Fridays", "room", owner_id=BOB, channel_id=10, guild_id=1))
    found = list((await engine.get_many([room])).values())
    [made] = await claims(engine, found, viewer_id=DAVE, viewer_name="Dave", channel_id=10)
    assert (made.kind, made.by) == (prompt.MEMBER, "Bob")

    async def broken(*args, **kwargs):
        raise RuntimeError("the database is busy")
    monkeypatch.setattr(engine.rooms, "attribution", broken)
    [made] = await claims(engine, found, viewer_id=DAVE, viewer_name="Dave", channel_id=10)
    assert (made.kind, made.by) == (prompt.MEMBER, None)  # still given, as a member's claim


@pytest.mark.usefixtures("backend")
async def test_claims_carry_the_event_date_and_mark_an_earlier_memory_only_beside_its_newer(engine):
    rome = await engine.remember(NewMemory("Dave flies to Rome", "personal", owner_id=DAVE, happens_on="2026-03-05"))
    oslo = await engine.remember(NewMemory("Dave lives in Oslo", "personal", owner_id=DAVE, created_at=1e9))
    bergen = await engine.remember(NewMemory("Dave lives in Bergen", "personal", owner_id=DAVE, created_at=2e9))
    found = await engine.get_many([rome, bergen, oslo])
    made = await claims(engine, [found[rome], found[bergen], found[oslo]], viewer_id=DAVE, viewer_name="Dave",
                        channel_id=None, outdated={oslo: bergen})
    assert [(c.text, c.happens, c.earlier) for c in made] == [
        ("Dave flies to Rome", "2026-03-05", False), ("Dave lives in Bergen", None, False),
        ("Dave lives in Oslo", None, True)]
    # the newer one was not shown (cut from the list): the older is no longer "earlier" than anything shown
    made = await claims(engine, [found[oslo]], viewer_id=DAVE, viewer_name="Dave", channel_id=None,
                        outdated={oslo: bergen})
    assert [c.earlier for c in made] == [False]
