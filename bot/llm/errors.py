"""The LLM clients' failures (Ollama's and OpenAI-compatible servers'), and the purposes their
cooldowns are kept apart by."""
from __future__ import annotations

from typing import Literal

# What a call is for: a failure puts only calls of its own purpose on cooldown, so failed
# background work never holds up a reply.
Purpose = Literal["embed", "reply", "background"]


class OllamaError(RuntimeError):
    """Base of every LLM server failure (of either kind); the message says what to do."""


class OllamaDisabled(OllamaError):
    """No server URL is configured for the call's purpose."""


class OllamaUnavailable(OllamaError):
    """Connection refused, timed out, rate limited, or a server error. `retry_after`: the seconds the
    server asked us to wait (its Retry-After header), when it said."""

    def __init__(self, message: str, retry_after: float | None = None):
        super().__init__(message)
        self.retry_after = retry_after


class OllamaModelMissing(OllamaError):
    """The server does not have the model: it has to be pulled (Ollama) or loaded (other servers)."""

    def __init__(self, model: str, message: str | None = None):
        super().__init__(message or f"Ollama has no model {model!r}: run `ollama pull {model}`")
        self.model = model


class LLMAuthFailed(OllamaError):
    """The server refused the API key (HTTP 401 or 403): MUNINN_LLM_API_KEY is missing or wrong."""


class OllamaBadResponse(OllamaError):
    """The server answered, but not with what the API promises."""
