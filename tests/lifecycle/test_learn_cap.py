"""Fair share of what Muninn learns: at most MUNINN_LEARN_PER_DAY new memories from one person in
one channel (or DM) in 24 hours (bot/memory/writing/facts.py, LearnBudget); real engine, fake Ollama."""
from __future__ import annotations

import logging

import pytest

from bot.lifecycle.fact_store import store_facts, store_facts_detailed
from bot.lifecycle.facts import Fact
from bot.memory.engine import Engine
from bot.memory.writing import facts as fact_writes
from bot.memory.writing.facts import DAY_S
from tests.helpers import ALICE, BOB, CHANNEL, DM_CHANNEL, GUILD, exchange, memories_of, one

pytestmark = pytest.mark.usefixtures("backend")  # the cap on both storage backends

NOW = 1_800_000_000.0
CAP = 5


def taught(n: int, *, owner: int = ALICE, channel: int = CHANNEL, scope: str = "room", tag: str = "") -> Fact:
    """A fact of its own words (no two are duplicates or updates of each other)."""
    guild = None if channel == DM_CHANNEL else GUILD
    about = "room" if scope == "room" else "Alice"
    return Fact(f"Quokka{tag}{n} zebu{tag}{n}x tapir{tag}{n}y", about, scope, 0.5, owner, channel, guild, (n,))


@pytest.fixture
async def capped(fake_ollama, make_settings):
    async with Engine(make_settings(fake_ollama.url, MUNINN_LEARN_PER_DAY=CAP)) as engine:
        yield engine


async def test_one_person_learns_at_most_the_cap_in_a_channel_in_a_day(capped, caplog):
    with caplog.at_level(logging.INFO, logger="bot.lifecycle.fact_store"):
        first = await store_facts_detailed(capped, [taught(n) for n in range(3)], exchange("."), now=NOW)
        second = await store_facts_detailed(capped, [taught(n, scope="personal") for n in range(3, 7)],
                                            exchange("."), now=NOW + 60)
    assert len(first.inserted) == 3 and len(second.inserted) == 2
    assert second.dropped == {(ALICE, CHANNEL): (2, 5)}
    [line] = [r.getMessage() for r in caplog.records if "MUNINN_LEARN_PER_DAY" in r.getMessage()]
    assert f"2 new facts of user {ALICE} in channel {CHANNEL} (5 taught there" in line
    assert "Quokka" not in line and "zebu" not in line      # counts, never what the facts said
    assert await capped.facts.taught_since(ALICE, CHANNEL, NOW - DAY_S) == CAP
    assert len(await memories_of(capped)) == CAP

    # the cap is per person and per channel: Bob here, and Alice in her DM, start from zero
    assert len(await store_facts(capped, [taught(n, owner=BOB, tag="b") for n in range(7)], exchange("."),
                                 now=NOW + 120)) == CAP
    dm = [taught(n, channel=DM_CHANNEL, scope="personal", tag="d") for n in range(7)]
    assert len(await store_facts(capped, dm, exchange(".", guild=None, channel=DM_CHANNEL), now=NOW + 120)) == CAP
    # a day after the first ones, they no longer count
    later = await store_facts_detailed(capped, [taught(n, tag="l") for n in range(4)], exchange("."),
                                       now=NOW + DAY_S + 30)
    assert len(later.inserted) == 3 and later.dropped == {(ALICE, CHANNEL): (1, CAP)}
    assert await capped.facts.taught_since(ALICE, CHANNEL, NOW + 30) == 2 + 3


async def test_at_the_cap_a_repeated_fact_still_reinforces_what_was_learned(capped):
    ids = await store_facts(capped, [taught(n) for n in range(CAP)], exchange("."), now=NOW)
    before = await one(capped, ids[0])
    outcome = await store_facts_detailed(capped, [taught(0), taught(99)], exchange("."), now=NOW + 60)
    assert outcome.reinforced == [ids[0]] and outcome.inserted == [] and outcome.ids == [ids[0]]
    assert outcome.dropped == {(ALICE, CHANNEL): (1, CAP)}
    after = await one(capped, ids[0])
    assert after.stability > before.stability                # reinforced, and not counted as new
    assert await capped.facts.taught_since(ALICE, CHANNEL, NOW - DAY_S) == CAP


async def test_archived_memories_still_count_as_taught(capped):
    ids = await store_facts(capped, [taught(n) for n in range(CAP)], exchange("."), now=NOW)
    await capped.archive(ids[0], "replaced")
    outcome = await store_facts_detailed(capped, [taught(42)], exchange("."), now=NOW + 1)
    assert outcome.inserted == [] and outcome.dropped == {(ALICE, CHANNEL): (1, CAP)}


async def test_zero_turns_the_cap_off(fake_ollama, make_settings):
    async with Engine(make_settings(fake_ollama.url, MUNINN_LEARN_PER_DAY=0)) as engine:
        outcome = await store_facts_detailed(engine, [taught(n) for n in range(40)], exchange("."), now=NOW)
    assert len(outcome.inserted) == 40 and not outcome.dropped


async def test_the_planning_counts_what_the_write_counts_itself(capped):
    """The write takes the counts its planning read (one round trip on PostgreSQL); without them
    (a caller that did not plan) it counts inside its own transaction, the same way."""
    await store_facts(capped, [taught(n) for n in range(CAP - 1)], exchange("."), now=NOW)
    memories = [taught(n, tag="p").to_new_memory() for n in range(2)]
    settings = capped.settings
    plan = await capped.facts.plan(settings.embed_model, memories, None, settings, ["room", "room"], NOW + 1)
    assert plan[3] == {(ALICE, CHANNEL): CAP - 1}
    unplanned = await capped.write(fact_writes.write_facts, memories, None, [None, None], settings=settings, now=NOW + 1)
    assert len(unplanned.inserted) == 1 and unplanned.dropped == {(ALICE, CHANNEL): (1, CAP)}
