"""The relevance floor in the reply pipeline: a message about something never discussed gets no memories."""
from __future__ import annotations

import time

import pytest

from bot.conversation.pipeline import Incoming, Pipeline
from bot.memory.engine import Engine
from bot.memory.records import NewMemory
from tests.conversation.test_pipeline import RecordingOutlet, RecordingSink

pytestmark = pytest.mark.usefixtures("backend")

ALICE, GUILD, GENERAL = 7, 900, 50
CAT = "Alice's cat is called Miso"


def said(text: str, message_id: int) -> Incoming:
    return Incoming(channel_id=GENERAL, guild_id=GUILD, author_id=ALICE, author_name="Alice", content=text,
                    created_at=time.time(), message_id=message_id, dm=False)


def axis(i: int, dim: int = 768) -> list[float]:
    return [1.0 if j == i else 0.0 for j in range(dim)]


async def test_only_a_message_near_a_memory_gets_it_in_the_prompt(fake_ollama, make_settings):
    fake_ollama.vectors[CAT] = axis(0)
    fake_ollama.vectors["what is my cat called?"] = axis(0)
    fake_ollama.vectors["which cat food is cheapest in Lima?"] = axis(1)  # shares a word, nothing of its sense
    async with Engine(make_settings(fake_ollama.url, MUNINN_INJECT_MIN_COSINE="0.5")) as engine:
        await engine.remember(NewMemory(CAT, "personal", owner_id=ALICE, guild_id=GUILD, channel_id=GENERAL))
        sink = RecordingSink([])
        pipeline = Pipeline(engine, sink, assistant_id=1, assistant_name="Muninn")
        fake_ollama.chat_replies += ["No idea.", "Miso."]
        await pipeline.respond(said("which cat food is cheapest in Lima?", 101), RecordingOutlet([]))
        await pipeline.respond(said("what is my cat called?", 102), RecordingOutlet([]))
    far, near = (body["messages"][0]["content"] for body in fake_ollama.chat_requests() if not body.get("format"))
    assert CAT not in far and sink.exchanges[0].recalled == ()
    assert CAT in near and sink.exchanges[1].recalled == (CAT,)
