"""Fact extraction through the real engine and the fake Ollama server (scripted chat replies)."""
from __future__ import annotations

import asyncio
import json
import logging
import time

import apsw
import pytest

from bot.lifecycle.extractor import MAX_TRIES, Extractor
from bot.lifecycle.fact_store import store_facts
from bot.lifecycle.facts import FACT_SCHEMA, Fact
from bot.llm.answers import parse_json_reply, strip_reasoning
from bot.llm.errors import OllamaUnavailable
from bot.memory.engine import Engine
from bot.memory.scope import Viewer
from tests.fakes.ollama import FakeOllama
from tests.helpers import (
    ALICE,
    BOB,
    CHANNEL,
    DM_CHANNEL,
    GUILD,
    OWNER,
    author_of,
    exchange,
    extract_facts,
    fact,
    facts_reply,
    links_of,
    memories_of,
    per_author,
    until,
)

pytestmark = pytest.mark.usefixtures("backend")  # extraction and fact storage on both storage backends

# -- parsing (pure) ---------------------------------------------------------------

@pytest.mark.parametrize("raw, expected", [
    ('{"facts": []}', {"facts": []}),
    ('<think>Alice said "{" once</think>{"facts": []}', {"facts": []}),
    ('<think>unfinished reasoning {"facts": [1]}', None),
    ('</think>\n[]', []),
    ('```json\n{"facts": []}\n```', {"facts": []}),
    ('Sure! Here you go:\n```\n[{"a": 1}]\n```\nHope it helps', [{"a": 1}]),
    ('Here is the JSON: {"facts": []} done', {"facts": []}),
    ('```json\n{"facts": []}', {"facts": []}),
])
def test_parse_json_reply_tolerates_reasoning_fences_and_prose(raw, expected):
    if expected is None:
        with pytest.raises(ValueError):
            parse_json_reply(raw)
    else:
        assert parse_json_reply(raw) == expected


@pytest.mark.parametrize("raw", ["", "   ", "<think>only thinking</think>", "not json at all", "{broken", "```\n```"])
def test_parse_json_reply_rejects_what_is_not_json(raw):
    with pytest.raises(ValueError):
        parse_json_reply(raw)


def test_strip_reasoning_keeps_the_answer():
    assert strip_reasoning("<THINK>x</THINK> <thinking>y</thinking> {}") == "{}"


# -- accepted shapes, through the fake server --------------------------------------

GOOD = fact("Alice lives in Oslo.")


@pytest.mark.parametrize("reply", [
    facts_reply(GOOD),
    json.dumps([GOOD]),
    json.dumps(GOOD),
    "<think>The user says they live in Oslo.</think>\n" + facts_reply(GOOD),
    "```json\n" + facts_reply(GOOD) + "\n```",
    "<think>hmm</think>```json\n" + json.dumps([GOOD]) + "\n```",
    json.dumps({"facts": [dict(GOOD, importance="0.6", scope="Personal")]}),
], ids=["object", "bare-list", "single-object", "think", "fence", "think+fence", "lenient-types"])
async def test_accepts_every_usable_shape(engine, fake_ollama, script, reply):
    script.add("extract", reply)
    facts = await extract_facts(engine, exchange("I live in Oslo."))
    assert [(f.text, f.scope, f.owner_id, f.guild_id, f.importance) for f in facts] == [
        ("Alice lives in Oslo.", "personal", ALICE, GUILD, 0.6)]
    assert len(script.seen["extract"]) == 1


async def test_request_uses_structured_output_and_only_the_users_words(engine, fake_ollama, script):
    recalled = ("Alice has a cat named Tom.",)
    ex = exchange("I moved to Bergen last week!", reply="Welcome to Bergen, Alice! How is Tom the cat?",
                  recalled=recalled)
    await extract_facts(engine, ex)
    (request,) = script.seen["extract"]
    assert request["format"] == FACT_SCHEMA
    assert request["stream"] is False
    prompt = json.dumps(request["messages"])
    assert "I moved to Bergen last week!" in prompt and "Alice" in prompt
    for leaked in ("Welcome to Bergen", "Tom", engine.settings.persona):
        assert leaked not in prompt
    assert [m["role"] for m in request["messages"]] == ["system", "user"]


# -- failure modes: retry once, then log and drop -------------------------------

@pytest.mark.parametrize("bad", [
    "this is not JSON",
    "",
    "<think>I should answer with JSON</think>",
    '{"facts": "Alice lives in Oslo"}',
    json.dumps({"facts": [fact("Alice lives in Oslo.", importance="high")]}),
    json.dumps({"facts": [dict(GOOD, text=42)]}),
    json.dumps({"facts": [dict(GOOD, scope="secret")]}),
    json.dumps({"facts": [dict(GOOD, importance=True)]}),
    json.dumps({"facts": [dict(GOOD, importance=7)]}),
    json.dumps({"facts": [fact("I live in Oslo.")]}),
    json.dumps({"facts": [fact("The user lives in Oslo.")]}),
    json.dumps({"facts": [fact("Lives in Oslo.")]}),
    json.dumps({"facts": [{"text": "Alice lives in Oslo."}]}),
    json.dumps("Alice lives in Oslo."),
    json.dumps({"memories": []}),
], ids=["not-json", "empty", "only-think", "facts-not-list", "importance-word", "text-number", "bad-scope",
        "importance-bool", "importance-out-of-range", "first-person", "the-user", "no-name", "missing-fields",
        "json-string", "wrong-key"])
async def test_invalid_answer_is_retried_once_with_the_reason(engine, fake_ollama, script, bad):
    script.add("extract", bad, facts_reply(GOOD))
    facts = await extract_facts(engine, exchange("I live in Oslo."))
    assert [f.text for f in facts] == ["Alice lives in Oslo."]
    first, second = script.seen["extract"]
    assert len(second["messages"]) == len(first["messages"]) + 2
    assert second["messages"][-2]["role"] == "assistant"
    assert "invalid" in second["messages"][-1]["content"]


async def test_invalid_twice_is_logged_and_dropped(engine, fake_ollama, script, caplog):
    script.add("extract", "garbage", "<think>still thinking</think>")
    with caplog.at_level(logging.WARNING, logger="bot"):
        assert await extract_facts(engine, exchange("I live in Oslo.")) == []
    assert len(script.seen["extract"]) == 2
    assert "invalid twice" in caplog.text


async def test_valid_part_of_a_twice_invalid_answer_is_kept(engine, fake_ollama, script):
    half = facts_reply(GOOD, fact("I like tea.", importance=0.3))
    script.add("extract", half, half)
    facts = await extract_facts(engine, exchange("I live in Oslo and I like tea."))
    assert [f.text for f in facts] == ["Alice lives in Oslo."]
    assert len(script.seen["extract"]) == 2


async def test_http_500_is_raised_for_the_extractor_to_try_again(engine, fake_ollama, script):
    fake_ollama.chat_replies.append(FakeOllama.HTTP_500)
    with pytest.raises(OllamaUnavailable, match="500"):
        await extract_facts(engine, exchange("I live in Oslo."))


async def test_timeout_is_raised_for_the_extractor_to_try_again(fake_ollama, make_settings):
    fake_ollama.delay = 2.0
    fake_ollama.chat_replies.append(FakeOllama.TIMEOUT)
    async with Engine(make_settings(fake_ollama.url, OLLAMA_CHAT_TIMEOUT="0.2")) as engine:
        started = time.perf_counter()
        with pytest.raises(OllamaUnavailable, match="did not answer"):
            await extract_facts(engine, exchange("I live in Oslo."))
        assert time.perf_counter() - started < 1.5


async def test_missing_model_is_logged_with_the_fix(engine, fake_ollama, caplog):
    fake_ollama.missing.add("llama3.2")
    with caplog.at_level(logging.WARNING, logger="bot"):
        assert await extract_facts(engine, exchange("I live in Oslo.")) == []
    assert "ollama pull llama3.2" in caplog.text


async def test_ollama_down_is_raised_for_the_extractor_to_try_again(engine, fake_ollama):
    await fake_ollama.go_down()
    with pytest.raises(OllamaUnavailable, match="cannot reach Ollama"):
        await extract_facts(engine, exchange("I live in Oslo."))


async def test_one_failed_extraction_is_tried_again_and_later_facts_are_kept(fake_ollama, make_settings, script):
    # the failure puts background calls on cooldown: the batch and the one after it wait it out
    async with Engine(make_settings(fake_ollama.url, OLLAMA_COOLDOWN="0.5")) as engine:
        fake_ollama.chat_replies.append(FakeOllama.HTTP_500)
        script.add("extract", facts_reply(fact("Alice lives in Oslo.")), facts_reply(fact("Alice has two cats.")))
        extractor = Extractor(engine, batch_delay=0.01)
        extractor.submit(exchange("I live in Oslo."))
        await asyncio.sleep(0.1)
        extractor.submit(exchange("I have two cats.", message_id=2, channel=2))
        await extractor.drain()
        await extractor.close()
        assert extractor.failed == 0 and extractor.processed == 2 and extractor.stored == 2
        assert sorted(m.text for m in await memories_of(engine)) == ["Alice has two cats.", "Alice lives in Oslo."]


async def test_extraction_gives_up_after_a_few_tries_and_says_so(fake_ollama, make_settings, caplog):
    async with Engine(make_settings(fake_ollama.url)) as engine:
        await fake_ollama.go_down()
        extractor = Extractor(engine, batch_delay=0.01)
        with caplog.at_level(logging.INFO, logger="bot.lifecycle"):
            extractor.submit(exchange("I live in Oslo."))
            await extractor.drain()
        await extractor.close()
    assert extractor.failed == 1 and extractor.stored == 0
    assert caplog.text.count("waits for Ollama") == MAX_TRIES - 1
    assert f"failed {MAX_TRIES} times in a row for 1 messages" in caplog.text and "NOT stored" in caplog.text


async def test_no_ollama_configured_extracts_nothing(fts_engine):
    assert await extract_facts(fts_engine, exchange("I live in Oslo.")) == []


# -- attribution and scopes ---------------------------------------------------------

async def test_hearsay_about_someone_else_is_dropped(engine, fake_ollama, script):
    script.add("extract", facts_reply(
        fact("Bob is moving to Paris.", about="Bob"),
        fact("Alice's sister Jane is a doctor.", about="Alice", importance=0.9),
        fact("Muninn is a friendly assistant.", about="Muninn")))
    facts = await extract_facts(engine, exchange("Bob is moving to Paris, and my sister Jane is a doctor."))
    assert [(f.text, f.owner_id) for f in facts] == [("Alice's sister Jane is a doctor.", ALICE)]


async def test_display_names_with_emoji_still_match(engine, fake_ollama, script):
    script.add("extract", facts_reply(fact("Zoë likes tea.", about="Zoë 🌸")), facts_reply(fact("Zoë likes tea.", about="zoë")))
    for _ in range(2):
        (f,) = await extract_facts(engine, exchange("I like tea.", name="Zoë 🌸"))
        assert f.owner_id == ALICE and f.scope == "personal"


async def test_each_author_owns_their_own_facts_in_a_batch(engine, fake_ollama, script):
    script.always["extract"] = per_author(Alice=facts_reply(fact("Alice lives in Oslo.")),
                                          Bob=facts_reply(fact("Bob has two cats.", about="bob")))
    batch = [exchange("I live in Oslo.", message_id=1),
             exchange("I have two cats.", author=BOB, name="Bob", message_id=2)]
    facts = await extract_facts(engine, batch)
    assert [(f.text, f.owner_id, f.source_message_ids) for f in facts] == [
        ("Alice lives in Oslo.", ALICE, (1,)), ("Bob has two cats.", BOB, (2,))]


async def test_each_author_is_asked_alone_with_the_others_as_marked_context(engine, fake_ollama, script):
    batch = [exchange("I live in Oslo.", message_id=1),
             exchange("I have two cats.", author=BOB, name="Bob", message_id=2),
             exchange("Also I work as a nurse.", message_id=3)]
    await extract_facts(engine, batch)
    prompts = {author_of(r): r["messages"][1]["content"] for r in script.seen["extract"]}
    assert set(prompts) == {"Alice", "Bob"} and len(script.seen["extract"]) == 2
    context, own = prompts["Alice"].split("Messages by Alice", 1)
    assert "Do NOT take any fact" in context and "I have two cats." in context
    assert "I live in Oslo." in own and "Also I work as a nurse." in own and "two cats" not in own
    context, own = prompts["Bob"].split("Messages by Bob", 1)
    assert "I live in Oslo." in context and "I have two cats." in own and "Oslo" not in own


async def test_what_bob_says_about_alice_never_becomes_alices_memory(engine, fake_ollama, script):
    # The model mines Bob's message whoever it is asked about (the reviewer's repro).
    script.always["extract"] = facts_reply(fact("Alice is secretly interviewing at a competitor.", importance=0.8))
    extractor = Extractor(engine, batch_delay=0.01)
    extractor.submit(exchange("morning all", message_id=1))
    extractor.submit(exchange("heard Alice is secretly interviewing at a competitor lol", author=BOB, name="Bob",
                              message_id=2))
    await extractor.close()
    assert len(script.seen["extract"]) == 2
    assert await memories_of(engine, active_only=False) == []


async def test_a_fact_leaning_on_someone_elses_words_is_dropped(engine, fake_ollama, script):
    script.always["extract"] = per_author(Alice=facts_reply(
        fact("Alice has a beagle named Rex.", importance=0.6),      # her own words (Bob's "dog" is context)
        fact("Alice lost her job at Acme.", importance=0.9)))       # Acme is only in Bob's message
    batch = [exchange("Who here has a dog? I heard Alice lost her job at Acme", author=BOB, name="Bob",
                      message_id=1),
             exchange("yes, a beagle named Rex! the job hunt starts monday", message_id=2)]
    facts = await extract_facts(engine, batch)
    assert [(f.text, f.owner_id) for f in facts] == [("Alice has a beagle named Rex.", ALICE)]


HIV = fact("Bob is being treated for HIV.", about="room", scope="room", importance=0.9)


@pytest.mark.parametrize("answer, participants", [
    (HIV, ("Bob",)),                                                        # a recent participant
    (dict(HIV, scope="general", about="general"), ("Bob",)),
    (dict(HIV, about="Bob"), ()),                                           # `about` names a person
    (dict(HIV, about="Bob", scope="general"), ()),
    (fact("Jane from accounting is pregnant.", about="Jane", scope="room"), ()),
], ids=["room-participant", "general-participant", "room-about", "general-about", "room-about-stranger"])
async def test_a_room_or_general_label_never_publishes_someone_elses_fact(engine, fake_ollama, script,
                                                                          answer, participants):
    script.add("extract", facts_reply(answer))
    ex = exchange("btw Bob is being treated for HIV, and Jane from accounting is pregnant",
                  participants=participants)
    assert await extract_facts(engine, ex) == []


async def test_a_participant_of_the_batch_counts_as_a_person(engine, fake_ollama, script):
    script.always["extract"] = per_author(Alice=facts_reply(HIV))
    batch = [exchange("btw Bob is being treated for HIV"), exchange("hi", author=BOB, name="Bob", message_id=2)]
    assert await extract_facts(engine, batch) == []


async def test_the_authors_own_fact_labelled_room_stays_personal(engine, fake_ollama, script):
    answer = facts_reply(fact("Alice is pregnant and has not told her employer.", about="room", scope="room"),
                         fact("Alice is pregnant.", about="Alice", scope="general"),
                         fact("This channel plays Valheim on Fridays.", about="room", scope="room"))
    script.add("extract", answer)
    ex = exchange("I'm pregnant, haven't told work. We play Valheim here on Fridays.", participants=("Bob",))
    facts = await extract_facts(engine, ex)
    assert [(f.text, f.scope, f.owner_id, f.guild_id) for f in facts] == [
        ("Alice is pregnant and has not told her employer.", "personal", ALICE, GUILD),
        ("Alice is pregnant.", "personal", ALICE, GUILD),
        ("This channel plays Valheim on Fridays.", "room", ALICE, GUILD)]
    await store_facts(engine, facts, ex)
    carol = await engine.recall("pregnant employer Valheim", Viewer(user_id=303, channel_id=CHANNEL, guild_id=GUILD),
                                touch=False)
    assert carol.texts == ["This channel plays Valheim on Fridays."]


async def test_scopes_map_to_where_the_exchange_happened(engine, fake_ollama, script):
    script.always["extract"] = facts_reply(
        fact("Alice lives in Oslo."),
        fact("This channel plays Valheim on Fridays.", about="room", scope="room"),
        fact("The office wifi is called Hugin.", about="general", scope="general"),
        fact("Alice teaches that the office wifi is called Munin.", about="general", scope="general"))
    in_guild = await extract_facts(engine, exchange("..."))
    assert [(f.scope, f.owner_id, f.channel_id, f.guild_id) for f in in_guild] == [
        ("personal", ALICE, CHANNEL, GUILD), ("room", ALICE, CHANNEL, GUILD), ("room", ALICE, CHANNEL, GUILD),
        ("personal", ALICE, CHANNEL, GUILD)]
    in_dm = await extract_facts(engine, exchange("...", channel=DM_CHANNEL, guild=None))
    assert [(f.text, f.scope, f.owner_id, f.guild_id) for f in in_dm] == [
        ("Alice lives in Oslo.", "personal", ALICE, None),
        ("This channel plays Valheim on Fridays.", "personal", ALICE, None),   # a DM's room is the author
        ("Alice teaches that the office wifi is called Munin.", "personal", ALICE, None)]
    # general knowledge not about the author is dropped in a DM: nobody else may see it


@pytest.mark.parametrize("guild", [GUILD, None], ids=["guild", "dm"])
async def test_extraction_never_creates_a_global_memory(fake_ollama, make_settings, script, guild):
    async with Engine(make_settings(fake_ollama.url, MUNINN_OWNER_IDS=str(OWNER))) as engine:
        script.add("extract", facts_reply(fact("The office wifi is called Hugin.", about="general", scope="general")))
        ex = exchange("Our wifi is called Hugin.", author=OWNER, name="Olaf", guild=guild,
                      channel=CHANNEL if guild else DM_CHANNEL)
        facts = await extract_facts(engine, ex)
        assert [(f.scope, f.owner_id) for f in facts] == ([("room", OWNER)] if guild else [])
        await store_facts(engine, facts, ex)
        assert not any(m.scope == "global" for m in await memories_of(engine))
        elsewhere = await engine.recall("wifi Hugin", Viewer(user_id=BOB, channel_id=999, guild_id=888))
        assert elsewhere.ids == []


@pytest.mark.parametrize("name, about, text", [
    ("🌸", "🌸", "🌸 likes tea."),
    ("❤️", "❤", "❤ likes tea."),                     # the model drops the variation selector
    ("✨ 🌙", "✨ 🌙", "✨ 🌙 likes tea."),
])
async def test_emoji_only_display_names_get_personal_facts(engine, fake_ollama, script, name, about, text):
    script.add("extract", facts_reply(fact(text, about=about)))
    (f,) = await extract_facts(engine, exchange("I like tea.", name=name))
    assert (f.owner_id, f.scope) == (ALICE, "personal")
    assert len(script.seen["extract"]) == 1           # valid at once, no retry


# -- no feedback loop ---------------------------------------------------------------

async def test_facts_echoing_recalled_memories_or_the_reply_are_dropped(engine, fake_ollama, script):
    script.add("extract", facts_reply(
        fact("Alice has a cat named Tom."),           # a recalled memory coming back
        fact("Alice is a night owl."),                # only in Muninn's reply
        fact("Alice lives in Bergen."),               # echoed by the reply, but Alice said it
        fact("Alice is a friendly assistant with a long-term memory.")))  # the persona
    ex = exchange("I moved, I live in Bergen now.", recalled=("Alice has a cat named Tom.",),
                  reply="So you live in Bergen now! Alice is a night owl, I remember.")
    facts = await extract_facts(engine, ex)
    assert [f.text for f in facts] == ["Alice lives in Bergen."]


# -- storing ------------------------------------------------------------------------

async def test_facts_of_an_exchange_are_stored_linked_and_sourced(engine, fake_ollama, script):
    script.add("extract", facts_reply(fact("Alice lives in Oslo."), fact("Alice works as a nurse."),
                                      fact("Alice has two cats.", importance=0.3)))
    ex = exchange("I live in Oslo, work as a nurse and have two cats.", message_id=555)
    ids = await store_facts(engine, await extract_facts(engine, ex), ex)
    assert len(ids) == 3
    memories = {m.id: m for m in await memories_of(engine)}
    assert all(memories[i].source_message_ids == ["555"] and memories[i].embedded for i in ids)
    assert all(memories[i].vis_key == f"p:{ALICE}:{GUILD}" for i in ids)
    co = {(a, b) for a, b, kind in await links_of(engine) if kind == "co_extracted"}
    assert co == {(ids[0], ids[1]), (ids[0], ids[2]), (ids[1], ids[2])}
    recall = await engine.recall("where does Alice live", Viewer(ALICE, CHANNEL, GUILD))
    assert ids[0] in recall.ids
    assert (await engine.recall("Oslo", Viewer(BOB, CHANNEL, GUILD))).ids == []


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)  # apsw hooks observe the transactions
async def test_one_exchange_is_one_transaction(engine, fake_ollama):
    def install_tripwire(conn):
        conn.execute("CREATE TRIGGER tripwire BEFORE INSERT ON memories WHEN new.text LIKE '%explodes%' "
                     "BEGIN SELECT RAISE(ABORT, 'tripwire'); END")
    await engine.write(install_tripwire)
    ex = exchange("...")
    facts = [Fact("Alice lives in Oslo.", "Alice", "personal", 0.5, ALICE, CHANNEL, GUILD, (1,)),
             Fact("Alice explodes on Mondays.", "Alice", "personal", 0.5, ALICE, CHANNEL, GUILD, (1,))]
    with pytest.raises(apsw.ConstraintError):
        await store_facts(engine, facts, ex)
    assert await memories_of(engine, active_only=False) == []
    assert await links_of(engine) == set()


async def test_store_without_ollama_keeps_facts_for_the_backfill(fts_engine):
    f = Fact("Alice lives in Oslo.", "Alice", "personal", 0.5, ALICE, CHANNEL, GUILD, (1,))
    (first,) = await store_facts(fts_engine, [f], exchange("..."))
    repeated = Fact("alice lives in OSLO", "Alice", "personal", 0.7, ALICE, CHANNEL, GUILD, (2,))
    (again,) = await store_facts(fts_engine, [repeated], exchange("...", message_id=2))
    assert first == again
    (memory,) = await memories_of(fts_engine)
    assert not memory.embedded and memory.source_message_ids == ["1", "2"] and memory.importance == 0.7


# -- the background extractor ------------------------------------------------------

async def test_submit_never_blocks_and_batches_a_channel(engine, fake_ollama, script):
    script.always["extract"] = per_author(Alice=facts_reply(fact("Alice lives in Oslo.")),
                                          Bob=facts_reply(fact("Bob has two cats.", about="Bob")),
                                          Carol=facts_reply(fact("Carol plays chess.", about="Carol")))
    extractor = Extractor(engine, batch_delay=0.05)
    extractor.submit(exchange("I live in Oslo.", message_id=1))
    extractor.submit(exchange("I have two cats.", author=BOB, name="Bob", message_id=2))
    extractor.submit(exchange("I play chess.", author=303, name="Carol", channel=80, message_id=3))
    assert fake_ollama.chat_requests() == []  # submit returned before any LLM call was made
    await extractor.drain()
    await extractor.close()
    assert sorted(map(author_of, script.seen["extract"])) == ["Alice", "Bob", "Carol"]  # one call per author
    prompts = [r["messages"][1]["content"] for r in script.seen["extract"]]
    assert any("I live in Oslo." in p and "I have two cats." in p for p in prompts)   # one batch: context
    owners = {(m.text, m.owner_id, tuple(m.source_message_ids)) for m in await memories_of(engine)}
    assert owners == {("Alice lives in Oslo.", ALICE, ("1",)), ("Bob has two cats.", BOB, ("2",)),
                      ("Carol plays chess.", 303, ("3",))}
    assert not any(kind == "co_extracted" for *_, kind in await links_of(engine))  # two people: no link


async def test_extractor_failures_never_propagate(engine, fake_ollama, script):
    fake_ollama.chat_replies.extend([FakeOllama.HTTP_500])
    script.add("extract", facts_reply(fact("Alice lives in Oslo.")))
    extractor = Extractor(engine, batch_delay=0.01)
    extractor.submit(exchange("I live in Oslo."))
    await extractor.drain()
    extractor.submit(exchange("I live in Oslo.", message_id=2))
    await extractor.drain()
    await extractor.close()
    assert extractor.failed == 0 and extractor.processed == 2
    assert [m.text for m in await memories_of(engine)] == ["Alice lives in Oslo."]
    extractor.submit(exchange("ignored after close"))   # no error, no work
    assert extractor.processed == 2


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)  # apsw hooks observe the transactions
async def test_extractor_survives_a_failing_store(engine, fake_ollama, script, caplog):
    await engine.write(lambda c: c.execute(
        "CREATE TRIGGER tripwire BEFORE INSERT ON memories BEGIN SELECT RAISE(ABORT, 'disk on fire'); END"))
    script.add("extract", facts_reply(fact("Alice lives in Oslo.")))
    extractor = Extractor(engine, batch_delay=0.01)
    with caplog.at_level(logging.ERROR, logger="bot"):
        extractor.submit(exchange("I live in Oslo."))
        await extractor.close()
    assert extractor.failed == 1
    assert "fact extraction failed" in caplog.text


def test_submit_without_a_running_loop_does_not_raise(make_settings):
    engine = Engine(make_settings("http://127.0.0.1:9"))
    Extractor(engine).submit(exchange("I live in Oslo."))
    engine._executor.shutdown()


async def test_extraction_can_be_switched_off(fake_ollama, make_settings, script):
    async with Engine(make_settings(fake_ollama.url, MUNINN_EXTRACTION="false")) as engine:
        extractor = Extractor(engine, batch_delay=0.01)
        extractor.submit(exchange("I live in Oslo."))
        await extractor.close()
    assert script.seen["extract"] == []


async def test_a_busy_channel_is_cut_into_batches(engine, fake_ollama, script):
    extractor = Extractor(engine, batch_delay=10)
    for i in range(9):                       # MAX_BATCH = 8 flushes without waiting
        extractor.submit(exchange(f"message {i}", message_id=i))
    await until(lambda: extractor.processed == 1, "the first batch extracted")
    assert len(script.seen["extract"]) == 1 and len(extractor._pending[CHANNEL]) == 1  # the 9th waits its 10 s
    await extractor.close()
    assert len(script.seen["extract"]) == 2


async def test_drain_waits_for_the_worker_which_then_ends(engine, fake_ollama, script):
    fake_ollama.mode = "slow"
    fake_ollama.delay = 0.1
    extractor = Extractor(engine, batch_delay=10)
    extractor.submit(exchange("I live in Oslo."))
    await extractor.drain()
    assert extractor.processed == 1 and extractor._worker.done()   # no idle task left behind
    await extractor.close()


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)  # apsw hooks observe the transactions
async def test_each_authors_facts_are_one_transaction(engine, fake_ollama, script):
    script.always["extract"] = per_author(
        Alice=facts_reply(fact("Alice lives in Oslo."), fact("This channel plays chess on Fridays.", about="room",
                                                             scope="room")),
        Bob=facts_reply(fact("Bob has two cats.", about="Bob"), fact("Bob works as a baker.", about="Bob")))
    commits: list[int] = []
    await engine.write(lambda conn: conn.set_commit_hook(lambda: commits.append(1) or False))
    extractor = Extractor(engine, batch_delay=10)
    extractor.submit(exchange("I live in Oslo. We play chess here on Fridays.", message_id=1, moderator=True))
    extractor.submit(exchange("I have two cats and work as a baker.", author=BOB, name="Bob", message_id=2))
    await extractor.close()
    await engine.write(lambda conn: conn.set_commit_hook(None))
    assert len(commits) == 2
    assert [(m.owner_id, m.scope) for m in await memories_of(engine)] == [
        (ALICE, "personal"), (ALICE, "room"), (BOB, "personal"), (BOB, "personal")]


@pytest.mark.parametrize("slow_step", ["extraction", "update-decision"])
async def test_forget_during_extraction_stores_nothing_of_that_person(engine, fake_ollama, script, slow_step):
    answer = facts_reply(fact("Alice lives in Oslo."), fact("This channel plays chess on Fridays.", about="room",
                                                            scope="room"))
    if slow_step == "update-decision":   # an older memory makes the new fact wait for the LLM's verdict
        fake_ollama.vectors["Alice lives in Bergen."] = [1.0] + [0.0] * 767
        fake_ollama.vectors["Alice lives in Oslo."] = [0.8, 0.6] + [0.0] * 766
        await store_facts(engine, [Fact("Alice lives in Bergen.", "Alice", "personal", 0.5, ALICE, CHANNEL, GUILD)])
        fake_ollama.chat_replies.extend([answer, FakeOllama.TIMEOUT])   # TIMEOUT: wait, then answer {}
    else:
        fake_ollama.chat_replies.append(FakeOllama.TIMEOUT)              # wait, then the script's answer
        script.add("extract", answer)
    fake_ollama.delay = 1.0  # the forget below must come while the slow call is in flight: 1 s of stall spare
    before = len(await memories_of(engine))
    extractor = Extractor(engine, batch_delay=0.01)
    extractor.submit(exchange("I live in Oslo. We play chess here on Fridays."))
    slow_call = 1 if slow_step == "extraction" else 2
    while len(fake_ollama.chat_requests()) < slow_call:     # the slow call is in flight
        await asyncio.sleep(0.01)
    extractor.forget(ALICE)
    await extractor.close()
    assert extractor.processed == 1 and extractor.failed == 0
    assert len(fake_ollama.chat_requests()) == slow_call
    assert len(await memories_of(engine, active_only=False)) == before


async def test_forget_drops_waiting_messages_but_not_later_ones(engine, fake_ollama, script):
    script.always["extract"] = per_author(Alice=facts_reply(fact("Alice lives in Oslo.")),
                                          Bob=facts_reply(fact("Bob has two cats.", about="Bob")))
    extractor = Extractor(engine, batch_delay=10)
    extractor.submit(exchange("my secret: I live in Oslo.", message_id=1))
    extractor.submit(exchange("I have two cats.", author=BOB, name="Bob", message_id=2))
    extractor.submit(exchange("only me here", channel=80, message_id=3))
    extractor.forget(ALICE)
    await extractor.drain()
    prompts = json.dumps([r["messages"] for r in script.seen["extract"]])
    assert [author_of(r) for r in script.seen["extract"]] == ["Bob"] and "secret" not in prompts
    assert [m.owner_id for m in await memories_of(engine)] == [BOB]
    extractor.submit(exchange("I live in Oslo.", message_id=4))    # said after the forget: a new start
    await extractor.close()
    assert sorted(m.owner_id for m in await memories_of(engine)) == [ALICE, BOB]


async def test_logs_above_debug_never_carry_what_people_said(engine, fake_ollama, script, caplog):
    script.add("extract", facts_reply(fact("I have HIV and live in Oslo."), fact("Alice lives in Oslo.",
                                                                                 about="Carol")),
               facts_reply(fact("My HIV diagnosis came in May."), fact("Alice has HIV.", scope="secret")),
               facts_reply(fact("Bob has HIV.", about="Bob")))
    with caplog.at_level(logging.DEBUG):
        await extract_facts(engine, exchange("I have HIV and I live in Oslo, Bob too"))
        await extract_facts(engine, exchange("I have HIV and I live in Oslo, Bob too"))
    loud = " ".join(r.getMessage() for r in caplog.records if r.levelno >= logging.INFO)
    quiet = " ".join(r.getMessage() for r in caplog.records if r.levelno < logging.INFO)
    assert "invalid twice" in loud and "fact 1" in loud
    for word in ("HIV", "Oslo", "diagnosis", "Carol", "Bob"):
        assert word not in loud
    assert "HIV" in quiet           # the details are there for whoever turns DEBUG on
