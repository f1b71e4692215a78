"""Self-test of the fake Ollama server (tests/fakes/ollama.py)."""

from __future__ import annotations

import asyncio
import json
import math
import sys
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio

_ROOT = str(Path(__file__).resolve().parents[2])
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from tests.fakes.ollama import FakeOllama, FakeOllamaThread  # noqa: E402

EMB = "nomic-embed-text"


def cos(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


async def post(session: aiohttp.ClientSession, url: str, body: dict) -> tuple[int, dict]:
    async with session.post(url, json=body) as r:
        return r.status, await r.json(content_type=None)


async def embed(session: aiohttp.ClientSession, fake: FakeOllama, inp) -> list[list[float]]:
    status, data = await post(session, fake.url + "/api/embed", {"model": EMB, "input": inp})
    assert status == 200, data
    return data["embeddings"]


@pytest_asyncio.fixture
async def fake():
    async with FakeOllama() as f:
        yield f


@pytest_asyncio.fixture
async def session():
    async with aiohttp.ClientSession() as s:
        yield s


@pytest.mark.asyncio
async def test_embed_single_and_batch(fake, session):
    status, data = await post(session, fake.url + "/api/embed", {"model": EMB, "input": "Hello world"})
    assert status == 200
    assert data["model"] == EMB
    assert {"total_duration", "load_duration", "prompt_eval_count"} <= data.keys()
    (vec,) = data["embeddings"]
    assert len(vec) == 768
    assert math.isclose(math.sqrt(sum(x * x for x in vec)), 1.0, rel_tol=1e-9)

    batch = await embed(session, fake, ["Hello world", "other", ""])
    assert len(batch) == 3 and all(len(v) == 768 for v in batch)
    assert batch[0] == vec  # deterministic
    assert batch[2] == [1.0] + [0.0] * 767  # no tokens -> fixed unit vector
    assert await embed(session, fake, []) == []
    assert fake.embed_requests()[0] == {"model": EMB, "input": "Hello world"}
    assert fake.requests[0][0] == "/api/embed"


@pytest.mark.asyncio
async def test_shared_words_are_more_similar(fake, session):
    a, b, c = await embed(session, fake, [
        "My favourite GPU is the RTX 4090",
        "which gpu does he like? the rtx one",
        "I had pasta for dinner yesterday",
    ])
    assert cos(a, b) > 0.3
    assert abs(cos(a, c)) < 0.2
    assert cos(a, b) > cos(a, c) + 0.2


@pytest.mark.asyncio
async def test_synonyms_and_vector_overrides(fake, session):
    (before,) = await embed(session, fake, ["graphics"])
    fake.synonyms["graphics"] = "gpu"
    g, u = await embed(session, fake, ["graphics", "gpu"])
    assert cos(g, u) == pytest.approx(1.0)
    assert cos(before, u) < 0.2
    fake.vectors["exact text"] = [0.0, 1.0] + [0.0] * 766
    (v,) = await embed(session, fake, ["exact text"])
    assert v[:2] == [0.0, 1.0]


@pytest.mark.asyncio
async def test_missing_model_404(fake, session):
    status, data = await post(session, fake.url + "/api/embed", {"model": "nope", "input": "x"})
    assert status == 404
    assert data == {"error": 'model "nope" not found, try pulling it first'}
    # ":latest" is implied
    status, _ = await post(session, fake.url + "/api/embed", {"model": EMB + ":latest", "input": "x"})
    assert status == 200
    fake.missing.add(EMB + ":latest")
    status, data = await post(session, fake.url + "/api/embed", {"model": EMB, "input": "x"})
    assert status == 404 and "try pulling it first" in data["error"]
    status, data = await post(session, fake.url + "/api/chat",
                              {"model": "ghost", "messages": [], "stream": False})
    assert status == 404
    async with session.get(fake.url + "/api/tags") as r:
        names = [m["name"] for m in (await r.json())["models"]]
    assert names == ["llama3.2:latest"]


@pytest.mark.asyncio
async def test_error_mode_and_bad_request(fake, session):
    fake.mode = "error"
    for path, body in [("/api/embed", {"model": EMB, "input": "x"}),
                       ("/api/chat", {"model": "llama3.2", "messages": []})]:
        status, data = await post(session, fake.url + path, body)
        assert status == 500 and data["error"]
    async with session.get(fake.url + "/api/tags") as r:
        assert r.status == 500
    fake.mode = "up"
    status, data = await post(session, fake.url + "/api/embed", {"input": "x"})
    assert status == 400 and data["error"] == "model is required"
    async with session.post(fake.url + "/api/embed", data=b"{not json") as r:
        assert r.status == 400 and "error" in await r.json()


@pytest.mark.asyncio
async def test_wrong_dim_and_garbage(fake, session):
    fake.wrong_dim = 384
    (v,) = await embed(session, fake, "hi")
    assert len(v) == 384
    fake.wrong_dim = None
    fake.embed_garbage = True
    async with session.post(fake.url + "/api/embed", json={"model": EMB, "input": "x"}) as r:
        assert r.status == 200
        with pytest.raises(json.JSONDecodeError):
            json.loads(await r.text())


@pytest.mark.asyncio
async def test_slow_mode_times_out_client(fake, session):
    fake.mode, fake.delay = "slow", 0.5
    with pytest.raises(asyncio.TimeoutError):
        async with session.post(fake.url + "/api/embed", json={"model": EMB, "input": "x"},
                                timeout=aiohttp.ClientTimeout(total=0.1)):
            pass
    fake.delay = 0.01
    assert len((await embed(session, fake, "x"))[0]) == 768


@pytest.mark.asyncio
async def test_chat_non_stream(fake, session):
    body = {"model": "llama3.2", "stream": False, "format": "json",
            "messages": [{"role": "user", "content": "hi"}]}
    status, data = await post(session, fake.url + "/api/chat", body)
    assert status == 200
    assert data["message"] == {"role": "assistant", "content": "{}"}  # format set -> "{}"
    assert data["done"] is True and data["done_reason"] == "stop"
    assert data["model"] == "llama3.2" and data["created_at"].endswith("Z")
    assert fake.chat_requests() == [body]


@pytest.mark.asyncio
async def test_chat_stream_is_default(fake, session):
    fake.chat_replies.append("The sky is blue.")
    body = {"model": "llama3.2", "messages": [{"role": "user", "content": "why?"}]}
    async with session.post(fake.url + "/api/chat", json=body) as r:
        assert r.status == 200
        assert r.headers["Content-Type"].startswith("application/x-ndjson")
        lines = [json.loads(line) async for line in r.content if line.strip()]
    assert len(lines) > 2
    assert all(not c["done"] for c in lines[:-1])
    assert lines[-1]["done"] is True and lines[-1]["done_reason"] == "stop"
    assert "".join(c["message"]["content"] for c in lines) == "The sky is blue."


@pytest.mark.asyncio
async def test_scripted_queue(fake, session):
    fake.delay = 0.5
    fake.chat_replies.extend([
        "first",
        lambda req: "echo:" + req["messages"][-1]["content"],
        FakeOllama.HTTP_500,
        FakeOllama.TIMEOUT,
        RuntimeError("boom"),
    ])
    fake.default_chat_reply = "fallback"
    url = fake.url + "/api/chat"

    def msg(text: str) -> dict:
        return {"model": "llama3.2", "stream": False, "messages": [{"role": "user", "content": text}]}

    assert (await post(session, url, msg("a")))[1]["message"]["content"] == "first"
    assert (await post(session, url, msg("b")))[1]["message"]["content"] == "echo:b"
    status, data = await post(session, url, msg("c"))
    assert status == 500 and data["error"]
    with pytest.raises(asyncio.TimeoutError):
        await session.post(url, json=msg("d"), timeout=aiohttp.ClientTimeout(total=0.1))
    status, data = await post(session, url, msg("e"))
    assert status == 500 and data["error"] == "boom"
    assert (await post(session, url, msg("f")))[1]["message"]["content"] == "fallback"
    assert [r["messages"][0]["content"] for r in fake.chat_requests()] == list("abcdef")


@pytest.mark.asyncio
async def test_generate_tags_version(fake, session):
    status, data = await post(session, fake.url + "/api/generate",
                              {"model": "llama3.2", "prompt": "x", "stream": False})
    assert status == 200 and data["response"] == "ok" and data["done"] is True
    async with session.get(fake.url + "/api/tags") as r:
        models = (await r.json())["models"]
    assert [m["name"] for m in models] == ["nomic-embed-text:latest", "llama3.2:latest"]
    assert all(m["model"] == m["name"] and m["digest"] and m["details"] for m in models)
    async with session.get(fake.url + "/api/version") as r:
        assert "version" in await r.json()


@pytest.mark.asyncio
async def test_down_and_up_on_same_port(fake):
    port = fake.port
    async with aiohttp.ClientSession() as s:  # keep-alive connection in the pool
        assert (await post(s, fake.url + "/api/embed", {"model": EMB, "input": "x"}))[0] == 200
        await fake.go_down()
        with pytest.raises(aiohttp.ClientError):
            await post(s, fake.url + "/api/embed", {"model": EMB, "input": "x"})
        await fake.come_up()
        assert fake.port == port
        assert (await post(s, fake.url + "/api/embed", {"model": EMB, "input": "x"}))[0] == 200
        fake.mode = "down"  # soft down: connection dropped without a response
        with pytest.raises(aiohttp.ClientError):
            await post(s, fake.url + "/api/embed", {"model": EMB, "input": "x"})
        fake.mode = "up"
        assert (await post(s, fake.url + "/api/embed", {"model": EMB, "input": "x"}))[0] == 200


def test_thread_variant():
    async def call(url: str) -> tuple[int, dict]:
        async with aiohttp.ClientSession() as s:
            return await post(s, url + "/api/chat", {"model": "llama3.2", "stream": False,
                                                     "messages": [{"role": "user", "content": "q"}]})

    with FakeOllamaThread(dim=16) as t:
        t.chat_replies.append("from thread")
        status, data = asyncio.run(call(t.url))
        assert status == 200 and data["message"]["content"] == "from thread"
        assert t.fake.chat_replies == []
        t.mode = "error"  # delegated to the wrapped FakeOllama
        assert t.fake.mode == "error"
        assert asyncio.run(call(t.url))[0] == 500
        t.mode = "up"
        port = t.port
        t.go_down()
        with pytest.raises(aiohttp.ClientError):
            asyncio.run(call(t.url))
        t.come_up()
        assert t.port == port
        status, data = asyncio.run(call(t.url))
        assert status == 200 and data["message"]["content"] == "ok"
        assert len(t.chat_requests()) == 3  # the one sent while down never arrived
        assert len(t.embed_text("abc")) == 16
