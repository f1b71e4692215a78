"""Extraction's second clock: a fact's event date, resolved against when its message was sent, stored."""
from __future__ import annotations

import json
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest

from bot.lifecycle import when
from bot.lifecycle.fact_store import store_facts
from bot.lifecycle.facts import check_fact
from bot.memory.engine import Engine
from tests.helpers import exchange, extract_facts, fact, facts_reply, memories_of

pytestmark = pytest.mark.usefixtures("backend")  # facts stored on both storage backends

WED = datetime(2026, 3, 4, 12, tzinfo=UTC).timestamp()       # Wednesday 4 March 2026, noon
NEXT_WED = datetime(2026, 3, 11, 12, tzinfo=UTC).timestamp()


async def extract_and_store(engine, text: str, at: float = WED, message_id: int = 1):
    ex = exchange(text, created_at=at, message_id=message_id)
    facts = await extract_facts(engine, ex)
    await store_facts(engine, facts, ex, now=at)
    return facts


async def test_tomorrow_in_the_fact_is_the_day_after_the_message(engine, fake_ollama, script):
    script.add("extract", facts_reply(fact("Alice flies to Rome tomorrow.")))
    facts = await extract_and_store(engine, "Tomorrow I fly to Rome!")
    assert [f.happens_on for f in facts] == ["2026-03-05"]
    [stored] = await memories_of(engine)
    assert (stored.text, stored.happens_on, stored.created_at) == ("Alice flies to Rome tomorrow.", "2026-03-05", WED)
    prompt = script.seen["extract"][0]["messages"][1]["content"]
    assert "[Alice, Wed 2026-03-04] Tomorrow I fly to Rome!" in prompt  # the model sees the day too


async def test_a_date_the_model_left_out_is_read_from_the_message(engine, fake_ollama, script):
    script.add("extract", facts_reply(fact("Alice lives in Oslo."), fact("Alice flies to Rome.")))
    facts = await extract_and_store(engine, "I live in Oslo and fly to Rome next Friday.")
    assert [(f.text, f.happens_on) for f in facts] == [("Alice lives in Oslo.", None),
                                                       ("Alice flies to Rome.", "2026-03-13")]
    script.add("extract", facts_reply(fact("Alice sees her sister.")))
    facts = await extract_and_store(engine, "Tomorrow, I see my sister.", message_id=5)
    assert [f.happens_on for f in facts] == ["2026-03-05"]


async def test_the_server_time_zone_decides_the_day(make_settings, fake_ollama, script):
    # 23:30 in Oslo on 4 March is 22:30 UTC: "tomorrow" is the 5th there
    late = datetime(2026, 3, 4, 23, 30, tzinfo=ZoneInfo("Europe/Oslo")).timestamp()
    async with Engine(make_settings(fake_ollama.url, MUNINN_TIMEZONE="Asia/Tokyo")) as tokyo:
        script.add("extract", facts_reply(fact("Alice flies to Rome tomorrow.")))
        assert [f.happens_on for f in await extract_and_store(tokyo, "flying tomorrow", at=late)] == ["2026-03-06"]
    async with Engine(make_settings(fake_ollama.url, MUNINN_TIMEZONE="Europe/Oslo")) as oslo:
        script.add("extract", facts_reply(fact("Alice flies to Rome tomorrow.")))
        assert [f.happens_on for f in await extract_and_store(oslo, "flying tomorrow", at=late)] == ["2026-03-05"]


@pytest.mark.parametrize("given, kept", [
    ("2026-03-10", "2026-03-10"),
    ("2026-03-09/2026-03-15", "2026-03-09/2026-03-15"),
    ("next Tuesday", None), ("2026-13-01", None), (20260310, None), ({"date": "x"}, None), ("", None),
])
async def test_the_model_s_date_is_checked_and_a_bad_one_left_out(engine, fake_ollama, script, given, kept):
    script.add("extract", json.dumps({"facts": [dict(fact("Alice has a dentist appointment."), when=given)]}))
    facts = await extract_and_store(engine, "I have a dentist appointment, wish me luck")
    assert [(f.text, f.happens_on) for f in facts] == [("Alice has a dentist appointment.", kept)]
    assert len(script.seen["extract"]) == 1  # a bad date is no reason to ask again
    [stored] = await memories_of(engine)
    assert stored.happens_on == kept


async def test_the_words_win_over_the_model_s_date(engine, fake_ollama, script):
    script.add("extract", json.dumps({"facts": [dict(fact("Alice flies to Rome tomorrow."), when="2026-01-01")]}))
    assert [f.happens_on for f in await extract_and_store(engine, "flying to Rome tomorrow")] == ["2026-03-05"]


async def test_the_same_words_on_another_date_are_another_event(engine, fake_ollama, script):
    script.add("extract", facts_reply(fact("Alice sees the dentist on Friday.")))
    await extract_and_store(engine, "I see the dentist on Friday.")
    script.add("extract", facts_reply(fact("Alice sees the dentist on Friday.")))
    await extract_and_store(engine, "I see the dentist on Friday.", at=NEXT_WED, message_id=3)
    assert [(m.text, m.happens_on) for m in await memories_of(engine)] == [
        ("Alice sees the dentist on Friday.", "2026-03-06"), ("Alice sees the dentist on Friday.", "2026-03-13")]
    # said again the same week: the same appointment, reinforced
    script.add("extract", facts_reply(fact("Alice sees the dentist on Friday.")))
    await extract_and_store(engine, "I see the dentist on Friday.", at=NEXT_WED + 3600, message_id=5)
    assert len(await memories_of(engine)) == 2


async def test_a_repeated_fact_gains_the_date_it_lacked(engine, fake_ollama, script):
    script.add("extract", json.dumps({"facts": [fact("Alice has a dentist appointment.")]}))
    await extract_and_store(engine, "I have a dentist appointment")
    script.add("extract", json.dumps({"facts": [dict(fact("Alice has a dentist appointment."), when="2026-03-10")]}))
    await extract_and_store(engine, "I have a dentist appointment", message_id=3)
    assert [(m.text, m.happens_on) for m in await memories_of(engine)] == [
        ("Alice has a dentist appointment.", "2026-03-10")]


def test_check_fact_keeps_a_date_and_drops_a_bad_one():
    assert check_fact(dict(fact("Alice flies to Rome."), when="2026-03-05")).when == "2026-03-05"
    assert check_fact(dict(fact("Alice flies to Rome."), when="soon")).when is None
    assert check_fact(fact("Alice flies to Rome.")).when is None


def test_sent_on_shows_the_local_day():
    ex = exchange("hi", created_at=datetime(2026, 3, 4, 23, 30, tzinfo=UTC).timestamp())
    assert when.sent_on(ex, UTC) == "Wed 2026-03-04"
    assert when.sent_on(ex, ZoneInfo("Asia/Tokyo")) == "Thu 2026-03-05"
    assert when.sent_on(exchange("hi"), UTC) == ""
