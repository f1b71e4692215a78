"""The OpenAI-compatible client against the stand-in server (tests/fakes/openai.py): chat whole and
streamed, structured output and its fallbacks, embeddings, models, the API key, and each error."""
from __future__ import annotations

import asyncio
import json
import logging
import time

import pytest

from bot.llm.answers import ask_json
from bot.llm.errors import LLMAuthFailed, OllamaBadResponse, OllamaModelMissing, OllamaUnavailable
from bot.llm.openai_api import OpenAIClient, OpenAIHosts, api_base, retry_after
from tests.fakes.openai import FakeOpenAI
from tests.postgres_server import free_port

HI = [{"role": "user", "content": "hi"}]
SCHEMA = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}


@pytest.fixture
async def fake():
    async with FakeOpenAI(api_key="sk-right") as server:
        yield server


def client_for(fake, **kwargs) -> OpenAIClient:
    options = dict(embed_timeout=1.0, chat_timeout=2.0, retries=0, cooldown=0.0, api_key="sk-right")
    options.update(kwargs)
    return OpenAIClient(fake.url, **options)


def test_the_base_url_gets_v1_only_when_it_has_no_path():
    assert api_base("http://localhost:8080") == "http://localhost:8080/v1"
    assert api_base("http://localhost:8000/v1/") == "http://localhost:8000/v1"
    assert api_base("https://openrouter.ai/api/v1") == "https://openrouter.ai/api/v1"


def test_retry_after_reads_seconds_and_dates():
    assert retry_after({"Retry-After": "7"}) == 7.0
    assert retry_after({}) is None and retry_after({"Retry-After": "soon"}) is None
    future = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 30))
    assert 25 <= (retry_after({"Retry-After": future}) or 0) <= 31


async def test_chat_sends_the_key_the_model_and_the_temperature(fake):
    fake.chat_replies.append("Hello!")
    async with client_for(fake) as client:
        assert await client.chat(HI, options={"temperature": 0, "num_ctx": 4096}) == "Hello!"
    [body] = fake.chat_requests()
    assert body["model"] == "llama3.2" and body["messages"] == HI and body["stream"] is False
    assert body["temperature"] == 0 and "num_ctx" not in body and "options" not in body


async def test_streaming_yields_the_delta_contents_in_order(fake):
    fake.chat_replies.append("Ravens remember faces for years.")
    async with client_for(fake) as client:
        pieces = [piece async for piece in client.chat_stream(HI)]
    assert "".join(pieces) == "Ravens remember faces for years." and len(pieces) == 5
    assert fake.chat_requests()[0]["stream"] is True


async def test_a_stream_that_fails_midway_raises_and_cools_replies_down(fake):
    fake.chat_replies.append("a b c d e")
    fake.stream_fail_after = 2
    async with client_for(fake, cooldown=30) as client:
        got = []
        with pytest.raises(OllamaUnavailable, match="engine died"):
            async for piece in client.chat_stream(HI):
                got.append(piece)
        assert got == ["a", " b"] and client.cooling_down("reply")


def test_server_sent_event_lines_of_other_servers():
    client = OpenAIClient("http://x")
    assert client._stream_piece(b": OPENROUTER PROCESSING\n") == ("", False)
    assert client._stream_piece(b"event: message\n") == ("", False)
    assert client._stream_piece(b'data: {"choices":[{"delta":{"content":"Hi"},"finish_reason":null}]}\n') == ("Hi", False)
    assert client._stream_piece(b'data:{"choices":[{"delta":{"content":"!"},"finish_reason":"stop"}]}') == ("!", True)
    assert client._stream_piece(b'data: {"choices":[],"usage":{"total_tokens":3}}') == ("", False)
    assert client._stream_piece(b"data: [DONE]\n") == ("", True)
    with pytest.raises(OllamaUnavailable, match="slot unavailable"):  # llama-server's error event
        client._stream_piece(b'error: {"code":503,"message":"slot unavailable","type":"unavailable_error"}')
    with pytest.raises(OllamaUnavailable, match="Provider returned error"):  # OpenRouter's, mid-stream
        client._stream_piece(b'data: {"error":{"code":502,"message":"Provider returned error"},'
                             b'"choices":[{"delta":{"content":""},"finish_reason":"error"}]}')
    with pytest.raises(OllamaUnavailable, match="an error event"):
        client._stream_piece(b"event: error\n")
    with pytest.raises(OllamaBadResponse):
        client._stream_piece(b"data: {not json")


async def test_structured_output_asks_for_the_json_schema(fake):
    fake.chat_replies.append('{"answer": "yes"}')
    async with client_for(fake) as client:
        value = await ask_json(client, HI, SCHEMA, lambda data: (data["answer"], []), what="test")
    assert value == "yes"
    [body] = fake.chat_requests()
    assert body["response_format"] == {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA}}
    assert body["temperature"] == 0


@pytest.mark.parametrize("status", [400, 500])
async def test_a_server_that_refuses_json_schema_is_asked_with_json_object_then_plainly(fake, caplog, status):
    caplog.set_level(logging.INFO)
    fake.refuse_formats, fake.refuse_status = {"json_schema"}, status
    fake.default_chat_reply = lambda body: '```json\n{"answer": "ok"}\n```'
    async with client_for(fake) as client:
        assert await ask_json(client, HI, SCHEMA, lambda data: (data["answer"], []), what="test") == "ok"
        assert client.format_mode == "json_object"
        fake.refuse_formats = {"json_schema", "json_object"}
        client.format_mode = "json_schema"
        assert await ask_json(client, HI, SCHEMA, lambda data: (data["answer"], []), what="test") == "ok"
        assert client.format_mode == "plain"
        await client.chat(HI, format=SCHEMA)                     # the plain way is kept: asked once
    formats = [body.get("response_format", {}).get("type") for body in fake.chat_requests()]
    assert formats == ["json_schema", "json_object", "json_schema", "json_object", None, None]
    assert fake.chat_requests()[1]["response_format"]["schema"] == SCHEMA   # llama-server reads it there
    assert sum("refused structured output" in r.getMessage() for r in caplog.records) == 3


async def test_calls_refused_at_the_same_time_move_on_one_step(fake):
    fake.refuse_formats = {"json_schema"}
    async with client_for(fake) as client:
        answers = await asyncio.gather(*(client.chat(HI, format=SCHEMA) for _ in range(4)))
        assert answers == ["{}"] * 4 and client.format_mode == "json_object"


async def test_a_context_error_is_not_taken_for_a_refused_format(fake):
    async with client_for(fake) as client:
        with pytest.raises(OllamaBadResponse, match="400"):
            await client.chat([], format=SCHEMA)
        assert client.format_mode == "json_schema"


async def test_embeddings_come_back_in_input_order(fake):
    fake.shuffle_embeddings = True
    async with client_for(fake) as client:
        vectors = await client.embed(["first text", "second text"])
    assert vectors == [fake.embed_text("first text"), fake.embed_text("second text")]
    assert fake.embed_requests()[0] == {"model": "nomic-embed-text", "input": ["first text", "second text"],
                                        "encoding_format": "float"}


async def test_garbage_embeddings_are_a_bad_response(fake):
    fake.vectors["zero"] = [0.0] * 768
    async with client_for(fake) as client:
        with pytest.raises(OllamaBadResponse):
            await client.embed(["zero"])
        fake.embed_garbage = True
        with pytest.raises(OllamaBadResponse):
            await client.embed(["anything"])


async def test_models_and_a_missing_model_name_the_setting(fake):
    fake.missing = {"llama3.2"}
    async with client_for(fake) as client:
        assert await client.model_names() == ["nomic-embed-text"]
        assert await client.has_model("nomic-embed-text") and not await client.has_model("llama3.2")
        with pytest.raises(OllamaModelMissing, match="OLLAMA_CHAT_MODEL") as caught:
            await client.chat(HI)
    assert caught.value.model == "llama3.2" and "ollama pull" not in str(caught.value)


async def test_a_wrong_or_missing_key_says_which_setting(fake):
    for key in ("sk-wrong", ""):
        async with client_for(fake, api_key=key) as client:
            with pytest.raises(LLMAuthFailed, match="MUNINN_LLM_API_KEY"):
                await client.chat(HI)
            with pytest.raises(LLMAuthFailed):
                await client.embed(["x"])
            with pytest.raises(LLMAuthFailed):
                await client.model_names()


async def test_a_wrong_base_url_is_named(fake):
    async with OpenAIClient(fake.url + "/api", api_key="sk-right", retries=0) as client:
        with pytest.raises(OllamaBadResponse, match="base URL"):
            await client.chat(HI)


async def test_429_waits_a_short_retry_after_and_cools_down_for_a_long_one(fake):
    fake.retry_after = 0
    fake.chat_replies[:] = [fake.RATE_LIMITED, "after the pause"]
    async with client_for(fake, retries=1) as client:
        assert await client.chat(HI) == "after the pause"          # Retry-After: 0, retried at once
    fake.retry_after = 60
    fake.chat_replies[:] = [fake.RATE_LIMITED, "never asked"]
    async with client_for(fake, retries=1, cooldown=1) as client:
        with pytest.raises(OllamaUnavailable, match="rate limited"):
            await client.chat(HI)
        assert client._down_until["reply"] - time.monotonic() > 50  # the server's pause, not OLLAMA_COOLDOWN
        with pytest.raises(OllamaUnavailable, match="failed moments ago"):
            await client.chat(HI)                                   # no probe before the pause is over
    assert len(fake.chat_requests()) == 3


async def test_a_server_error_is_retried_then_cools_down(fake):
    fake.chat_replies[:] = [fake.HTTP_500, "second try"]
    async with client_for(fake, retries=1, cooldown=30) as client:
        assert await client.chat(HI) == "second try"
        fake.mode = "error"
        with pytest.raises(OllamaUnavailable, match="500"):
            await client.embed(["x"])
        assert client.cooling_down("embed") and not client.cooling_down("reply")


async def test_several_hosts_move_on_from_a_dead_one(fake):
    dead = f"http://127.0.0.1:{free_port()}"
    async with OpenAIHosts([dead, fake.url], embed_timeout=1.0, chat_timeout=2.0, retries=0, cooldown=30,
                           api_key="sk-right") as client:
        for _ in range(3):
            assert await client.chat(HI) == "ok"
            assert len(await client.embed(["x"])) == 1
            assert "".join([p async for p in client.chat_stream(HI)]) == "ok"
        assert client.where == f"{dead}/v1,{fake.url}/v1"
        per_host = await client.models_per_host()
    assert isinstance(per_host[f"{dead}/v1"], OllamaUnavailable)
    assert "start the server or fix OLLAMA_URL" in str(per_host[f"{dead}/v1"])
    assert per_host[f"{fake.url}/v1"] == ["nomic-embed-text", "llama3.2"]


async def test_the_fakes_reply_callable_sees_the_request_as_sent(fake):
    fake.default_chat_reply = lambda body: json.dumps({"answer": body["response_format"]["type"]})
    async with client_for(fake) as client:
        assert await client.chat(HI, format=SCHEMA) == '{"answer": "json_schema"}'
