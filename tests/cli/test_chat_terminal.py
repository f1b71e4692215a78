"""`muninn chat` as a person uses it: local commands that never reach the model, --name,
forgetting in plain words with a typed confirmation (on a real terminal: test_chat_pty.py)."""
from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path

import pytest

from bot.cli.chat import LOCAL_CHANNEL_ID, LOCAL_GUILD_ID, LOCAL_USER_ID, run_chat
from bot.memory.engine import Engine
from bot.memory.records import NewMemory
from bot.memory.sql import store

pytestmark = pytest.mark.usefixtures("backend")  # what touches the memory: on SQLite and on PostgreSQL

ROOT = Path(__file__).resolve().parents[2]


def local(text: str) -> NewMemory:
    return NewMemory(text, "personal", owner_id=LOCAL_USER_ID, guild_id=LOCAL_GUILD_ID, channel_id=LOCAL_CHANNEL_ID)


def conversation_requests(fake) -> list[dict]:
    return [r for r in fake.chat_requests() if not r.get("format")]


async def test_local_commands_never_reach_the_model(fake_ollama, make_settings):
    settings = make_settings(fake_ollama.url, MUNINN_EXTRACTION="false")
    async with Engine(settings) as engine:
        tomatoes = await engine.remember(local("Kari grows tomatoes"))
        await engine.remember(local("Kari lives in Tromsø"))
        others = await engine.remember(NewMemory("Someone else's secret", "personal", owner_id=99, guild_id=None))
    script = "\n".join(["/help", "/memories", "/search tomatoes", f"/forget {others}", f"/forget {tomatoes}",
                        "/memories", "/frobnicate", "/pause", "/pause", "/resume", "/quit"]) + "\n"
    out = io.StringIO()
    assert await run_chat(settings, stdin=io.StringIO(script), stdout=out) == 0
    text = out.getvalue()
    assert "/memories" in text and "/forget ID" in text                      # the help
    assert "2 memories you can see here" in text and "Someone else's secret" not in text
    assert f"1. #{tomatoes} [personal] Kari grows tomatoes" in text
    assert f"No memory #{others} of yours." in text and f"Forgot #{tomatoes}: Kari grows tomatoes" in text
    assert "1 memory you can see here" in text
    assert "unknown command /frobnicate; /help lists them" in text
    assert "Paused:" in text and "Already paused" in text and "Resumed:" in text
    assert conversation_requests(fake_ollama) == []
    async with Engine(settings) as engine:
        assert await engine.write(store.get_many, [tomatoes, others]) == {others: (await engine.write(store.get, others))}


async def test_the_name_is_the_speaker_and_the_prompt_does_not_claim_discord(fake_ollama, make_settings):
    settings = make_settings(fake_ollama.url, MUNINN_EXTRACTION="false")
    await run_chat(settings, stdin=io.StringIO("hello\n"), stdout=io.StringIO(), name="Kari")
    [request] = conversation_requests(fake_ollama)
    assert request["messages"][-1]["content"].endswith(") Kari: hello")
    system = request["messages"][0]["content"]
    assert "talking with Kari in a terminal" in system and "chatting on Discord" not in system


async def test_forget_in_plain_words_asks_for_a_typed_yes(fake_ollama, make_settings):
    settings = make_settings(fake_ollama.url, MUNINN_EXTRACTION="false")
    async with Engine(settings) as engine:
        oslo = await engine.remember(local("Kari lives in Oslo"))
        bees = await engine.remember(local("Kari keeps bees"))
    out = io.StringIO()
    await run_chat(settings, stdin=io.StringIO("forget that I live in Oslo\nno\nforget that I live in Oslo\nyes\n"),
                   stdout=out, name="Kari")
    text = out.getvalue()
    assert text.count(f"#{oslo} Kari lives in Oslo") == 2 and f"#{bees}" not in text
    assert "Kept: nothing was forgotten." in text and "Forgotten: 1 memory." in text
    assert conversation_requests(fake_ollama) == []
    async with Engine(settings) as engine:
        assert set(await engine.write(store.get_many, [oslo, bees])) == {bees}



async def test_input_that_ends_at_the_forget_question_keeps_everything_and_leaves(fake_ollama, make_settings):
    settings = make_settings(fake_ollama.url, MUNINN_EXTRACTION="false")
    async with Engine(settings) as engine:
        oslo = await engine.remember(local("Kari lives in Oslo"))
    out = io.StringIO()
    # piped input that stops right after the question: the chat ends instead of waiting forever
    await asyncio.wait_for(run_chat(settings, stdin=io.StringIO("forget that I live in Oslo\n"), stdout=out,
                                    name="Kari"), 20)
    assert "Kept: nothing was forgotten." in out.getvalue()
    async with Engine(settings) as engine:
        assert set(await engine.write(store.get_many, [oslo])) == {oslo}


async def test_notices_name_the_chats_own_commands(fake_ollama, make_settings):
    settings = make_settings(fake_ollama.url, MUNINN_EXTRACTION="false")
    async with Engine(settings) as engine:
        await engine.remember(local("Kari lives in Oslo"))
    out = io.StringIO()
    await run_chat(settings, stdin=io.StringIO("/pause\nhello\n/resume\nforget everything about me\n"
                                               "/forget-all\nno\n/forget-all\nyes\n/memories\n"), stdout=out, name="Kari")
    text = out.getvalue()
    assert "`/resume` turns it back on" in text and "use `/forget-all`" in text
    assert "/memory " not in text                                    # never Discord's commands
    assert text.count("Forget everything? (yes/no)") == 2 and "Kept: nothing was forgotten." in text
    assert "Forgot everything: 1 memory and " in text and "Muninn remembers nothing you can see here yet." in text


async def test_the_extraction_prompt_knows_it_is_a_terminal_conversation(fake_ollama, make_settings):
    fake_ollama.default_chat_reply = lambda request: json.dumps({"facts": []}) if request.get("format") else "Nice."
    settings = make_settings(fake_ollama.url)
    await run_chat(settings, stdin=io.StringIO("I grow tomatoes\n"), stdout=io.StringIO(), name="Kari")
    [extraction] = [r for r in fake_ollama.chat_requests() if r.get("format")]
    said = extraction["messages"][-1]["content"]
    assert "Where: a conversation in a terminal on the author's own computer." in said and "server" not in said


async def test_why_before_any_reply_and_after_one_that_recalled_nothing(fake_ollama, make_settings):
    settings = make_settings(fake_ollama.url, MUNINN_EXTRACTION="false")
    out = io.StringIO()
    await run_chat(settings, stdin=io.StringIO("/why\nhello there\n/why\n"), stdout=out, name="Kari")
    text = out.getvalue()
    assert "No reply yet to explain" in text
    assert "The last reply recalled nothing: no memory you can see here matched “hello there”." in text
