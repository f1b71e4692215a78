"""The conversation pipeline with the real engine, a real database and each setup of fake LLM servers
(tests/fakes/servers.py): Ollama, an OpenAI-compatible server, chat on the OpenAI one with
embeddings on Ollama."""
from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import logging
import re
import time
from contextlib import asynccontextmanager
from datetime import datetime

import pytest

from bot.conversation.outlets import Sent
from bot.conversation.pipeline import Incoming, Pipeline
from bot.conversation.thinking import CANNOT_THINK, no_model
from bot.lifecycle.extractor import Extractor
from bot.memory.engine import Engine
from bot.memory.records import NewMemory
from bot.memory.sql import history, store
from tests.fakes.ollama import FakeOllama
from tests.helpers import QuietSink, schema_of

pytestmark = pytest.mark.usefixtures("backend")  # the whole pipeline on both storage backends

ALICE, BOB = 7, 8
GUILD, GENERAL, RANDOM, ALICE_DM = 900, 50, 51, 60
_ids = itertools.count(10**17)


@pytest.fixture
def fake_ollama(llm):
    """The chat server of the setup under test, which the tests script (`llm.embed` embeds)."""
    return llm.chat


@pytest.fixture
def make_settings(make_settings, llm):
    """Settings pointing at the setup's servers when given the chat server's URL."""
    return llm.settings_maker(make_settings)


def said(text: str, *, channel: int = GENERAL, author: int = ALICE, name: str = "Alice", dm: bool = False,
         at: float | None = None) -> Incoming:
    return Incoming(channel_id=channel, guild_id=None if dm else GUILD, author_id=author, author_name=name,
                    content=text, created_at=time.time() if at is None else at, message_id=next(_ids), dm=dm)


class RecordingOutlet:
    """Collects what the pipeline posts, and when it showed typing, in one shared event log."""

    def __init__(self, events: list, label: str = ""):
        self.events = events
        self.label = label

    @asynccontextmanager
    async def typing(self):
        self.events.append(("typing", self.label))
        yield

    async def send(self, text: str) -> list[Sent]:
        self.events.append(("send", self.label, text))
        return [Sent(next(_ids), time.time())]


class RecordingSink(QuietSink):
    def __init__(self, events: list):
        self.events = events
        self.exchanges = []

    def submit(self, exchange) -> None:
        self.events.append(("submit", exchange.user_message))
        self.exchanges.append(exchange)


def chat_texts(fake: FakeOllama) -> list[str]:
    """The user-visible parts of every chat request, one string per request."""
    return ["\n".join(m["content"] for m in body["messages"]) for body in fake.chat_requests()
            if not schema_of(body)]


async def test_answer_uses_memories_history_and_current_message_then_hands_over(engine, fake_ollama):
    await engine.remember(NewMemory("Alice's cat is called Miso", "personal", owner_id=ALICE, guild_id=GUILD,
                                    channel_id=GENERAL))
    events: list = []
    sink = RecordingSink(events)
    pipeline = Pipeline(engine, sink, assistant_id=1, assistant_name="Muninn")
    await pipeline.record(said("the weather is nice", author=BOB, name="Bob"))
    fake_ollama.chat_replies.append("Miso is a lovely name.")

    reply = await pipeline.respond(said("what is my cat called?"), RecordingOutlet(events))

    assert reply.ok and reply.text == "Miso is a lovely name."
    request = fake_ollama.chat_requests()[-1]
    messages = request["messages"]
    assert messages[0]["role"] == "system"
    assert re.search(r'^- \(\d+ \w+ \d{4}\) Alice, who is writing to you now, told you: "Alice\'s cat is called Miso"$',
                     messages[0]["content"], re.M)
    assert messages[1]["role"] == "user" and messages[1]["content"].endswith("Bob: the weather is nice")
    assert messages[-1]["content"].endswith("Alice: what is my cat called?")
    assert request["stream"] is False
    # typing while thinking, the reply, and only then the exchange for extraction
    assert [e[0] for e in events] == ["typing", "send", "submit"]
    exchange = sink.exchanges[0]
    assert (exchange.author_id, exchange.channel_id, exchange.guild_id, exchange.dm) == (ALICE, GENERAL, GUILD, False)
    assert exchange.reply == "Miso is a lovely name." and exchange.recalled == ("Alice's cat is called Miso",)
    assert exchange.participants == ("Bob", "Alice")  # for extraction: who else was talking
    assert exchange.speakers == (("Bob", BOB),) and exchange.mentions == ()  # and who they are
    rows = await engine.write(history.recent, GENERAL, 10)
    assert [(r.role, r.author_name, r.content) for r in rows] == [
        ("user", "Bob", "the weather is nice"), ("user", "Alice", "what is my cat called?"),
        ("assistant", "Muninn", "Miso is a lovely name.")]
    assert rows[-1].author_id == 1 and rows[-1].id == exchange.reply_message_id


async def test_the_people_a_message_mentions_reach_extraction_by_id(engine, fake_ollama):
    sink = RecordingSink([])
    pipeline = Pipeline(engine, sink, assistant_id=1, assistant_name="Muninn")
    fake_ollama.chat_replies.append("Noted.")
    incoming = dataclasses.replace(said("I lent @Dave 50 euros"), mentions=(("Dave", 404), ("Lone \ud83d", 405)))
    await pipeline.respond(incoming, RecordingOutlet([]))
    [exchange] = sink.exchanges
    assert exchange.user_message == "I lent @Dave 50 euros"
    assert exchange.mentions == (("Dave", 404), ("Lone ?", 405))  # names made storable like the text


async def test_only_the_last_history_limit_messages_go_into_the_prompt(make_settings, fake_ollama):
    async with Engine(make_settings(fake_ollama.url, MUNINN_HISTORY_LIMIT=3)) as engine:
        pipeline = Pipeline(engine)
        for n in range(6):
            await pipeline.record(said(f"chatter {n}", at=1000.0 + n))
        await pipeline.respond(said("now", at=2000.0), RecordingOutlet([]))
    contents = [m["content"] for m in fake_ollama.chat_requests()[-1]["messages"][1:]]
    assert [c.split(": ", 1)[1] for c in contents] == ["chatter 3", "chatter 4", "chatter 5", "now"]


async def test_the_token_budget_setting_cuts_the_oldest_history(make_settings, fake_ollama):
    async with Engine(make_settings(fake_ollama.url, MUNINN_TOKEN_BUDGET=300)) as engine:
        pipeline = Pipeline(engine)
        for n in range(10):
            await pipeline.record(said(f"chatter {n} " + "words " * 40, at=1000.0 + n))
        await pipeline.respond(said("now " + "long " * 200, at=2000.0), RecordingOutlet([]))
    contents = [m["content"] for m in fake_ollama.chat_requests()[-1]["messages"][1:]]
    assert contents[-1].rstrip().endswith("now " + "long " * 199 + "long")  # the current message is never cut
    kept = [c.split(": ", 1)[1].split(" ")[1] for c in contents[:-1]]
    assert kept == sorted(kept) and len(kept) < 10 and (not kept or kept[-1] == "9")  # newest kept, oldest cut


@pytest.mark.parametrize("failure", ["down", "error", "slow", "missing", "empty"])
async def test_ollama_trouble_gives_a_short_friendly_reply_and_keeps_the_message(
        make_settings, fake_ollama, caplog, failure, llm):
    settings = make_settings(fake_ollama.url, OLLAMA_CHAT_TIMEOUT="0.3")
    events: list = []
    async with Engine(settings) as engine:
        pipeline = Pipeline(engine, RecordingSink(events))
        if failure == "down":
            await fake_ollama.go_down()
        elif failure == "error":
            fake_ollama.mode = "error"
        elif failure == "slow":
            fake_ollama.chat_replies.append(FakeOllama.TIMEOUT)
            fake_ollama.delay = 2.0
        elif failure == "missing":
            fake_ollama.missing.add("llama3.2")
        else:
            fake_ollama.chat_replies.append("   ")
        with caplog.at_level(logging.WARNING, logger="bot.conversation.pipeline"):
            reply = await pipeline.respond(said("are you there?"), RecordingOutlet(events))
        rows = await engine.write(history.recent, GENERAL, 10)
    expected = no_model("llama3.2") if failure == "missing" else CANNOT_THINK  # waiting would not help
    assert reply.text == expected and not reply.ok and len(expected) < 120
    assert events[-1] == ("send", "", expected)
    assert [r.content for r in rows] == ["are you there?"]  # recorded; the apology is not history
    assert not any(e[0] == "submit" for e in events)
    if failure == "missing":
        assert MISSING_CHAT_MODEL[llm.setup] in caplog.text


MISSING_CHAT_MODEL = {"ollama": "ollama pull llama3.2", "openai": "no model 'llama3.2': load it there",
                      "openai-chat+ollama-embed": "no model 'llama3.2': load it there"}


async def test_repeated_failures_are_logged_once_not_per_message(make_settings, fake_ollama, caplog, llm):
    async with Engine(make_settings(fake_ollama.url)) as engine:
        pipeline = Pipeline(engine)
        fake_ollama.missing.add("llama3.2")
        with caplog.at_level(logging.WARNING, logger="bot.conversation.pipeline"):
            for n in range(3):
                await pipeline.respond(said(f"hello {n}"), RecordingOutlet([]))
    assert caplog.text.count(MISSING_CHAT_MODEL[llm.setup]) == 1


async def test_messages_of_one_channel_are_answered_in_order_with_earlier_replies_in_context(engine, fake_ollama):
    fake_ollama.delay = 0.3
    fake_ollama.chat_replies += [FakeOllama.TIMEOUT, "second answer"]  # the first reply is slow
    fake_ollama.default_chat_reply = "first answer"
    events: list = []
    pipeline = Pipeline(engine)
    first = said("first question", at=1000.0)
    second = said("second question", at=1001.0)
    await asyncio.gather(pipeline.respond(first, RecordingOutlet(events, "1")),
                         pipeline.respond(second, RecordingOutlet(events, "2")))
    assert [e for e in events if e[0] == "send"] == [("send", "1", "first answer"), ("send", "2", "second answer")]
    second_prompt = fake_ollama.chat_requests()[1]["messages"]
    assert [m["role"] for m in second_prompt] == ["system", "user", "assistant", "user"]
    assert second_prompt[2]["content"] == "first answer"
    assert second_prompt[3]["content"].endswith("second question")
    first_prompt = fake_ollama.chat_requests()[0]["messages"]
    assert "second question" not in json.dumps(first_prompt)


async def test_an_earlier_message_waiting_for_the_turn_does_not_stall_the_answer_holding_it(engine, fake_ollama):
    """Two mentions: the earlier one (by id) reached the turn queue later (its checks were
    slower). The answer holding the turn must not wait for it (arrivals.py's WAIT_S)."""
    pipeline = Pipeline(engine)
    earlier, later = said("first question"), said("second question")
    pipeline.arrivals.arrived(GENERAL, earlier.message_id)
    pipeline.arrivals.arrived(GENERAL, later.message_id)
    fake_ollama.delay = 0.3
    started = time.monotonic()
    holder = asyncio.create_task(pipeline.respond(later, RecordingOutlet([])))
    await asyncio.sleep(0.05)                                   # `later` holds the turn now
    await asyncio.gather(holder, pipeline.respond(earlier, RecordingOutlet([])))
    assert time.monotonic() - started < 1.5  # two 0.3 s replies, not a 2 s wait for the queued one


async def test_a_flood_in_one_channel_does_not_starve_another(make_settings, fake_ollama):
    fake_ollama.mode, fake_ollama.delay = "slow", 0.1
    fake_ollama.default_chat_reply = lambda req: "re: " + req["messages"][-1]["content"].rsplit(": ", 1)[-1]
    # one person's share of answers is off (tests/conversation/test_rate.py): the channels' turns are under test
    async with Engine(make_settings(fake_ollama.url, OLLAMA_MAX_CONCURRENCY=1, OLLAMA_EMBED_TIMEOUT=2,
                                    MUNINN_RATE_PER_MINUTE=0)) as engine:
        pipeline = Pipeline(engine)
        events: list = []
        flood = [asyncio.create_task(pipeline.respond(said(f"spam {n}", channel=RANDOM), RecordingOutlet(events)))
                 for n in range(6)]
        await asyncio.sleep(0.05)  # the flood is queued first
        quiet = asyncio.create_task(pipeline.respond(said("hello?", channel=GENERAL), RecordingOutlet(events)))
        await asyncio.gather(*flood, quiet)
    sends = [e[2] for e in events if e[0] == "send"]
    assert sends.index("re: hello?") <= 2, sends  # served within the first turns, not after the flood
    assert [s for s in sends if s.startswith("re: spam")] == [f"re: spam {n}" for n in range(6)]


async def test_a_full_channel_queue_records_but_does_not_answer(make_settings, fake_ollama):
    fake_ollama.mode, fake_ollama.delay = "slow", 0.2
    async with Engine(make_settings(fake_ollama.url, MUNINN_REPLY_QUEUE_LIMIT=2)) as engine:
        pipeline = Pipeline(engine)
        replies = await asyncio.gather(*(pipeline.respond(said(f"m{n}", at=1000.0 + n), RecordingOutlet([]))
                                         for n in range(4)))
        rows = await engine.write(history.recent, GENERAL, 20)
    assert [r is not None for r in replies] == [True, True, False, False]
    assert sorted(r.content for r in rows if r.role == "user") == ["m0", "m1", "m2", "m3"]


async def test_edits_and_deletions_update_the_history(engine):
    pipeline = Pipeline(engine)
    kept, gone = said("I live in Bergen", at=1.0), said("my password is hunter2", at=2.0)
    await pipeline.record(kept)
    await pipeline.record(gone)
    await pipeline.record(kept)  # Discord may deliver twice: ignored
    assert await pipeline.edited(kept.message_id, "I live in Oslo", 3.0)
    assert await pipeline.deleted([gone.message_id]) == 1
    assert not await pipeline.edited(gone.message_id, "resurrected")  # a late edit cannot bring it back
    rows = await engine.write(history.recent, GENERAL, 10)
    assert [(r.content, r.edited_at) for r in rows] == [("I live in Oslo", 3.0)]
    assert (await engine.write(history.get, gone.message_id)).content == ""


async def test_history_for_a_message_leaves_out_later_chatter_but_keeps_earlier_replies(engine):
    pipeline = Pipeline(engine, assistant_id=1)
    current = said("question", at=100.0)
    await pipeline.record(said("before", at=99.0))
    await pipeline.record(said("after", at=101.0))
    await engine.write(history.record, channel_id=GENERAL, guild_id=GUILD, author_id=1, author_name="Muninn",
                     role="assistant", content="late reply to 'before'", created_at=102.0, message_id=next(_ids))
    await pipeline.record(current)
    current_row = await engine.write(history.get, current.message_id)
    rows = await engine.write(history.recent, GENERAL, 10, before=current_row)
    assert [r.content for r in rows] == ["before", "late reply to 'before'"]


async def test_local_ids_for_replies_without_a_discord_id(engine):
    pipeline = Pipeline(engine)

    class Terminal(RecordingOutlet):
        async def send(self, text):
            return [Sent(None, time.time())]

    for text in ("hi", "again"):
        local = Incoming(channel_id=0, guild_id=0, author_id=1, author_name="me", content=text,
                         created_at=time.time())
        await pipeline.respond(local, Terminal([]))
    rows = await engine.write(history.recent, 0, 10)
    assert [(r.id, r.role) for r in rows] == [(1, "user"), (2, "assistant"), (3, "user"), (4, "assistant")]


def facts_reply(*facts: tuple[str, str]):
    """A fake-Ollama reply function: extraction requests (JSON format) get these facts."""
    def reply(request: dict) -> str:
        if schema_of(request):
            said_text = request["messages"][-1]["content"]
            return json.dumps({"facts": [{"text": text, "about": "Alice", "scope": "personal", "importance": 0.8}
                                         for trigger, text in facts if trigger in said_text]})
        return "Noted."
    return reply


async def test_a_fact_told_in_a_dm_is_recalled_in_dms_only_and_forget_person_erases_it(engine, fake_ollama, backend):
    fake_ollama.default_chat_reply = facts_reply(("called Ylva", "Alice's sister is called Ylva"))
    extractor = Extractor(engine, batch_delay=0.01)
    pipeline = Pipeline(engine, extractor)
    try:
        await pipeline.respond(said("My sister is called Ylva", channel=ALICE_DM, dm=True), RecordingOutlet([]))
        await extractor.drain()
        [memory] = await engine.write(store.memories_of, ALICE, ("personal",))
        assert memory.text == "Alice's sister is called Ylva" and memory.guild_id is None and memory.embedded

        await pipeline.respond(said("what is my sister's name?", channel=ALICE_DM, dm=True), RecordingOutlet([]))
        assert "Alice's sister is called Ylva" in fake_ollama.chat_requests()[-1]["messages"][0]["content"]
        await pipeline.respond(said("what is my sister's name?", channel=GENERAL), RecordingOutlet([]))
        assert "Ylva" not in json.dumps(fake_ollama.chat_requests()[-1]["messages"])
        await extractor.drain()

        forgotten = await pipeline.forget_person(ALICE)
        assert (forgotten.personal, forgotten.taught) == (1, 0) and forgotten.messages >= 4
        keyword, vector_table = (
            ("SELECT count(*) FROM memories WHERE text_search @@ plainto_tsquery('muninn', 'Ylva')", "memory_vectors")
            if backend else ("SELECT count(*) FROM memories_fts WHERE memories_fts MATCH 'Ylva'", "vec_memories"))
        counts = await engine.write(lambda conn: [conn.execute(sql).fetchall()[0][0] for sql in (
            "SELECT count(*) FROM memories", keyword, f"SELECT count(*) FROM {vector_table}", "SELECT count(*) FROM memory_links",
            "SELECT count(*) FROM messages WHERE content LIKE '%Ylva%' OR author_id = 7")])
        assert counts == [0, 0, 0, 0, 0]
    finally:
        await extractor.close()


async def test_a_reply_that_could_not_be_posted_is_not_recorded_as_said(engine):
    events: list = []
    sink = RecordingSink(events)

    class Forbidden(RecordingOutlet):
        async def send(self, text):
            return []  # what DiscordOutlet returns without the Send Messages permission

    reply = await Pipeline(engine, sink).respond(said("hello"), Forbidden(events))
    assert reply.ok and reply.sent == []
    rows = await engine.write(history.recent, GENERAL, 10)
    assert [r.role for r in rows] == ["user"]
    assert sink.exchanges[0].reply_message_id is None  # the facts in what she said still count


# -- forgetting a person -------------------------------------------------------------

SECRET = "Alice takes sertraline for her depression"


async def test_forget_person_removes_taught_room_memories_and_leaves_no_recoverable_text(make_settings, fake_ollama,
                                                                                         tmp_path, backend):
    settings = make_settings(fake_ollama.url)
    async with Engine(settings) as engine:
        pipeline = Pipeline(engine)
        await engine.remember(NewMemory(SECRET, "personal", owner_id=ALICE, guild_id=GUILD, channel_id=GENERAL))
        await engine.remember(NewMemory("the room heard about sertraline side effects", "room", owner_id=ALICE,
                                        guild_id=GUILD, channel_id=GENERAL))  # taught by Alice
        kept = [await engine.remember(NewMemory("Bob brings cake on Fridays", "room", owner_id=BOB, guild_id=GUILD,
                                                channel_id=GENERAL)),
                await engine.remember(NewMemory("Bob likes tea", "personal", owner_id=BOB, guild_id=GUILD,
                                                channel_id=GENERAL))]
        for n in range(30):  # enough FTS traffic for several index segments
            await engine.remember(NewMemory(f"filler fact {n} about boats", "global", owner_id=BOB))
        await pipeline.record(said("I take sertraline, please keep it quiet"))

        forgotten = await pipeline.forget_person(ALICE)

        assert (forgotten.personal, forgotten.taught, forgotten.messages) == (1, 1, 1)
        assert set((await engine.write(store.get_many, kept)).keys()) == set(kept)

        def probe(conn):
            if backend:  # PostgreSQL: no row holds it (its files belong to the server; VACUUM ran)
                return conn.execute("SELECT (SELECT count(*) FROM memories WHERE text LIKE '%sertralin%') + "
                                    "(SELECT count(*) FROM messages WHERE content LIKE '%sertralin%')").fetchall()[0][0]
            conn.execute("INSERT INTO memories_fts(memories_fts) VALUES('integrity-check')")  # raises if broken
            return conn.execute("SELECT count(*) FROM memories_fts_data "
                                "WHERE instr(block, CAST('sertralin' AS BLOB)) > 0").fetchall()[0][0]
        assert await engine.write(probe) == 0
    if backend:
        return
    raw = b"".join(p.read_bytes() for p in (settings.db_path, settings.db_path.with_name(
        settings.db_path.name + "-wal")) if p.exists())
    assert raw and b"sertralin" not in raw


class ForgettingSink(RecordingSink):
    """An extractor that can drop a person's queued work, as bot.lifecycle.extractor.Extractor does."""

    def __init__(self, events: list):
        super().__init__(events)
        self.forgotten: list[int] = []

    def forget(self, user_id: int) -> None:
        self.forgotten.append(user_id)
        self.exchanges = [e for e in self.exchanges if e.author_id != user_id]


async def test_forget_all_during_a_slow_reply_keeps_nothing_of_that_exchange(engine, fake_ollama):
    fake_ollama.delay = 0.4
    fake_ollama.chat_replies.append(FakeOllama.TIMEOUT)  # this reply takes 0.4 s
    fake_ollama.default_chat_reply = "Noted: you take sertraline."
    events: list = []
    sink = ForgettingSink(events)
    pipeline = Pipeline(engine, sink, assistant_id=1)
    await pipeline.record(said("earlier chatter", author=BOB, name="Bob"))

    answering = asyncio.create_task(pipeline.respond(said("I take sertraline"), RecordingOutlet(events)))
    await asyncio.sleep(0.15)  # her message is recorded and Ollama is thinking
    assert [e[0] for e in events] == ["typing"]
    await pipeline.forget_person(ALICE)
    reply = await answering

    assert reply.ok and events[-1] == ("send", "", "Noted: you take sertraline.")  # she still gets her answer
    assert sink.forgotten == [ALICE] and sink.exchanges == [] and not any(e[0] == "submit" for e in events)
    rows = await engine.write(history.recent, GENERAL, 10)
    assert [r.content for r in rows] == ["earlier chatter"]  # neither her message nor the reply was kept

    await pipeline.respond(said("hello again"), RecordingOutlet(events))  # after the forget: business as usual
    assert [e.user_message for e in sink.exchanges] == ["hello again"]


async def test_a_reply_to_another_written_while_she_forgets_everything_is_not_kept(engine, fake_ollama):
    fake_ollama.delay = 0.4
    fake_ollama.chat_replies.append(FakeOllama.TIMEOUT)  # Bob's answer takes 0.4 s
    fake_ollama.default_chat_reply = "Alice said she takes sertraline."
    pipeline = Pipeline(engine, assistant_id=1)
    await pipeline.record(said("I take sertraline"))
    answering = asyncio.create_task(pipeline.respond(said("what did Alice say?", author=BOB, name="Bob"),
                                                     RecordingOutlet([])))
    await asyncio.sleep(0.15)  # Bob's message is recorded, the model is writing with hers in its conversation
    await pipeline.forget_person(ALICE)
    assert (await answering).ok  # Bob gets his answer...
    rows = await engine.write(history.recent, GENERAL, 10)
    assert [r.content for r in rows] == ["what did Alice say?"]  # ...but it may repeat her words: not kept


# -- robustness ----------------------------------------------------------------------

async def test_a_failing_recall_means_no_memories_and_the_reply_still_happens(engine, fake_ollama, caplog):
    await engine.remember(NewMemory("Alice's cat is called Miso", "personal", owner_id=ALICE, guild_id=GUILD,
                                    channel_id=GENERAL))
    await engine.write(lambda conn: conn.execute("DROP TABLE memory_links"))  # recall's graph step now fails
    events: list = []
    sink = RecordingSink(events)
    pipeline = Pipeline(engine, sink)
    with caplog.at_level(logging.ERROR, logger="bot.conversation.pipeline"):
        first = await pipeline.respond(said("what is my cat called?"), RecordingOutlet(events))
        second = await pipeline.respond(said("and my dog?"), RecordingOutlet(events))
    assert first.ok and second.ok and [e[0] for e in events].count("send") == 2
    assert first.prompt.memories == [] and "(none)" in fake_ollama.chat_requests()[0]["messages"][0]["content"]
    assert caplog.text.count("recall failed") == 1 and "memory_links" in caplog.text  # one line, not one per message
    assert len(sink.exchanges) == 2


async def test_a_lone_surrogate_is_stored_and_answered_not_dropped(engine, fake_ollama):
    events: list = []
    sink = RecordingSink(events)
    pipeline = Pipeline(engine, sink)
    reply = await pipeline.respond(said("I live in \ud800 Oslo", name="Al\udfffice"), RecordingOutlet(events))
    assert reply.ok and [e[0] for e in events] == ["typing", "send", "submit"]
    rows = await engine.write(history.recent, GENERAL, 10)
    assert [(r.author_name, r.content) for r in rows[:1]] == [("Al?ice", "I live in ? Oslo")]
    assert fake_ollama.chat_requests()[-1]["messages"][-1]["content"].endswith("Al?ice: I live in ? Oslo")
    assert sink.exchanges[0].user_message == "I live in ? Oslo"
    other = said("\udc80 hi", author=BOB, name="Bob")
    assert await pipeline.record(other) is not None
    nul = said("a NUL\x00 in the middle", author=BOB, name="Bob")
    assert await pipeline.record(nul) is not None
    assert (await engine.write(history.get, nul.message_id)).content == "a NUL in the middle"
    assert await pipeline.edited(other.message_id, "edited \ud83d")
    assert (await engine.write(history.get, other.message_id)).content == "edited ?"


# -- history size --------------------------------------------------------------------

async def test_the_history_keeps_the_last_messages_of_each_channel(make_settings):
    async with Engine(make_settings("", MUNINN_HISTORY_KEEP=100)) as engine:
        pipeline = Pipeline(engine)
        for n in range(130):
            await pipeline.record(said(f"general {n}", at=1000.0 + n))
        await pipeline.record(said("random 0", channel=RANDOM, at=1.0))

        def contents(conn, channel):
            return [row[0] for row in conn.execute(
                "SELECT content FROM messages WHERE channel_id = ? ORDER BY created_at", (channel,))]
        general = await engine.write(contents, GENERAL)
        assert 100 <= len(general) < 100 + 25 and general[-1] == "general 129"  # pruned as it goes
        assert "general 0" not in general
        assert await engine.write(contents, RANDOM) == ["random 0"]  # other channels keep theirs

        assert await engine.write(history.prune_all, 100) == len(general) - 100
        general = await engine.write(contents, GENERAL)
        assert general == [f"general {n}" for n in range(30, 130)]


async def test_forget_person_takes_muninns_replies_to_them_and_those_written_while_she_was_heard(engine, fake_ollama):
    pipeline = Pipeline(engine)
    fake_ollama.chat_replies.extend(["Morning, Bob.", "Noted: your PIN is 4711.", "Hi Bob."])
    await pipeline.respond(said("good morning", author=BOB, name="Bob"), RecordingOutlet([]))
    await pipeline.respond(said("my PIN is 4711"), RecordingOutlet([]))
    await pipeline.respond(said("hello", author=BOB, name="Bob"), RecordingOutlet([]))
    mine = [m.id for m in await engine.write(history.recent, GENERAL, 50) if m.author_id == ALICE]
    await engine.write(history.remove, mine)  # trimmed away
    forgotten = await pipeline.forget_person(ALICE)
    assert forgotten.messages == 1  # Muninn's reply that repeats what she said, though her message is gone
    assert forgotten.replies == 1   # "Hi Bob." was written with her message in its conversation
    left = await engine.write(history.recent, GENERAL, 50)
    assert [m.content for m in left] == ["good morning", "Morning, Bob.", "hello"]  # before she spoke: kept


async def test_deleting_a_message_takes_back_what_was_learned_from_it_alone(engine, fake_ollama):
    fake_ollama.default_chat_reply = facts_reply(("called Ylva", "Alice's sister is called Ylva"))
    extractor = Extractor(engine, batch_delay=0.01)
    pipeline = Pipeline(engine, extractor)
    try:
        first = said("My sister is called Ylva")
        await pipeline.respond(first, RecordingOutlet([]))
        await extractor.drain()
        second = said("As I said, my sister is called Ylva")
        await pipeline.respond(second, RecordingOutlet([]))
        await extractor.drain()
        [memory] = await engine.write(store.memories_of, ALICE, ("personal",))
        assert set(memory.source_message_ids) == {str(first.message_id), str(second.message_id)}  # reinforced

        await pipeline.deleted([first.message_id])
        [memory] = await engine.write(store.memories_of, ALICE, ("personal",))
        assert memory.source_message_ids == [str(second.message_id)]
        await pipeline.deleted([second.message_id])
        assert await engine.write(store.memories_of, ALICE, ("personal",)) == []

        slow = Extractor(engine, batch_delay=5.0)  # a deletion before extraction: never extracted
        pipeline = Pipeline(engine, slow)
        third = said("My sister is called Ylva, really")
        await pipeline.respond(third, RecordingOutlet([]))
        await pipeline.deleted([third.message_id])
        await slow.drain()
        assert await engine.write(store.memories_of, ALICE, ("personal",)) == []
        await slow.close()
    finally:
        await extractor.close()


async def test_the_model_sees_today_s_date_each_memory_s_two_clocks_and_the_newer_first(engine, fake_ollama):
    now = time.time()
    await engine.remember(NewMemory("Alice lives in Oslo, Norway", "personal", owner_id=ALICE, guild_id=GUILD,
                                          channel_id=GENERAL, created_at=now - 200 * 86400))
    await engine.remember(NewMemory("Alice lives in Bergen, Norway", "personal", owner_id=ALICE, guild_id=GUILD,
                                    channel_id=GENERAL, created_at=now - 10 * 86400))
    await engine.remember(NewMemory("Alice flies to Rome", "personal", owner_id=ALICE, guild_id=GUILD,
                                    channel_id=GENERAL, created_at=now - 86400, happens_on="2031-03-05"))
    pipeline = Pipeline(engine, QuietSink(), assistant_id=1, assistant_name="Muninn")
    fake_ollama.chat_replies.append("Bergen, and Rome soon.")
    await pipeline.respond(said("do I live in Oslo? when do I fly to Rome?", at=now), RecordingOutlet([]))
    messages = fake_ollama.chat_requests()[-1]["messages"]
    lines = [line for line in messages[0]["content"].splitlines() if line.startswith("- (")]
    bergen = next(i for i, line in enumerate(lines) if "Bergen" in line)
    oslo = next(i for i, line in enumerate(lines) if "Oslo" in line)
    assert bergen < oslo and re.match(r"- \(\d+ \w+ \d{4}, earlier\) Alice", lines[oslo])
    assert any(re.match(r'- \(\d+ \w+ \d{4}, happens 5 Mar 2031\) Alice, who is writing to you now, told you: '
                        r'"Alice flies to Rome"$', line) for line in lines)
    year = datetime.fromtimestamp(now, engine.settings.timezone).year
    assert re.match(rf"\(\w+, \w+ \d+, {year} at \d+:\d\d [AP]M\) Alice: do I live", messages[-1]["content"])


async def test_tomorrow_said_today_is_the_event_s_date_the_next_day(engine, fake_ollama):
    # the whole path: a message, extraction against its time, storage, then the next day's question
    fake_ollama.default_chat_reply = facts_reply(("fly to Rome", "Alice flies to Rome."))
    extractor = Extractor(engine, batch_delay=0.01)
    pipeline = Pipeline(engine, extractor)
    tz = engine.settings.timezone
    monday = datetime(2031, 3, 3, 12, 0, tzinfo=tz).timestamp()
    try:
        await pipeline.respond(said("Tomorrow I fly to Rome!", channel=ALICE_DM, dm=True, at=monday),
                               RecordingOutlet([]))
        await extractor.drain()
        [memory] = await engine.write(store.memories_of, ALICE, ("personal",))
        assert (memory.text, memory.happens_on) == ("Alice flies to Rome.", "2031-03-04")
        await pipeline.respond(said("what am I doing today?", channel=ALICE_DM, dm=True, at=monday + 86400),
                               RecordingOutlet([]))
        messages = fake_ollama.chat_requests()[-1]["messages"]
        assert '(3 Mar 2031, happens 4 Mar 2031) Alice, who is writing to you now, told you: "Alice flies to Rome."' \
            in messages[0]["content"]
        assert messages[-1]["content"].startswith("(Tue, Mar 4, 2031 at 12:00 PM) Alice: what am I doing today?")
    finally:
        await extractor.close()
