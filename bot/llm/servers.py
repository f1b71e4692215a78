"""Which LLM server answers which purpose: chat (replies, fact extraction, the other structured calls)
and embeddings, each on its own kind of server (MUNINN_CHAT_KIND, MUNINN_EMBED_KIND: `ollama` or
`openai`) at its own address (MUNINN_CHAT_URL, MUNINN_EMBED_URL; empty = OLLAMA_URL).

`make_client` gives one client when both purposes go to the same place (the plain Ollama client by
default, unchanged), and a `SplitClient` when they do not: it has the same API and hands each call
to the client of its purpose, so the callers never know where a call went."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, AsyncGenerator, Protocol, Sequence

from bot.llm.errors import OllamaModelMissing, Purpose
from bot.llm.hosts import split_urls
from bot.llm.ollama import OllamaClient, OllamaHosts
from bot.llm.openai_api import OpenAIClient, OpenAIHosts

KINDS = ("ollama", "openai")


class LLMClient(Protocol):
    """What Muninn uses of an LLM client (`OllamaClient`, `OpenAIClient`, their several-host forms,
    `SplitClient`)."""

    where: str

    @property
    def enabled(self) -> bool:
        """Whether chat has a server."""

    @property
    def embeds(self) -> bool:
        """Whether embeddings have a server."""

    async def close(self) -> None:
        """Close the HTTP sessions."""

    def cooling_down(self, purpose: Purpose) -> bool:
        """Whether calls of `purpose` are in the cooldown after a failure."""

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One embedding per text, in order."""

    async def chat(self, messages: list[dict[str, str]], *, format: Any = None,
                   options: dict[str, Any] | None = None, timeout: float | None = None,
                   background: bool = False) -> str:
        """The reply text; `format` a JSON schema for structured output."""

    def chat_stream(self, messages: list[dict[str, str]], *,
                    timeout: float | None = None) -> AsyncGenerator[str, None]:
        """The reply in pieces as it is written."""

    async def __aenter__(self) -> Any: ...

    async def __aexit__(self, *exc: Any) -> None: ...


@dataclass(frozen=True)
class Server:
    """Where one purpose's calls go: the kind of server, its URL(s), the API key and the settings
    messages name."""
    kind: str
    url: str
    api_key: str
    url_setting: str
    key_setting: str


def servers(settings: Any) -> tuple[Server, Server]:
    """(chat, embeddings) as the settings configure them."""
    chat_url_setting = "MUNINN_CHAT_URL" if settings.chat_url else "OLLAMA_URL"
    embed_url_setting = "MUNINN_EMBED_URL" if settings.embed_url else "OLLAMA_URL"
    embed_key_setting = "MUNINN_EMBED_API_KEY" if settings.embed_api_key else "MUNINN_LLM_API_KEY"
    chat = Server(settings.chat_kind, settings.chat_url or settings.ollama_url,
                  settings.llm_api_key if settings.chat_kind == "openai" else "", chat_url_setting,
                  "MUNINN_LLM_API_KEY")
    embed = Server(settings.embed_kind, settings.embed_url or settings.ollama_url,
                   (settings.embed_api_key or settings.llm_api_key) if settings.embed_kind == "openai" else "",
                   embed_url_setting, embed_key_setting)
    return chat, embed


def client_for(server: Server, settings: Any) -> OllamaClient:
    """The client of one server (several comma-separated hosts get the several-host form)."""
    options: dict[str, Any] = dict(
        chat_model=settings.chat_model, embed_model=settings.embed_model, embed_timeout=settings.embed_timeout,
        chat_timeout=settings.chat_timeout, retries=settings.ollama_retries, cooldown=settings.ollama_cooldown,
        concurrency=settings.ollama_concurrency, url_setting=server.url_setting, api_key=server.api_key)
    urls = split_urls(server.url)
    if server.kind == "openai":
        options["key_setting"] = server.key_setting
        return OpenAIHosts(urls, **options) if len(urls) > 1 else OpenAIClient(server.url, **options)
    return OllamaHosts(urls, **options) if len(urls) > 1 else OllamaClient(server.url, **options)


def make_client(settings: Any) -> "OllamaClient | SplitClient":
    """The LLM client the settings ask for: one client when chat and embeddings share a server,
    a `SplitClient` when they do not."""
    chat, embed = servers(settings)
    if chat == embed or (chat.kind, chat.url, chat.api_key) == (embed.kind, embed.url, embed.api_key):
        return client_for(chat, settings)
    return SplitClient(client_for(chat, settings), client_for(embed, settings))


class SplitClient:
    """Chat on one client, embeddings on another (of the same kind or not); the client API."""

    def __init__(self, chat: OllamaClient, embed: OllamaClient):
        self.chat_client, self.embed_client = chat, embed
        self.where = f"chat {chat.where}, embeddings {embed.where}"

    @property
    def enabled(self) -> bool:
        """Whether chat has a server (embeddings without one raise OllamaDisabled)."""
        return self.chat_client.enabled

    @property
    def embeds(self) -> bool:
        """Whether embeddings have a server."""
        return self.embed_client.enabled

    @property
    def parts(self) -> list[tuple[OllamaClient, tuple[str, ...]]]:
        """Each client with the purposes it serves."""
        return [(self.chat_client, ("chat",)), (self.embed_client, ("embed",))]

    async def close(self) -> None:
        """Close both clients."""
        await self.chat_client.close()
        await self.embed_client.close()

    async def __aenter__(self) -> "SplitClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    def cooling_down(self, purpose: Purpose) -> bool:
        """Whether the purpose's client is cooling down for it."""
        return (self.embed_client if purpose == "embed" else self.chat_client).cooling_down(purpose)

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One embedding per text, from the embedding server."""
        return await self.embed_client.embed(texts)

    async def chat(self, messages: list[dict[str, str]], *, format: Any = None,
                   options: dict[str, Any] | None = None, timeout: float | None = None,
                   background: bool = False) -> str:
        """The reply text, from the chat server."""
        return await self.chat_client.chat(messages, format=format, options=options, timeout=timeout,
                                           background=background)

    def chat_stream(self, messages: list[dict[str, str]], *,
                    timeout: float | None = None) -> AsyncGenerator[str, None]:
        """The reply in pieces, from the chat server."""
        return self.chat_client.chat_stream(messages, timeout=timeout)


def parts_of(client: LLMClient) -> list[tuple[OllamaClient, tuple[str, ...]]]:
    """Each server's client with the purposes it serves ("chat", "embed")."""
    if isinstance(client, SplitClient):
        return client.parts
    assert isinstance(client, OllamaClient)
    return [(client, ("chat", "embed"))]


async def missing_models(client: LLMClient, chat_model: str, embed_model: str) -> list[OllamaModelMissing]:
    """The models a server lacks for the purposes it serves, each as the error saying what to do;
    raises OllamaError when a server cannot say."""
    missing: list[OllamaModelMissing] = []
    for part, purposes in parts_of(client):
        wanted = [model for purpose, model in (("chat", chat_model), ("embed", embed_model)) if purpose in purposes]
        for model in dict.fromkeys(wanted):
            if not await part.has_model(model):
                missing.append(part.missing_model(model))
    return missing


def server_name(client: LLMClient) -> str:
    """How log lines name the server(s) of `client`: "Ollama", "the OpenAI-compatible server", or
    "the LLM servers" when chat and embeddings go to different ones."""
    parts = parts_of(client)
    return parts[0][0].SERVER if len(parts) == 1 else "the LLM servers"
