"""The Ollama client's failures, and the purposes its cooldowns are kept apart by."""
from __future__ import annotations

from typing import Literal

# What a call is for: a failure puts only calls of its own purpose on cooldown, so failed
# background work never holds up a reply.
Purpose = Literal["embed", "reply", "background"]


class OllamaError(RuntimeError):
    """Base of every Ollama failure; the message says what to do."""


class OllamaDisabled(OllamaError):
    """No OLLAMA_URL is configured."""


class OllamaUnavailable(OllamaError):
    """Connection refused, timed out, or a server error."""


class OllamaModelMissing(OllamaError):
    """The server does not have the model: it has to be pulled."""

    def __init__(self, model: str):
        super().__init__(f"Ollama has no model {model!r}: run `ollama pull {model}`")
        self.model = model


class OllamaBadResponse(OllamaError):
    """The server answered, but not with what the API promises."""
