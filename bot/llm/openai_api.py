"""A client for OpenAI-compatible servers (llama-server, vLLM, LM Studio, OpenRouter, Ollama's /v1):
`/v1/chat/completions` (whole, or streamed as server-sent events), `/v1/embeddings`, `/v1/models`.

It is the Ollama client (bot/llm/ollama.py) with this API's paths, bodies and errors, so everything
else stays the same: timeouts, bounded retries, cooldowns per purpose, the reply probe, chat slots,
several hosts (`OpenAIHosts`). What differs:
- the API key (MUNINN_LLM_API_KEY) goes in an `Authorization: Bearer` header;
- structured output asks for `response_format: {"type": "json_schema"}`; a server that refuses it
  (older llama-server, some proxies) is asked with `json_object` instead, then with no format at
  all (the answer is parsed as plain text), and the client keeps to what worked;
- errors come as `{"error": {"message": ...}}`: 401/403 is a bad key, 404 a model the server does
  not have, 429 and 5xx a busy or failing server whose Retry-After sets the cooldown.
"""
from __future__ import annotations

import email.utils
import json
import logging
import time
from typing import Any, Sequence
from urllib.parse import urlsplit

from bot.llm.errors import (
    LLMAuthFailed,
    OllamaBadResponse,
    OllamaModelMissing,
    OllamaUnavailable,
)
from bot.llm.hosts import HostChoice
from bot.llm.ollama import OllamaClient
from bot.redact import HIDDEN, redact_url

log = logging.getLogger(__name__)

# How structured output is asked for, best first; a server that refuses one gets the next.
FORMAT_MODES = ("json_schema", "json_object", "plain")
_FORMAT_WORDS = ("response_format", "json_schema", "json_object", "schema", "grammar")


class FormatRefused(OllamaBadResponse):
    """The server refused the way structured output was asked for (the client asks again plainer)."""


def api_base(url: str) -> str:
    """The API's base URL: a bare server address gets `/v1` (http://host:8080 -> http://host:8080/v1);
    one with a path is taken as it is (https://openrouter.ai/api/v1)."""
    url = url.rstrip("/")
    return url if urlsplit(url).path not in ("", "/") else url + "/v1"


def retry_after(headers: Any) -> float | None:
    """The seconds a Retry-After header asks for (a number or an HTTP date), or None."""
    raw = headers.get("Retry-After") if headers is not None else None
    if not raw:
        return None
    try:
        return max(0.0, float(raw))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def error_message(text: str) -> str:
    """The message of an error body: `{"error": {"message"}}`, `{"error": "..."}`, `{"message"}`
    (older vLLM), or the start of the text."""
    try:
        data = json.loads(text) if text else {}
    except json.JSONDecodeError:
        return text[:200]
    if isinstance(data, dict):
        error = data.get("error", data)
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])[:300]
        if isinstance(error, str):
            return error[:300]
    return text[:200]


class OpenAIClient(OllamaClient):
    """The client of one OpenAI-compatible server; the `OllamaClient` API (see the module docstring).
    `key_setting` is the setting messages tell the operator to fix when the key is refused."""

    SERVER = "the OpenAI-compatible server"
    CHAT_PATH = "/chat/completions"
    EMBED_PATH = "/embeddings"
    MODELS_PATH = "/models"
    PROBE_PATH = "/models"

    def __init__(self, url: str, *, key_setting: str = "MUNINN_LLM_API_KEY", **options: Any):
        super().__init__(api_base(url) if url else "", **options)
        self.key_setting = key_setting
        self.format_mode = FORMAT_MODES[0]

    def _start_hint(self) -> str:
        return f"start the server or fix {self.url_setting}"

    # -- chat ----------------------------------------------------------------

    async def chat(self, messages: list[dict[str, str]], *, format: Any = None,
                   options: dict[str, Any] | None = None, timeout: float | None = None,
                   background: bool = False) -> str:
        """`OllamaClient.chat`; a refused structured-output format is asked again the next plainer
        way (within the same `timeout`), and the plainer way is kept for later calls."""
        timeout = timeout or self.chat_timeout
        deadline = time.monotonic() + timeout
        while True:
            asked = self.format_mode
            try:
                return await super().chat(messages, format=format, options=options, background=background,
                                          timeout=max(0.1, deadline - time.monotonic()))
            except FormatRefused as exc:
                if not self._plainer(asked, exc):
                    raise

    def _plainer(self, asked: str, exc: FormatRefused) -> bool:
        """Move on from the way `asked` to the next plainer way of asking for JSON (a call that was
        refused at the same time may have moved on already); False when there is none."""
        at = FORMAT_MODES.index(asked)
        if at + 1 >= len(FORMAT_MODES):
            return False
        if FORMAT_MODES.index(self.format_mode) > at:
            return True
        self.format_mode = FORMAT_MODES[at + 1]
        log.info("%s at %s refused structured output as %s (%s); asking with %s from now on", self.SERVER,
                 self.where, FORMAT_MODES[at], exc, self.format_mode)
        return True

    def _chat_body(self, messages: list[dict[str, str]], format: Any, options: dict[str, Any] | None, *,
                   stream: bool) -> dict[str, Any]:
        body = super()._chat_body(messages, None, None, stream=stream)
        body.update(self._sampling(options or {}))
        if format is not None and self.format_mode != "plain":
            schema = format if isinstance(format, dict) else None
            if self.format_mode == "json_schema" and schema is not None:
                body["response_format"] = {"type": "json_schema",
                                           "json_schema": {"name": "answer", "schema": schema}}
            else:  # llama-server reads a schema given with json_object; others ignore it
                body["response_format"] = {"type": "json_object", **({"schema": schema} if schema else {})}
        return body

    @staticmethod
    def _sampling(options: dict[str, Any]) -> dict[str, Any]:
        """Ollama's `options` under this API's names (the ones it has)."""
        names = {"temperature": "temperature", "top_p": "top_p", "seed": "seed", "stop": "stop",
                 "num_predict": "max_tokens"}
        return {names[key]: value for key, value in options.items() if key in names}

    def _content_of(self, data: dict) -> str:
        choices = data.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise OllamaBadResponse(f"{self.CHAT_PATH} returned no choices")
        message = choices[0].get("message")
        if not isinstance(message, dict):
            raise OllamaBadResponse(f"{self.CHAT_PATH} returned no message")
        content = message.get("content")
        if content is None:  # a refusal, or a reasoning model that spent its tokens thinking
            return ""
        if not isinstance(content, str):
            raise OllamaBadResponse(f"{self.CHAT_PATH} returned content that is not text")
        return content

    def _stream_piece(self, line: bytes) -> tuple[str, bool]:  # type: ignore[override]
        """(content, done) of one line of the server-sent event stream: `data: {chunk}` lines carry
        `choices[0].delta.content`; `data: [DONE]` or a `finish_reason` ends the answer; comment
        lines (`: ...`, keep-alives) and other fields are skipped; an error (`data: {"error"}`,
        llama-server's `error: {...}`, `event: error`, a `finish_reason` of "error") raises OllamaUnavailable."""
        text = line.decode("utf-8", "replace").strip()
        if not text or text.startswith(":"):
            return "", False
        field, _, value = text.partition(":")
        value = value.strip()
        if field == "error":
            raise OllamaUnavailable(f"{self.SERVER} failed while answering: {error_message(value)}")
        if field == "event" and value == "error":  # its data line follows; the stream is over either way
            raise OllamaUnavailable(f"{self.SERVER} failed while answering (an error event)")
        if field != "data":
            return "", False
        if value == "[DONE]":
            return "", True
        try:
            chunk = json.loads(value)
        except json.JSONDecodeError:
            raise OllamaBadResponse(f"{self.CHAT_PATH} streamed an event that is not JSON") from None
        if not isinstance(chunk, dict):
            raise OllamaBadResponse(f"{self.CHAT_PATH} streamed something that is not an object")
        if chunk.get("error"):
            raise OllamaUnavailable(f"{self.SERVER} failed while answering: {error_message(value)}")
        choices = chunk.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return "", False  # the usage chunk some servers send last
        choice = choices[0]
        delta = choice.get("delta")
        content = delta.get("content") if isinstance(delta, dict) else None
        finish = choice.get("finish_reason")
        if finish == "error":
            raise OllamaUnavailable(f"{self.SERVER} failed while answering (finish_reason error)")
        return (content if isinstance(content, str) else ""), bool(finish)

    # -- embeddings and models -----------------------------------------------

    def _embed_body(self, texts: Sequence[str]) -> dict[str, Any]:
        return {"model": self.embed_model, "input": list(texts), "encoding_format": "float"}

    def _vectors_in(self, data: dict) -> Any:
        items = data.get("data")
        if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
            return None
        try:  # the API gives each vector its input's index; order by it, not by arrival
            items = sorted(items, key=lambda item: int(item.get("index", 0)))
        except (TypeError, ValueError):
            return None
        return [item.get("embedding") for item in items]

    def _model_names_in(self, data: dict) -> list[str]:
        models = data.get("data")
        if not isinstance(models, list):
            raise OllamaBadResponse(f"{self.MODELS_PATH} returned no model list")
        return [str(m.get("id", "")) for m in models if isinstance(m, dict)]

    def missing_model(self, model: str) -> OllamaModelMissing:
        """The error that says `model` is not on this server, and which setting names it."""
        setting = "OLLAMA_CHAT_MODEL" if model == self.chat_model else "OLLAMA_EMBED_MODEL"
        return OllamaModelMissing(model, f"{self.SERVER} at {self.where} has no model {model!r}: load it there, "
                                         f"or set {setting} to a model it lists (`muninn doctor` shows them)")

    # -- errors --------------------------------------------------------------

    def _raise_for(self, status: int, text: str, path: str, body: dict | None, headers: Any = None) -> None:
        message = error_message(text)
        if self.api_key:  # some servers quote the key they refused
            message = message.replace(self.api_key, HIDDEN)
        said = f"{self.SERVER} at {self.where} answered {status} on {path}: {message}"
        asked_format = bool(body and body.get("response_format"))
        if asked_format and status in (400, 422, 500, 501) and any(w in message.lower() for w in _FORMAT_WORDS):
            raise FormatRefused(message)
        if status in (401, 403):
            raise LLMAuthFailed(f"{said}; set {self.key_setting} to a key this server accepts")
        if status == 404:
            if body and body.get("model") and "model" in message.lower():
                raise self.missing_model(str(body["model"]))
            raise OllamaBadResponse(f"{said}; is {self.url_setting} the server's OpenAI-compatible base URL "
                                    "(it often ends in /v1)?")
        if status == 429:
            raise OllamaUnavailable(f"{said} (rate limited)", retry_after(headers))
        if status >= 500 or status == 408:
            raise OllamaUnavailable(said, retry_after(headers))
        raise OllamaBadResponse(said)


class _OpenAIHost(OpenAIClient):
    """One host of several: its failures are logged by `OpenAIHosts` (see bot/llm/ollama.py's `_Host`)."""

    def _log_embed_failure(self, exc: Exception) -> None:
        pass


class OpenAIHosts(HostChoice, OpenAIClient):
    """The client API over several OpenAI-compatible hosts, each a plain client of its own; which host
    takes a call is `HostChoice`'s (bot/llm/hosts.py)."""

    def __init__(self, urls: Sequence[str], **options: Any):
        super().__init__(",".join(urls), **options)
        self._take_hosts([_OpenAIHost(url, **options) for url in urls])
        self.url = ",".join(api_base(url) for url in urls)
        self.where = redact_url(self.url)
