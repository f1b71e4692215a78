"""Embeddings for the engine: the question's vector, and texts' vectors or why there are none
(the vector_status of a recall). Ollama may be away, lack the model or answer nonsense: each is
logged once a minute and recall goes on with keywords (a part of Engine)."""
from __future__ import annotations

import logging

from bot.llm.ollama import (
    OllamaBadResponse,
    OllamaDisabled,
    OllamaError,
    OllamaModelMissing,
    OllamaUnavailable,
)
from bot.llm.servers import LLMClient
from bot.logs import Throttle
from bot.memory.recall.retrieval import VectorStatus

log = logging.getLogger("bot.memory.engine")  # the engine's lines, as before


class Embedding:
    """Engine's embedding calls (mixed into bot/memory/engine.py's Engine)."""

    ollama: LLMClient
    _throttle: Throttle

    async def _query_vector(self, query: str) -> tuple[list[float] | None, VectorStatus]:
        if not self.ollama.embeds:
            return None, VectorStatus.DISABLED
        if not any(ch.isalnum() for ch in query):
            return None, VectorStatus.EMPTY_QUERY
        vecs, status = await self.embed_with_status([query])
        return (vecs[0] if vecs else None), status

    async def embed_or_none(self, texts: list[str]) -> list[list[float]] | None:
        """Embeddings, or None when Ollama cannot give them (the reason is logged)."""
        return (await self.embed_with_status(texts))[0]

    async def embed_with_status(self, texts: list[str]) -> tuple[list[list[float]] | None, VectorStatus]:
        """(embeddings, OK), or (None, why not) — the vector_status values of RecallResult."""
        if not texts or not self.ollama.embeds:
            return None, VectorStatus.DISABLED
        try:
            return await self.ollama.embed(texts), VectorStatus.OK
        except OllamaDisabled:
            status = VectorStatus.DISABLED
        except OllamaModelMissing as exc:
            self._warn_once("missing", str(exc))
            status = VectorStatus.MODEL_MISSING
        except OllamaUnavailable:
            status = VectorStatus.UNREACHABLE  # the client has logged it, once per cooldown
        except OllamaBadResponse as exc:
            self._warn_once("bad", f"{exc}; recall uses keywords only")
            status = VectorStatus.BAD_RESPONSE
        except OllamaError as exc:  # pragma: no cover - future subclasses
            self._warn_once("other", str(exc))
            status = VectorStatus.UNREACHABLE
        return None, status

    def _warn_once(self, key: str, message: str, every: float = 60.0) -> None:
        if self._throttle.ready(key, every):
            log.warning(message)
