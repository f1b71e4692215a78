"""`muninn chat`: the same pipeline in a terminal, one local user in one local room."""
from __future__ import annotations

import asyncio
import io
import json
import re

import pytest

from bot.cli.chat import (
    LOCAL_CHANNEL_ID,
    LOCAL_GUILD_ID,
    LOCAL_USER_ID,
    SLOW_DOWN,
    local_name,
    run_chat,
)
from bot.cli.main import main
from bot.memory.engine import Engine
from bot.memory.scope import Viewer
from bot.memory.sql import history, store

pytestmark = pytest.mark.usefixtures("backend")  # on SQLite and on PostgreSQL


def answers(request: dict) -> str:
    said = request["messages"][-1]["content"]
    if request.get("format"):
        name = local_name()
        facts = [{"text": f"{name} grows tomatoes", "about": name, "scope": "personal", "importance": 0.7}]
        return json.dumps({"facts": facts if "tomatoes" in said else []})
    return "You said: " + said.rsplit(": ", 1)[-1]


async def test_chat_answers_remembers_and_recalls_in_the_local_room(fake_ollama, make_settings):
    fake_ollama.default_chat_reply = answers
    settings = make_settings(fake_ollama.url)
    out = io.StringIO()
    code = await run_chat(settings, stdin=io.StringIO("I grow tomatoes\n\n/quit\nnever read\n"), stdout=out)
    assert code == 0
    assert out.getvalue() == "muninn> You said: I grow tomatoes\n"  # not interactive: no prompts or banner

    async with Engine(settings) as engine:
        [memory] = await engine.write(store.memories_of, LOCAL_USER_ID, ("personal",))
        assert (memory.guild_id, memory.channel_id) == (LOCAL_GUILD_ID, LOCAL_CHANNEL_ID)
        recalled = await engine.recall("tomatoes", Viewer(user_id=LOCAL_USER_ID, channel_id=0, guild_id=0))
        assert recalled.texts == [memory.text]
        rows = await engine.write(history.recent, LOCAL_CHANNEL_ID, 10)
        assert [r.role for r in rows] == ["user", "assistant"]

    out = io.StringIO()
    await run_chat(settings, stdin=io.StringIO("what do I grow?\n"), stdout=out)
    prompt = [r for r in fake_ollama.chat_requests() if not r.get("format")][-1]["messages"]
    assert memory.text in prompt[0]["content"] and "terminal" in prompt[0]["content"]
    assert [m["role"] for m in prompt] == ["system", "user", "assistant", "user"]  # the earlier session
    assert re.match(r"\(\w+, \w+ \d+, \d{4} at ", prompt[-1]["content"])  # today's date, with its year


async def test_chat_with_ollama_down_still_answers(fake_ollama, make_settings):
    await fake_ollama.go_down()
    out = io.StringIO()
    await run_chat(make_settings(fake_ollama.url), stdin=io.StringIO("hello?\n"), stdout=out)
    assert "can't think right now" in out.getvalue()


async def test_muninn_chat_subcommand(fake_ollama, tmp_path, monkeypatch, capsys, database_env):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MUNINN_DB_PATH", str(tmp_path / "chat.db"))
    monkeypatch.setenv("OLLAMA_URL", fake_ollama.url)
    monkeypatch.setattr("sys.stdin", io.StringIO("hi there\n"))
    fake_ollama.chat_replies.append("hello, human")
    assert await asyncio.to_thread(main, ["chat"]) == 0
    assert "muninn> hello, human" in capsys.readouterr().out


async def test_chat_past_the_share_of_answers_says_so_in_one_line(fake_ollama, make_settings):
    """Lines piped faster than MUNINN_RATE_PER_MINUTE: a quick run is answered, then one short
    line says the rest are kept but not answered (once a minute, not once each)."""
    fake_ollama.default_chat_reply = answers
    settings = make_settings(fake_ollama.url, MUNINN_RATE_PER_MINUTE=6, MUNINN_RATE_BURST=2, MUNINN_EXTRACTION="false")
    out = io.StringIO()
    await run_chat(settings, stdin=io.StringIO("".join(f"line {n}\n" for n in range(5))), stdout=out)
    assert out.getvalue().splitlines() == ["muninn> You said: line 0", "muninn> You said: line 1", SLOW_DOWN]
    assert len(fake_ollama.chat_requests()) == 2
    async with Engine(settings) as engine:
        rows = await engine.write(history.recent, LOCAL_CHANNEL_ID, 20)
    assert [r.content for r in rows if r.role == "user"] == [f"line {n}" for n in range(5)]  # all kept
