"""Fair share of answers (bot/conversation/rate.py): the token bucket alone, then through the
pipeline with the real engine and the fake Ollama."""
from __future__ import annotations

import math

import pytest

from bot.conversation.pipeline import Pipeline
from bot.conversation.rate import NOTICE_EVERY_S, SWEEP_EVERY, MemberRate
from bot.memory.engine import Engine
from bot.memory.sql import history
from tests.conversation.test_pipeline import ALICE, ALICE_DM, BOB, GENERAL, RANDOM, RecordingOutlet, RecordingSink, said


class Clock:
    """A clock the test moves by hand."""

    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def allowed(rate: MemberRate, user: int, n: int) -> int:
    return sum(rate.take(user).allowed for _ in range(n))


def test_a_burst_then_the_refill_rate():
    clock = Clock()
    rate = MemberRate(6, 3, clock=clock)
    assert allowed(rate, ALICE, 10) == 3          # the burst, then nothing
    clock.now += 9.9
    assert not rate.take(ALICE).allowed           # 6 a minute: one token every 10 s
    clock.now += 0.1
    assert rate.take(ALICE).allowed and not rate.take(ALICE).allowed
    clock.now += 60
    assert allowed(rate, ALICE, 10) == 3          # refilled up to the burst, never beyond
    clock.now += 3600
    assert rate.tokens(ALICE) == 3


def test_members_have_buckets_of_their_own():
    clock = Clock()
    rate = MemberRate(6, 2, clock=clock)
    assert allowed(rate, ALICE, 5) == 2
    assert allowed(rate, BOB, 5) == 2             # Alice's flood took nothing of Bob's
    clock.now += 10
    assert allowed(rate, ALICE, 5) == 1 and allowed(rate, BOB, 5) == 1


def test_the_sign_is_shown_once_per_window():
    clock = Clock()
    rate = MemberRate(6, 1, clock=clock)
    assert rate.take(ALICE).allowed
    refusals = [rate.take(ALICE) for _ in range(5)]
    assert [v.notify for v in refusals] == [True, False, False, False, False]
    clock.now += 10                                # a token back: one answered, the next refused quietly
    assert rate.take(ALICE).allowed and not rate.take(ALICE).notify
    clock.now += NOTICE_EVERY_S
    assert rate.take(ALICE).allowed
    assert rate.take(ALICE).notify                 # a new window: one sign again


def test_zero_turns_the_limit_off():
    rate = MemberRate(0, 3)
    assert not rate.enabled and allowed(rate, ALICE, 1000) == 1000 and len(rate) == 0


def test_people_whose_bucket_filled_up_again_are_forgotten():
    clock = Clock()
    rate = MemberRate(6, 2, clock=clock)
    for user in range(SWEEP_EVERY - 1):
        rate.take(user)
    assert len(rate) == SWEEP_EVERY - 1
    clock.now += NOTICE_EVERY_S
    rate.take(10**6)                               # the sweep runs: everyone is full again
    assert len(rate) == 1


@pytest.mark.usefixtures("backend")
async def test_a_flood_gets_the_burst_and_the_refill_and_costs_no_more_model_calls(make_settings, fake_ollama):
    """Alice floods a channel and her DM: she gets her burst, then one answer per refilled
    token; the rest are kept as context, never answered, never extracted, and cost no chat
    request. Bob, in the same channel, is answered as if she were not there."""
    clock = Clock()
    async with Engine(make_settings(fake_ollama.url, MUNINN_RATE_PER_MINUTE=6, MUNINN_RATE_BURST=3)) as engine:
        events: list = []
        sink = RecordingSink(events)
        pipeline = Pipeline(engine, sink)
        pipeline.rate = MemberRate(6, 3, clock=clock)  # the settings' limit, on a clock the test moves
        slowed: list[str] = []

        class Outlet(RecordingOutlet):
            async def slow_down(self) -> None:
                slowed.append(self.label)

        replies = []
        for n in range(40):
            dm = n % 4 == 0  # her DM counts against the same share
            message = said(f"flood {n}", channel=ALICE_DM if dm else GENERAL, dm=dm, at=1000.0 + n)
            replies.append(await pipeline.respond(message, Outlet(events, f"flood {n}")))
            clock.now += 0.5
        bob = await pipeline.respond(said("hello from Bob", author=BOB, name="Bob", channel=GENERAL), Outlet(events))
        kept = await engine.write(history.recent, GENERAL, 100)
        dm_kept = await engine.write(history.recent, ALICE_DM, 100)
    answered = [r for r in replies if r is not None]
    refill = math.floor(39 * 0.5 * 6 / 60)        # the last one came 19.5 s after the first: one token back
    assert len(answered) == 3 + refill
    assert [r is not None for r in replies[:4]] == [True, True, True, False]
    assert bob is not None and bob.ok
    chats = [r for r in fake_ollama.chat_requests() if not r.get("format")]
    assert len(chats) == len(answered) + 1         # no model call for a message held back
    assert [e.user_message for e in sink.exchanges] == [r.prompt.messages[-1]["content"].rsplit(": ", 1)[-1]
                                                        for r in answered] + ["hello from Bob"]
    assert slowed == ["flood 3"]                   # one sign in the window, on the first refused message
    user_rows = [m.content for m in kept + dm_kept if m.role == "user" and m.author_id == ALICE]
    assert sorted(user_rows) == sorted(f"flood {n}" for n in range(40))  # all kept as context


async def test_a_request_to_forget_is_never_held_back(engine):
    """"forget that ..." in plain words costs no reply: a person over their share still gets it."""
    pipeline = Pipeline(engine)
    pipeline.rate = MemberRate(6, 1, clock=Clock())
    sent: list = []

    class Confirming(RecordingOutlet):
        async def confirm_forget(self, offer):
            sent.append(offer)
            return []

    assert await pipeline.respond(said("hi", channel=RANDOM), Confirming([])) is not None
    assert await pipeline.respond(said("hi again", channel=RANDOM), Confirming([])) is None
    reply = await pipeline.respond(said("forget that I live in Oslo", channel=RANDOM), Confirming([]))
    assert reply is not None and reply.prompt is None   # answered, by the forget path, not the model
