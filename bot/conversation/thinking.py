"""Asking the chat model for a reply: whole or shown while it is written, reasoning held back, and
a friendly fallback with one log line saying what to fix when the model cannot answer."""
from __future__ import annotations

import logging
from contextlib import aclosing
from typing import Callable

from bot.conversation.outlets import ReplyStream
from bot.conversation.prompt import Prompt
from bot.llm.answers import strip_thinking, visible_so_far
from bot.llm.errors import OllamaDisabled, OllamaError, OllamaModelMissing, OllamaUnavailable
from bot.llm.servers import LLMClient
from bot.settings import Settings

CANNOT_THINK = ("Sorry, I can't think right now: my language model isn't answering. "
                "Please try again in a little while.")
# Waiting does not bring a missing model back: say what does (the operator reads it too).
NO_MODEL = "Sorry, I can't think right now: my language model is not installed; pull the model: ollama pull {model}"


def no_model(model: str) -> str:
    """The reply when Ollama has no chat model `model`: how to get it, not "try again later"."""
    return NO_MODEL.format(model=model)


class Thinking:
    """The pipeline's calls to the chat model."""

    def __init__(self, ollama: LLMClient, settings: Settings, log: Callable[..., None]) -> None:
        self._ollama = ollama
        self.settings = settings
        self._log = log  # the pipeline's once-a-minute logger: (key, level, message, *args)

    async def reply(self, built: Prompt, stream: ReplyStream | None = None) -> tuple[str, bool]:
        """The model's reply and True, or CANNOT_THINK and False; shown on `stream` as written if given."""
        return await (self._whole(built) if stream is None else self._streamed(built, stream))

    async def _whole(self, built: Prompt) -> tuple[str, bool]:
        """The model's reply, or the friendly fallback (and one log line saying what to fix)."""
        try:
            raw = await self._ollama.chat(built.messages)
        except OllamaError as exc:
            return self._cannot_answer(exc)
        return self._final(raw)

    async def _streamed(self, built: Prompt, stream: ReplyStream) -> tuple[str, bool]:
        """Like `_whole`, showing the reply on `stream` as it is written (reasoning held back)."""
        raw, shown = "", ""
        try:
            async with aclosing(self._ollama.chat_stream(built.messages)) as pieces:
                async for piece in pieces:
                    raw += piece
                    visible = visible_so_far(raw)
                    if visible and visible != shown:
                        shown = visible
                        await stream.update(visible)
        except OllamaError as exc:
            return self._cannot_answer(exc)
        return self._final(raw)

    def _final(self, raw: str) -> tuple[str, bool]:
        text = strip_thinking(raw)
        if not text:
            self._log("empty", logging.WARNING, "%s returned an empty reply", self.settings.chat_model)
            return CANNOT_THINK, False
        return text, True

    def _cannot_answer(self, exc: OllamaError) -> tuple[str, bool]:
        if isinstance(exc, OllamaModelMissing):
            self._log("missing", logging.ERROR, "cannot answer: %s", exc)
            return no_model(exc.model), False
        elif isinstance(exc, OllamaDisabled):
            self._log("disabled", logging.ERROR, "cannot answer: no chat server is configured; set "
                      "OLLAMA_URL (or MUNINN_CHAT_URL) in .env (for example http://localhost:11434)")
        elif isinstance(exc, OllamaUnavailable):
            self._log("unavailable", logging.WARNING, "cannot answer: %s", exc)
        else:
            self._log("bad", logging.WARNING, "cannot answer: %s", exc)
        return CANNOT_THINK, False
