"""`muninn doctor`'s LLM checks: every chat and embedding server reachable, with its models, and
advice in the words of its kind (`ollama pull` for Ollama; load the model, fix the base URL or the
API key for an OpenAI-compatible server)."""
from __future__ import annotations

from dataclasses import replace

from bot.cli.checks import Check
from bot.llm.errors import LLMAuthFailed, OllamaError
from bot.llm.hosts import split_urls
from bot.llm.servers import Server, client_for, make_client, servers
from bot.redact import redact_url
from bot.settings import Settings

EXAMPLE_URL = {"ollama": "http://localhost:11434", "openai": "http://localhost:8080/v1"}
ROLES = {"chat": ("chat model", "chat_model", "OLLAMA_CHAT_MODEL"),
         "embed": ("embedding model", "embed_model", "OLLAMA_EMBED_MODEL")}


async def llm_checks(settings: Settings) -> list[Check]:
    """The checks of every server the settings name, each host of each."""
    chat, embed = servers(settings)
    shared = (chat.kind, chat.url, chat.api_key) == (embed.kind, embed.url, embed.api_key)
    groups = [(chat, ("chat", "embed"))] if shared else [(chat, ("chat",)), (embed, ("embed",))]
    checks: list[Check] = []
    for server, purposes in groups:
        label = server.kind if shared else f"{server.kind} {'chat' if purposes == ('chat',) else 'embeddings'}"
        if not server.url:
            checks.append(Check(label, False, f"{server.url_setting} is empty: {_without(purposes)}",
                                f"set {server.url_setting}={EXAMPLE_URL[server.kind]} in .env"))
            continue
        urls = split_urls(server.url)
        for url in urls:  # every host: a call may go to any of them
            suffix = "" if len(urls) == 1 else f" {redact_url(url)}"
            checks += await host_checks(settings, replace(server, url=url), purposes, label, suffix)
    return checks


def _without(purposes: tuple[str, ...]) -> str:
    said = {"chat": "Muninn cannot chat", "embed": "recall is keyword-only"}
    return " and ".join(said[p] for p in reversed(purposes))


async def host_checks(settings: Settings, server: Server, purposes: tuple[str, ...], label: str,
                      suffix: str) -> list[Check]:
    """Reachable, and the models of its purposes there, for one host (`suffix` names it among several)."""
    async with client_for(server, settings) as client:
        try:
            names = await client.model_names()
        except OllamaError as exc:
            return [Check(label + suffix, False, str(exc), _unreachable_fix(server, exc))]
        checks = [Check(label + suffix, True, f"reachable at {redact_url(server.url)}")]
        for purpose in purposes:
            role, key, setting = ROLES[purpose]
            model = getattr(settings, key)
            wanted = {model, f"{model}:latest"}
            present = any(name in wanted for name in names)
            if server.kind == "ollama":
                detail = f"{model} {'is' if present else 'is not'} pulled"
                fix = f"ollama pull {model}" + (f" (on{suffix})" if suffix else "")
            else:
                listed = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "") or "none"
                detail = f"{model} {'is' if present else 'is not'} among the server's models ({listed})"
                fix = f"load {model} on the server, or set {setting} to a model it lists"
            checks.append(Check(role + suffix, present, detail, "" if present else fix))
    return checks


def _unreachable_fix(server: Server, exc: OllamaError) -> str:
    if isinstance(exc, LLMAuthFailed):
        return f"set {server.key_setting} to a key the server accepts"
    if server.kind == "ollama":
        return f"start Ollama with `ollama serve`, or fix {server.url_setting}"
    return (f"start the server, or fix {server.url_setting}: the server's OpenAI-compatible base URL, "
            "such as http://localhost:8080/v1")


async def embedding_size(settings: Settings, checks: list[Check]) -> int | None:
    """The size of the embedding server's vectors (one embedding asked), when `checks` found it with
    its model; None otherwise, or when it does not answer."""
    found = [check.ok for check in checks if check.name.startswith("embedding model")]
    if not found or not all(found):
        return None
    async with make_client(settings) as client:
        try:
            [vector] = await client.embed(["muninn doctor"])
        except (OllamaError, ValueError):
            return None
    return len(vector)
