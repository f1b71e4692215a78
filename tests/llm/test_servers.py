"""Which server answers which purpose (bot/llm/servers.py), the settings that say so, and
`muninn doctor`'s checks of each kind (bot/cli/llm_doctor.py)."""
from __future__ import annotations

import pytest

from bot.cli.doctor import ollama_checks, run_doctor
from bot.llm.errors import OllamaUnavailable
from bot.llm.ollama import OllamaClient, OllamaHosts
from bot.llm.openai_api import OpenAIClient, OpenAIHosts
from bot.llm.servers import SplitClient, make_client, missing_models, server_name
from bot.memory.engine import Engine
from bot.memory.records import NewMemory
from bot.settings import SettingsError
from tests.fakes.openai import FakeOpenAI
from tests.postgres_server import free_port

HI = [{"role": "user", "content": "hi"}]


@pytest.fixture
async def fake_openai():
    async with FakeOpenAI(api_key="sk-right") as fake:
        yield fake


def test_ollama_stays_the_default_and_unchanged(make_settings):
    client = make_client(make_settings("http://gpu1:11434"))
    assert type(client) is OllamaClient and client.url_setting == "OLLAMA_URL" and client.api_key == ""
    assert type(make_client(make_settings("http://a:1,http://b:2"))) is OllamaHosts
    # The key is only ever sent to OpenAI-compatible servers.
    assert make_client(make_settings("http://gpu1:11434", MUNINN_LLM_API_KEY="sk-x")).api_key == ""


def test_the_kinds_and_urls_per_purpose(make_settings):
    both = make_client(make_settings("http://vllm:8000", MUNINN_CHAT_KIND="openai", MUNINN_EMBED_KIND="openai",
                                     MUNINN_LLM_API_KEY="sk-x"))
    assert type(both) is OpenAIClient and both.url == "http://vllm:8000/v1" and both.api_key == "sk-x"
    split = make_client(make_settings("http://ollama:11434", MUNINN_CHAT_KIND="openai",
                                      MUNINN_CHAT_URL="http://vllm:8000/v1,http://vllm2:8000/v1",
                                      MUNINN_LLM_API_KEY="sk-x"))
    assert isinstance(split, SplitClient) and server_name(split) == "the LLM servers"
    assert type(split.chat_client) is OpenAIHosts and split.chat_client.url_setting == "MUNINN_CHAT_URL"
    assert type(split.embed_client) is OllamaClient and split.embed_client.api_key == ""
    assert split.where == "chat http://vllm:8000/v1,http://vllm2:8000/v1, embeddings http://ollama:11434"
    keys = make_client(make_settings("", MUNINN_CHAT_KIND="openai", MUNINN_EMBED_KIND="openai",
                                     MUNINN_CHAT_URL="https://openrouter.ai/api/v1", MUNINN_EMBED_URL="http://emb",
                                     MUNINN_LLM_API_KEY="sk-router", MUNINN_EMBED_API_KEY="sk-emb"))
    assert isinstance(keys, SplitClient)
    assert (keys.chat_client.api_key, keys.embed_client.api_key) == ("sk-router", "sk-emb")
    assert keys.embed_client.key_setting == "MUNINN_EMBED_API_KEY"
    # Chat's own URL equal to OLLAMA_URL is still one server.
    same = make_settings("http://ollama:11434", MUNINN_CHAT_URL="http://ollama:11434")
    assert type(make_client(same)) is OllamaClient


def test_bad_kinds_are_one_line(make_settings):
    with pytest.raises(SettingsError, match="MUNINN_CHAT_KIND='vllm' must be ollama or openai"):
        make_settings("", MUNINN_CHAT_KIND="vllm")
    with pytest.raises(SettingsError, match="MUNINN_EMBED_URL"):
        make_settings("", MUNINN_EMBED_URL="ftp://x")


async def test_chat_and_embeddings_on_different_kinds_of_server(fake_ollama, fake_openai, make_settings):
    fake_openai.chat_replies.append("from the OpenAI-compatible server")
    settings = make_settings(fake_ollama.url, MUNINN_CHAT_KIND="openai", MUNINN_CHAT_URL=fake_openai.base_url,
                             MUNINN_LLM_API_KEY="sk-right")
    async with make_client(settings) as client:
        assert await client.chat(HI) == "from the OpenAI-compatible server"
        assert "".join([p async for p in client.chat_stream(HI)]) == "ok"
        assert await client.embed(["a memory"]) == [fake_ollama.embed_text("a memory")]
        assert client.enabled and client.embeds and not client.cooling_down("embed")
        assert await missing_models(client, "llama3.2", "nomic-embed-text") == []
        fake_ollama.missing = {"nomic-embed-text"}
        [missing] = await missing_models(client, "llama3.2", "nomic-embed-text")
        assert str(missing) == "Ollama has no model 'nomic-embed-text': run `ollama pull nomic-embed-text`"
    assert len(fake_openai.chat_requests()) == 2 and not fake_openai.embed_requests()
    assert len(fake_ollama.embed_requests()) == 1 and not fake_ollama.chat_requests()


async def test_chat_on_ollama_and_embeddings_on_an_openai_server_with_its_own_key(fake_ollama, make_settings):
    async with FakeOpenAI(api_key="sk-embeddings") as embedder:
        settings = make_settings(fake_ollama.url, MUNINN_EMBED_KIND="openai", MUNINN_EMBED_URL=embedder.base_url,
                                 MUNINN_LLM_API_KEY="sk-chat", MUNINN_EMBED_API_KEY="sk-embeddings")
        async with make_client(settings) as client:
            assert isinstance(client, SplitClient) and client.chat_client.api_key == ""  # Ollama gets no key
            assert await client.chat(HI, format={"type": "object"}) == "{}"
            assert await client.embed(["a memory"]) == [embedder.embed_text("a memory")]
            embedder.mode = "error"
            with pytest.raises(OllamaUnavailable):
                await client.embed(["a memory"])
            assert not client.cooling_down("reply")
            assert await client.chat(HI) == "ok"                   # chat is not held up by the embedder
    assert fake_ollama.chat_requests()[0]["format"] == {"type": "object"} and not fake_ollama.embed_requests()


async def test_embeddings_without_a_server_leave_chat_working(fake_openai, make_settings):
    settings = make_settings("", MUNINN_CHAT_KIND="openai", MUNINN_CHAT_URL=fake_openai.base_url,
                             MUNINN_LLM_API_KEY="sk-right")
    async with make_client(settings) as client:
        assert client.enabled and not client.embeds
        assert await client.chat(HI) == "ok"


async def test_doctor_speaks_each_kind(fake_ollama, fake_openai, make_settings):
    fake_openai.missing = {"llama3.2"}
    settings = make_settings(fake_ollama.url, MUNINN_CHAT_KIND="openai", MUNINN_CHAT_URL=fake_openai.base_url,
                             MUNINN_LLM_API_KEY="sk-right")
    checks = {c.name: c for c in await ollama_checks(settings)}
    assert list(checks) == ["openai chat", "chat model", "ollama embeddings", "embedding model"]
    assert checks["openai chat"].ok and checks["ollama embeddings"].ok and checks["embedding model"].ok
    chat = checks["chat model"]
    assert not chat.ok and "nomic-embed-text" in chat.detail
    assert chat.fix == "load llama3.2 on the server, or set OLLAMA_CHAT_MODEL to a model it lists"

    wrong_key = settings.replace(llm_api_key="sk-wrong")
    [refused, _, _] = await ollama_checks(wrong_key)
    assert not refused.ok and refused.fix == "set MUNINN_LLM_API_KEY to a key the server accepts"

    dead = settings.replace(chat_url=f"http://127.0.0.1:{free_port()}", embed_url="", ollama_url="")
    [down, no_embeddings] = await ollama_checks(dead)
    assert not down.ok and "OpenAI-compatible base URL" in down.fix and "MUNINN_CHAT_URL" in down.fix
    assert not no_embeddings.ok and no_embeddings.detail == "OLLAMA_URL is empty: recall is keyword-only"


async def test_doctor_for_the_default_ollama_is_as_before(fake_ollama, make_settings):
    fake_ollama.missing = {"llama3.2"}
    checks = await ollama_checks(make_settings(fake_ollama.url))
    assert [(c.name, c.ok, c.fix) for c in checks] == [
        ("ollama", True, ""), ("chat model", False, "ollama pull llama3.2"), ("embedding model", True, "")]
    [empty] = await ollama_checks(make_settings(""))
    assert empty.detail == "OLLAMA_URL is empty: recall is keyword-only and Muninn cannot chat"


async def test_doctor_compares_the_embedding_servers_size_with_the_index(fake_ollama, make_settings):
    settings = make_settings(fake_ollama.url)
    async with Engine(settings) as engine:
        await engine.remember(NewMemory("the GPU server has 4x RTX 3090", "global"))
    assert next(c for c in await run_doctor(settings) if c.name == "vector index").ok
    async with FakeOpenAI(dim=384) as smaller:                  # the same model name, another size
        moved = make_settings(fake_ollama.url, MUNINN_EMBED_KIND="openai", MUNINN_EMBED_URL=smaller.base_url)
        index = next(c for c in await run_doctor(moved) if c.name == "vector index")
    assert not index.ok and "768-dimensional" in index.detail and "returns 384-dimensional" in index.detail
    assert index.fix.startswith("muninn reindex")
