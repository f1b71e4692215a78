"""Self-test of the fake OpenAI-compatible server (tests/fakes/openai.py): the wire format a real
server speaks, read with plain aiohttp (not Muninn's client)."""
from __future__ import annotations

import json

import aiohttp
import pytest

from tests.fakes.openai import FakeOpenAI, FakeOpenAIThread

SCHEMA = {"type": "object", "properties": {"facts": {"type": "array"}}, "required": ["facts"]}


@pytest.fixture
async def fake():
    async with FakeOpenAI(api_key="sk-test") as server:
        yield server


@pytest.fixture
async def session():
    async with aiohttp.ClientSession(headers={"Authorization": "Bearer sk-test"}) as s:
        yield s


async def post(session, url: str, body: dict) -> tuple[int, dict, dict]:
    async with session.post(url, json=body) as r:
        return r.status, await r.json(content_type=None), dict(r.headers)


async def test_models_lists_ids(fake, session):
    fake.missing = {"llama3.2"}
    async with session.get(fake.base_url + "/models") as r:
        data = await r.json()
    assert r.status == 200 and data["object"] == "list"
    assert [m["id"] for m in data["data"]] == ["nomic-embed-text"]
    assert all(m["object"] == "model" and "owned_by" in m for m in data["data"])


async def test_a_whole_chat_completion(fake, session):
    fake.chat_replies.append("Hello there.")
    status, data, _ = await post(session, fake.base_url + "/chat/completions",
                                 {"model": "llama3.2", "messages": [{"role": "user", "content": "hi"}]})
    assert status == 200 and data["object"] == "chat.completion"
    [choice] = data["choices"]
    assert choice["message"] == {"role": "assistant", "content": "Hello there."}
    assert choice["finish_reason"] == "stop" and data["usage"]["total_tokens"] > 0


async def test_a_streamed_chat_completion_is_server_sent_events_ending_in_done(fake, session):
    fake.chat_replies.append("one two three")
    body = {"model": "llama3.2", "stream": True, "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": "count"}]}
    async with session.post(fake.base_url + "/chat/completions", json=body) as r:
        assert r.headers["Content-Type"].startswith("text/event-stream")
        raw = (await r.read()).decode()
    events = [block for block in raw.split("\n\n") if block]
    assert events[0].startswith(":")                       # a keep-alive comment, as OpenRouter sends
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[1:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == "one two three"
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert finishes[-1] == "stop" and set(finishes[:-1]) == {None}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 3


async def test_a_stream_that_fails_sends_an_error_event(fake, session):
    fake.chat_replies.append("a b c d")
    fake.stream_fail_after = 2
    body = {"model": "llama3.2", "stream": True, "messages": [{"role": "user", "content": "x"}]}
    async with session.post(fake.base_url + "/chat/completions", json=body) as r:
        raw = (await r.read()).decode()
    assert '"error": {' in raw and "engine died" in raw


async def test_json_schema_is_checked_and_refused_formats_answer_like_old_llama_server(fake, session):
    base = {"model": "llama3.2", "messages": [{"role": "user", "content": "x"}]}
    good = {"type": "json_schema", "json_schema": {"name": "facts", "schema": SCHEMA}}
    status, data, _ = await post(session, fake.base_url + "/chat/completions", {**base, "response_format": good})
    assert status == 200 and data["choices"][0]["message"]["content"] == "{}"
    status, data, _ = await post(session, fake.base_url + "/chat/completions",
                                 {**base, "response_format": {"type": "json_schema", "json_schema": {"name": "x"}}})
    assert status == 400 and "schema" in data["error"]["message"]
    fake.refuse_formats = {"json_schema"}
    fake.refuse_status = 500
    status, data, _ = await post(session, fake.base_url + "/chat/completions", {**base, "response_format": good})
    assert status == 500 and "json_schema" in data["error"]["message"]
    status, _, _ = await post(session, fake.base_url + "/chat/completions",
                              {**base, "response_format": {"type": "json_object"}})
    assert status == 200


async def test_embeddings_carry_their_input_index(fake, session):
    fake.shuffle_embeddings = True
    status, data, _ = await post(session, fake.base_url + "/embeddings",
                                 {"model": "nomic-embed-text", "input": ["first", "second"]})
    assert status == 200 and data["object"] == "list" and data["usage"]["prompt_tokens"] == 2
    assert [item["index"] for item in data["data"]] == [1, 0]
    assert data["data"][1]["embedding"] == fake.embed_text("first") and len(data["data"][0]["embedding"]) == 768
    status, data, _ = await post(session, fake.base_url + "/embeddings", {"model": "nomic-embed-text", "input": []})
    assert status == 400


async def test_errors_have_the_api_shape(fake, session):
    async with aiohttp.ClientSession() as anonymous:
        async with anonymous.get(fake.base_url + "/models") as r:
            status, data = r.status, await r.json()
    assert status == 401 and data["error"]["code"] == "invalid_api_key"
    status, data, _ = await post(session, fake.base_url + "/chat/completions",
                                 {"model": "gpt-nine", "messages": [{"role": "user", "content": "x"}]})
    assert status == 404 and data["error"]["code"] == "model_not_found" and "gpt-nine" in data["error"]["message"]
    fake.retry_after = 7
    fake.chat_replies.append(fake.RATE_LIMITED)
    status, data, headers = await post(session, fake.base_url + "/chat/completions",
                                       {"model": "llama3.2", "messages": [{"role": "user", "content": "x"}]})
    assert status == 429 and headers["Retry-After"] == "7" and data["error"]["code"] == "rate_limit_exceeded"
    fake.mode = "error"
    status, data, _ = await post(session, fake.base_url + "/embeddings", {"model": "nomic-embed-text", "input": "x"})
    assert status == 500 and data["error"]["type"] == "server_error"


def test_the_threaded_fake_serves_synchronous_code():
    import urllib.request
    with FakeOpenAIThread() as fake:
        with urllib.request.urlopen(fake.base_url + "/models", timeout=5) as r:
            assert {m["id"] for m in json.load(r)["data"]} == {"nomic-embed-text", "llama3.2"}
