"""Several Ollama hosts (OLLAMA_URL=a,b,c) against two or three real fake-Ollama servers."""
from __future__ import annotations

import asyncio
import logging
from contextlib import AsyncExitStack

import pytest

from bot.cli.doctor import ollama_checks
from bot.llm.errors import OllamaUnavailable
from bot.llm.hosts import split_urls
from bot.llm.ollama import OllamaClient, OllamaHosts
from bot.memory.engine import Engine
from bot.memory.records import NewMemory
from bot.memory.scope import Viewer
from tests.fakes.ollama import FakeOllama

pytestmark = pytest.mark.usefixtures("backend")  # engine tests on SQLite and PostgreSQL

HI = [{"role": "user", "content": "hi"}]


@pytest.fixture
async def fakes():
    async with AsyncExitStack() as stack:
        yield [await stack.enter_async_context(FakeOllama()) for _ in range(3)]


def hosts_for(fakes, **kwargs) -> OllamaHosts:
    options: dict = {"embed_timeout": 1.0, "chat_timeout": 2.0, "retries": 0, "cooldown": 30.0}
    options.update(kwargs)
    return OllamaHosts([fake.url for fake in fakes], **options)


def skip_lines(caplog, url: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if url in r.getMessage() and "skipping it" in r.getMessage()]


def test_settings_with_several_urls_give_several_hosts(make_settings):
    settings = make_settings("http://127.0.0.1:1, http://127.0.0.1:2/,http://127.0.0.1:1")
    assert settings.ollama_url == "http://127.0.0.1:1,http://127.0.0.1:2"
    client = OllamaClient.from_settings(settings)
    assert isinstance(client, OllamaHosts) and [h.url for h in client.hosts] == split_urls(settings.ollama_url)
    assert type(OllamaClient.from_settings(make_settings("http://127.0.0.1:1"))) is OllamaClient


async def test_concurrent_replies_spread_over_the_least_busy_hosts(fakes):
    for fake in fakes[:2]:
        fake.mode, fake.delay = "slow", 0.3
    async with hosts_for(fakes[:2], concurrency=1) as client:
        replies = await asyncio.gather(*(client.chat(HI) for _ in range(4)),
                                       *(client.chat(HI, background=True) for _ in range(2)))
        assert replies == ["ok"] * 6
        assert [len(fake.chat_requests()) for fake in fakes[:2]] == [3, 3]
        for fake in fakes[:2]:
            fake.mode = "up"
        for _ in range(4):                       # one at a time: the hosts take turns
            await client.embed(["ravens"])
        assert [len(fake.embed_requests()) for fake in fakes[:2]] == [2, 2]
        assert client.in_flight == {fake.url: 0 for fake in fakes[:2]}


async def test_a_dead_host_is_skipped_with_one_log_line_naming_it(fakes, caplog):
    dead = fakes[1]
    async with hosts_for(fakes) as client:
        await dead.go_down()
        with caplog.at_level(logging.WARNING, logger="bot.llm.hosts"):
            for _ in range(6):
                assert await client.chat(HI) == "ok"
                assert len(await client.embed(["ravens"])) == 1
            assert "".join([piece async for piece in client.chat_stream(HI)]) == "ok"
        assert len(skip_lines(caplog, dead.url)) == 2      # one for replies, one for embeddings
        assert not any("every Ollama host" in r.getMessage() for r in caplog.records)
        assert len(fakes[0].chat_requests()) + len(fakes[2].chat_requests()) == 7


async def test_the_cooldown_is_per_host_and_per_purpose(fakes):
    first, second = fakes[:2]
    async with hosts_for(fakes[:2]) as client:
        first.chat_replies.append(FakeOllama.HTTP_500)
        assert [await client.chat(HI) for _ in range(2)] == ["ok", "ok"]  # the hosts take turns; one fails over
        failed, healthy = client.hosts
        assert failed.cooling_down("reply") and failed.url == first.url
        assert not healthy.cooling_down("reply") and not client.cooling_down("reply")
        assert not failed.cooling_down("embed") and not failed.cooling_down("background")
        before = len(first.chat_requests())
        for _ in range(4):
            assert await client.chat(HI) == "ok"
            await client.embed(["x"])
            await client.chat([{"role": "user", "content": "extract"}], background=True)
        since = [r["messages"][0]["content"] for r in first.chat_requests()[before:]]
        assert since and set(since) == {"extract"}       # background work still goes there, replies do not
        assert len(first.embed_requests()) >= 1 and len(second.chat_requests()) >= 5


async def test_a_recovered_host_is_found_by_its_probe_and_used_again(fakes, monkeypatch):
    first = fakes[0]
    async with hosts_for(fakes[:2]) as client:
        await first.go_down()
        for _ in range(2):
            assert await client.chat(HI) == "ok"
        down = client.hosts[0]
        assert down.cooling_down("reply") and not client.cooling_down("reply")
        await first.come_up()
        monkeypatch.setattr("bot.llm.ollama.PROBE_AFTER", 0.0)
        await client.chat(HI)                                # replies go on; a probe asks the first host
        for _ in range(50):
            if not down.cooling_down("reply"):
                break
            await asyncio.sleep(0.02)
        assert not down.cooling_down("reply")
        assert [path for path, _ in first.requests].count("/api/version") == 1
        await asyncio.gather(*(client.chat(HI) for _ in range(4)))
        assert len(first.chat_requests()) >= 1


async def test_all_hosts_dead_falls_back_like_one_dead_host(fakes, make_settings, caplog):
    settings = make_settings(",".join(fake.url for fake in fakes[:2]), OLLAMA_COOLDOWN="30")
    async with Engine(settings) as engine:
        memory_id = await engine.remember(NewMemory("The GPU server is in rack four", "global"))
        for fake in fakes[:2]:
            await fake.go_down()
        with caplog.at_level(logging.WARNING):
            for _ in range(3):
                result = await engine.recall("GPU server", Viewer(1, dm=True))
                assert result.mode == "fts-only" and result.vector_status == "unreachable"
                assert result.ids == [memory_id]
            with pytest.raises(OllamaUnavailable):
                await engine.ollama.chat(HI)             # the pipeline turns this into CANNOT_THINK
            with pytest.raises(OllamaUnavailable):
                [piece async for piece in engine.ollama.chat_stream(HI)]
        assert sum("embedding failed on every Ollama host" in r.getMessage() for r in caplog.records) == 1
        for fake in fakes[:2]:
            assert len(skip_lines(caplog, fake.url)) == 2


async def test_doctor_checks_each_host(fakes, make_settings):
    fakes[1].missing = {"llama3.2"}
    await fakes[2].go_down()
    checks = await ollama_checks(make_settings(",".join(fake.url for fake in fakes)))
    failed = {c.name: c for c in checks if not c.ok}
    assert set(failed) == {f"chat model {fakes[1].url}", f"ollama {fakes[2].url}"}
    assert failed[f"chat model {fakes[1].url}"].fix == f"ollama pull llama3.2 (on {fakes[1].url})"
    assert sum(c.ok for c in checks) == 5  # the first host: reachable, both models; the second: all but one
