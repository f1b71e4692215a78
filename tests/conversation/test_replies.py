"""Reply chains (bot/conversation/replies.py) on a real engine, both backends: the message a reply
points at comes from the stored history or the outlet, the chain is bounded, stays in its channel,
never brings back deleted words or a paused person's, and a failing outlet costs only the chain."""
from __future__ import annotations

import pytest

from bot.conversation.replies import Quoted, with_chain
from bot.memory.messages import HistoryMessage
from tests.helpers import ALICE, BOB, CHANNEL, GUILD

pytestmark = pytest.mark.usefixtures("backend")

MUNINN = 999
OTHER_CHANNEL = 80


class Outlet:
    """A stand-in for Discord's side: the messages it can read, and how often it was asked."""

    def __init__(self, messages: dict[int, Quoted], fail: bool = False):
        self.messages, self.fail, self.asked = messages, fail, []

    def typing(self):
        raise AssertionError("not used")

    async def send(self, text: str):
        raise AssertionError("not used")

    async def quoted(self, message_id: int) -> Quoted | None:
        self.asked.append(message_id)
        if self.fail:
            raise ConnectionError("Discord is down")
        return self.messages.get(message_id)


def said(message_id: int, text: str, refers_to: int | None = None, author: int = BOB) -> Quoted:
    return Quoted(id=message_id, author_id=author, author_name="Bob" if author == BOB else "Alice", content=text,
                  created_at=1000.0 + message_id, refers_to=refers_to)


async def record(engine, message_id: int, text: str, *, author: int = BOB, channel: int = CHANNEL,
                 role: str = "user", reply_to: int | None = None) -> None:
    await engine.messages.record(dict(channel_id=channel, guild_id=GUILD, author_id=author,
                                      author_name="Bob" if author == BOB else "Muninn", role=role, content=text,
                                      created_at=1000.0 + message_id, message_id=message_id, reply_to=reply_to))


def recent_history() -> list[HistoryMessage]:
    return [HistoryMessage(id=500 + n, channel_id=CHANNEL, guild_id=GUILD, author_id=ALICE, author_name="Alice",
                           role="user", content=f"chatter {n}", created_at=2000.0 + n) for n in range(3)]


async def chain(engine, outlet, reply_to: int | None, recent=None) -> list[tuple[int, str]]:
    merged = await with_chain(engine, channel_id=CHANNEL, guild_id=GUILD, reply_to=reply_to,
                              recent=recent_history() if recent is None else recent, outlet=outlet,
                              assistant_id=MUNINN)
    return [(m.id, m.content) for m in merged if m.id < 500]


async def test_the_message_replied_to_and_its_chain_bounded_oldest_first(fts_engine):
    outlet = Outlet({10: said(10, "the plan: meet at the old mill", 9), 9: said(9, "where do we meet?", 8),
                     8: said(8, "are we doing the hike?", 7), 7: said(7, "hello")})
    assert await chain(fts_engine, outlet, 10) == [(8, "are we doing the hike?"), (9, "where do we meet?"),
                                                   (10, "the plan: meet at the old mill")]
    assert outlet.asked == [10, 9, 8]  # three back, no further
    merged = await with_chain(fts_engine, channel_id=CHANNEL, guild_id=GUILD, reply_to=10, recent=recent_history(),
                              outlet=outlet, assistant_id=MUNINN)
    assert [m.id for m in merged] == [8, 9, 10, 500, 501, 502]  # in time order, before the recent ones
    assert await chain(fts_engine, outlet, None) == []


async def test_the_stored_history_first_and_muninns_replies_followed_without_discord(fts_engine):
    engine = fts_engine
    await record(engine, 20, "what's the capital of Norway?")
    await record(engine, 21, "Oslo.", author=MUNINN, role="assistant", reply_to=20)
    outlet = Outlet({20: said(20, "what's the capital of Norway? (as Discord has it)", 19),
                     19: said(19, "quiz time")})
    assert await chain(engine, outlet, 21) == [(19, "quiz time"), (20, "what's the capital of Norway?"),
                                               (21, "Oslo.")]
    assert outlet.asked == [20, 19]  # Muninn's reply says what it answered; a person's, Discord does
    roles = {m.id: m.role for m in await with_chain(engine, channel_id=CHANNEL, guild_id=GUILD, reply_to=21,
                                                    recent=[], outlet=outlet, assistant_id=MUNINN)}
    assert roles == {19: "user", 20: "user", 21: "assistant"}


async def test_what_the_recent_history_holds_is_not_repeated(fts_engine):
    outlet = Outlet({501: said(501, "chatter 1", 9), 9: said(9, "the old question")})
    assert await chain(fts_engine, outlet, 501) == [(9, "the old question")]


async def test_a_deleted_message_ends_the_chain(fts_engine):
    engine = fts_engine
    await record(engine, 30, "my secret plan")
    await engine.messages.delete([30])
    outlet = Outlet({30: said(30, "my secret plan", 29), 29: said(29, "earlier")})
    assert await chain(engine, outlet, 30) == [] and outlet.asked == []


async def test_another_channels_message_is_never_brought_in(fts_engine):
    engine = fts_engine
    await record(engine, 40, "said in the staff room", channel=OTHER_CHANNEL)
    assert await chain(engine, Outlet({}), 40) == []  # the outlet reads only its own channel


async def test_a_paused_persons_words_stay_out(fts_engine):
    engine = fts_engine
    await engine.pause_memory(BOB)
    outlet = Outlet({50: said(50, "Bob's words", 49), 49: said(49, "Alice's words", author=ALICE)})
    assert await chain(engine, outlet, 50) == [(49, "Alice's words")]


async def test_a_failing_outlet_costs_only_the_chain(fts_engine):
    history = recent_history()
    merged = await with_chain(fts_engine, channel_id=CHANNEL, guild_id=GUILD, reply_to=60, recent=history,
                              outlet=Outlet({}, fail=True), assistant_id=MUNINN)
    assert merged == history
