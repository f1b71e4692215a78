"""The Ollama client against the fake server: errors, bounds, slots and cooldowns."""
from __future__ import annotations

import asyncio
import time

import pytest

from bot.llm.errors import OllamaBadResponse, OllamaDisabled, OllamaModelMissing, OllamaUnavailable
from bot.llm.ollama import OllamaClient
from bot.memory.records import NewMemory
from bot.memory.scope import Viewer

pytestmark = pytest.mark.usefixtures("backend")  # engine tests on SQLite and PostgreSQL


def client_for(fake, **kwargs) -> OllamaClient:
    options = dict(embed_timeout=1.0, chat_timeout=1.0, retries=0, cooldown=0.0)
    options.update(kwargs)
    return OllamaClient(fake.url, **options)


@pytest.mark.parametrize("bad", [[0.0] * 768, [float("nan")] * 768, [float("inf")] + [0.1] * 767, [],
                                 [10 ** 400] + [0.1] * 767, [True] * 768])
async def test_unusable_embeddings_are_a_bad_response(fake_ollama, bad):
    fake_ollama.vectors["some text"] = bad
    async with client_for(fake_ollama) as client:
        with pytest.raises(OllamaBadResponse):
            await client.embed(["some text"])


async def test_mixed_sizes_in_one_batch_are_a_bad_response(fake_ollama):
    fake_ollama.vectors["short"] = [0.5] * 10
    async with client_for(fake_ollama) as client:
        with pytest.raises(OllamaBadResponse):
            await client.embed(["short", "a normal text"])


async def test_zero_embedding_falls_back_and_stores_without_vector(engine, fake_ollama):
    fake_ollama.vectors["GPU server"] = [0.0] * 768
    memory_id = await engine.remember(NewMemory("GPU server", "global"))
    result = await engine.recall("GPU server", Viewer(1, dm=True))
    assert result.mode == "fts-only" and result.vector_status == "bad-response"
    assert result.ids == [memory_id]


async def test_missing_model_names_the_pull(fake_ollama):
    fake_ollama.missing = {"llama3.2"}
    async with client_for(fake_ollama) as client:
        with pytest.raises(OllamaModelMissing, match="ollama pull llama3.2"):
            await client.chat([{"role": "user", "content": "hi"}])


async def test_disabled_client_never_calls_out():
    client = OllamaClient("")
    with pytest.raises(OllamaDisabled):
        await client.embed(["x"])
    with pytest.raises(OllamaDisabled):
        await client.chat([])


async def test_retries_are_bounded(fake_ollama):
    fake_ollama.mode = "error"
    async with client_for(fake_ollama, retries=2) as client:
        with pytest.raises(OllamaUnavailable):
            await client.embed(["x"])
    assert len(fake_ollama.embed_requests()) == 3


async def test_background_work_never_takes_a_reply_slot(fake_ollama):
    fake_ollama.mode, fake_ollama.delay = "slow", 0.8
    async with client_for(fake_ollama, chat_timeout=5.0, concurrency=1) as client:
        background = [asyncio.create_task(client.chat([{"role": "user", "content": "extract"}], background=True))
                      for _ in range(3)]
        await asyncio.sleep(0.1)
        started = time.monotonic()
        await client.chat([{"role": "user", "content": "hello"}])
        assert time.monotonic() - started < 1.5  # not behind three background calls of 0.8 s
        await asyncio.gather(*background)


async def test_waiting_for_a_slot_counts_against_the_timeout(fake_ollama):
    fake_ollama.mode, fake_ollama.delay = "slow", 3.0
    async with client_for(fake_ollama, chat_timeout=0.5, concurrency=1) as client:
        first = asyncio.create_task(client.chat([{"role": "user", "content": "a"}], timeout=5.0))
        await asyncio.sleep(0.1)
        started = time.monotonic()
        with pytest.raises(OllamaUnavailable, match="slots"):
            await client.chat([{"role": "user", "content": "b"}])
        assert time.monotonic() - started < 1.0
        first.cancel()


async def test_a_hung_ollama_is_not_asked_again_during_the_cooldown(fake_ollama):
    fake_ollama.mode, fake_ollama.delay = "slow", 3.0
    async with client_for(fake_ollama, chat_timeout=0.3, cooldown=30.0) as client:
        with pytest.raises(OllamaUnavailable):
            await client.chat([{"role": "user", "content": "a"}])
        calls = len(fake_ollama.chat_requests())
        started = time.monotonic()
        with pytest.raises(OllamaUnavailable):
            await client.chat([{"role": "user", "content": "b"}])
        assert time.monotonic() - started < 0.1 and len(fake_ollama.chat_requests()) == calls


async def test_concurrent_replies_are_bounded_by_the_setting(fake_ollama, make_settings):
    fake_ollama.mode, fake_ollama.delay = "slow", 0.4
    client = OllamaClient.from_settings(make_settings(fake_ollama.url, OLLAMA_MAX_CONCURRENCY=2,
                                                      OLLAMA_CHAT_TIMEOUT=5))
    async with client:
        started = time.monotonic()
        await asyncio.gather(*(client.chat([{"role": "user", "content": str(n)}]) for n in range(4)))
        elapsed = time.monotonic() - started
    assert 0.75 <= elapsed < 1.5  # two at a time: two waves of 0.4 s, not one


# -- cooldowns per purpose, the recovery probe, streaming --------------------------------------

async def test_a_failed_background_call_cools_down_background_work_only(fake_ollama):
    async with client_for(fake_ollama, cooldown=30.0) as client:
        fake_ollama.chat_replies.append(fake_ollama.HTTP_500)
        with pytest.raises(OllamaUnavailable):
            await client.chat([{"role": "user", "content": "extract"}], background=True)
        assert await client.chat([{"role": "user", "content": "hello"}]) == "ok"  # replies are not affected
        calls = len(fake_ollama.chat_requests())
        with pytest.raises(OllamaUnavailable):                                    # background work waits
            await client.chat([{"role": "user", "content": "extract"}], background=True)
        assert len(fake_ollama.chat_requests()) == calls


async def test_during_the_reply_cooldown_one_probe_lets_replies_through_again(fake_ollama, monkeypatch):
    async with client_for(fake_ollama, cooldown=30.0) as client:
        await fake_ollama.go_down()
        with pytest.raises(OllamaUnavailable):
            await client.chat([{"role": "user", "content": "a"}])
        await fake_ollama.come_up()
        with pytest.raises(OllamaUnavailable, match="moments ago"):   # right after a failure: no probe
            await client.chat([{"role": "user", "content": "b"}])
        monkeypatch.setattr("bot.llm.ollama.PROBE_AFTER", 0.0)
        replies = await asyncio.gather(*(client.chat([{"role": "user", "content": str(n)}]) for n in range(3)))
        assert replies == ["ok"] * 3
        assert [path for path, _ in fake_ollama.requests].count("/api/version") == 1  # one probe for all three
        assert not client.cooling_down("reply") and not client.cooling_down("background")


async def collect(client, **kwargs) -> list[str]:
    return [piece async for piece in client.chat_stream([{"role": "user", "content": "hi"}], **kwargs)]


async def test_a_streamed_reply_arrives_in_pieces_that_add_up_to_the_answer(fake_ollama):
    fake_ollama.default_chat_reply = "Ravens can remember human faces for years."
    async with client_for(fake_ollama) as client:
        pieces = await collect(client)
    assert len(pieces) == 7 and "".join(pieces) == "Ravens can remember human faces for years."
    assert fake_ollama.chat_requests()[-1]["stream"] is True


async def test_streaming_fails_like_chat(fake_ollama):
    async with client_for(fake_ollama, cooldown=30.0, retries=1) as client:
        fake_ollama.missing = {"llama3.2"}
        with pytest.raises(OllamaModelMissing):
            await collect(client)
        fake_ollama.missing = set()
        fake_ollama.chat_replies.append(fake_ollama.HTTP_500)      # a 500 before the first piece is retried
        assert "".join(await collect(client)) == "ok"
        fake_ollama.default_chat_reply = "one two three four"
        fake_ollama.stream_fail_after = 2                           # the runner dies mid-answer
        got: list[str] = []
        with pytest.raises(OllamaUnavailable, match="unexpectedly stopped"):
            async for piece in client.chat_stream([{"role": "user", "content": "hi"}]):
                got.append(piece)
        assert got == ["one", " two"] and client.cooling_down("reply")
