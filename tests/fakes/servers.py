"""The LLM servers a conversation test runs against, by setup: both purposes on the fake Ollama, both
on the fake OpenAI-compatible server (with an API key), or chat on the OpenAI one and embeddings on
Ollama. A test module runs its tests over every setup by overriding two fixtures (see
tests/scenarios/test_bot_wire.py):

    @pytest.fixture
    def fake_ollama(llm):                     # the chat server the tests script
        return llm.chat

    @pytest.fixture
    def make_settings(make_settings, llm):    # settings pointing at the setup's servers
        return llm.settings_maker(make_settings)
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable

from tests.fakes.ollama import FakeOllama
from tests.fakes.openai import FakeOpenAI

SETUPS = ("ollama", "openai", "openai-chat+ollama-embed")
API_KEY = "sk-muninn-tests"


@dataclass
class LLMServers:
    """The fakes of one setup: `chat` (scripted by the tests), `embed` (the same one, or another)."""
    setup: str
    chat: FakeOllama
    embed: FakeOllama
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def env(self) -> dict[str, str]:
        """The environment that points Muninn at these servers (OLLAMA_URL included)."""
        if self.setup == "ollama":
            return {"OLLAMA_URL": self.chat.url}
        if self.setup == "openai":
            return {"OLLAMA_URL": self.chat.url, "MUNINN_CHAT_KIND": "openai", "MUNINN_EMBED_KIND": "openai",
                    "MUNINN_LLM_API_KEY": API_KEY}
        return {"OLLAMA_URL": self.embed.url, "MUNINN_CHAT_KIND": "openai",
                "MUNINN_CHAT_URL": self.chat.url + "/v1", "MUNINN_LLM_API_KEY": API_KEY}

    @property
    def fakes(self) -> list[FakeOllama]:
        """Each server once."""
        return [self.chat] if self.embed is self.chat else [self.chat, self.embed]

    @property
    def started_line(self) -> str:
        """How the start-up line that both models are there begins."""
        return {"ollama": "Ollama at ", "openai": "the OpenAI-compatible server at "}.get(
            self.setup, "the LLM servers at ")

    def model_list_requests(self) -> int:
        """Requests for the list of models, over every server."""
        return sum(path in ("/api/tags", "/v1/models") for fake in self.fakes for path, _ in fake.requests)

    def settings_maker(self, make_settings: Callable[..., Any]) -> Callable[..., Any]:
        """`make_settings` that, given the chat server's URL, points at this setup's servers."""
        def make(url: str = "", **env: Any) -> Any:
            return make_settings(url, **({**self.env, **env} if url == self.chat.url else env))
        return make


@contextlib.asynccontextmanager
async def llm_servers(setup: str) -> AsyncIterator[LLMServers]:
    """The running fakes of `setup` (one of SETUPS)."""
    async with contextlib.AsyncExitStack() as stack:
        if setup == "ollama":
            chat = await stack.enter_async_context(FakeOllama())
            yield LLMServers(setup, chat, chat)
        elif setup == "openai":
            chat = await stack.enter_async_context(FakeOpenAI(api_key=API_KEY))
            yield LLMServers(setup, chat, chat)
        else:
            chat = await stack.enter_async_context(FakeOpenAI(api_key=API_KEY))
            embed = await stack.enter_async_context(FakeOllama())
            yield LLMServers(setup, chat, embed)
