"""A local stand-in for an OpenAI-compatible server (llama-server, vLLM, LM Studio, OpenRouter) that
speaks the real wire format on 127.0.0.1.

``FakeOpenAI`` serves ``GET /v1/models``, ``POST /v1/chat/completions`` (a whole
``chat.completion``, or ``chat.completion.chunk`` server-sent events ending in ``data: [DONE]``,
with a keep-alive comment first as OpenRouter sends) and ``POST /v1/embeddings``. Errors have the
API's shape, ``{"error": {"message", "type", "param", "code"}}``: 401 for a missing or wrong API key
(``api_key``), 404 for an unknown model, 429 with Retry-After (``RATE_LIMITED``), 500.

It is a ``FakeOllama`` (tests/fakes/ollama.py) with these routes instead, so the same scripted
behaviour applies: ``chat_replies``, ``default_chat_reply`` (called with the request body),
``mode``, ``delay``, ``missing``, ``vectors``, ``wrong_dim``, ``stream_delay``, ``stream_pieces``,
``stream_fail_after`` (a mid-stream ``data: {"error": ...}`` event, as vLLM sends). Structured
output: ``response_format`` of type ``json_schema`` (checked for its ``name`` and ``schema``) or
``json_object``; ``refuse_formats`` lists the types this server refuses, as older llama-server
refuses ``json_schema``.
"""
from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from aiohttp import web

from tests.fakes.ollama import FakeOllama, FakeOllamaThread


def _error(status: int, message: str, kind: str = "invalid_request_error", code: str | None = None,
           headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind, "param": None, "code": code}},
                             status=status, headers=headers)


class FakeOpenAI(FakeOllama):
    """Async fake OpenAI-compatible server; also an async context manager."""

    RATE_LIMITED = "<<fake-openai:429>>"  # chat_replies sentinel: answer 429 with Retry-After once
    CHAT = "/v1/chat/completions"
    EMBED = "/v1/embeddings"
    MODELS = "/v1/models"

    def __init__(self, models: list[str] | None = None, dim: int = 768, api_key: str = "",
                 host: str = "127.0.0.1", port: int = 0) -> None:
        self.api_key = api_key
        super().__init__(models=models, dim=dim, host=host, port=port)

    def reset(self) -> None:
        """Back to a healthy server that accepts every format, with no scripted replies and no history."""
        super().reset()
        self.refuse_formats: set[str] = set()
        self.refuse_status = 400
        self.retry_after = 1
        self.shuffle_embeddings = False  # answer the vectors in reverse order (their indexes say which)

    @property
    def base_url(self) -> str:
        """The API's base URL, as operators configure it."""
        return self.url + "/v1"

    async def start(self) -> "FakeOpenAI":
        app = web.Application(middlewares=[self._openai_middleware])
        app.router.add_get(self.MODELS, self._models)
        app.router.add_post(self.CHAT, self._chat_completions)
        app.router.add_post(self.EMBED, self._embeddings_v1)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1, handler_cancellation=True)
        await self._runner.setup()
        await self.come_up()
        return self

    def chat_requests(self) -> list[dict]:
        return [body for path, body in self.requests if path == self.CHAT]

    def embed_requests(self) -> list[dict]:
        return [body for path, body in self.requests if path == self.EMBED]

    @staticmethod
    def _default_reply(req: dict) -> str:
        return "{}" if req.get("response_format") else "ok"

    # ---------------------------------------------------------- middleware
    @web.middleware
    async def _openai_middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        body, down = await self._record(request)
        if down is not None:
            return down
        if self.api_key and request.headers.get("Authorization") != f"Bearer {self.api_key}":
            given = request.headers.get("Authorization", "").removeprefix("Bearer ")
            return _error(401, f"Incorrect API key provided: {given}. You can find your API key at your provider.",
                          code="invalid_api_key")  # the key quoted back whole: the worst a server may do
        if self.mode == "error":
            return _error(500, "fake openai: simulated server error", "server_error")
        if self.mode == "slow":
            await asyncio.sleep(self.delay)
        if not isinstance(body, dict) or "_invalid" in body:
            return _error(400, "We could not parse the JSON body of your request.")
        return await handler(request)

    def _unknown_model(self, body: dict) -> web.Response | None:
        name = body.get("model")
        if not name or not isinstance(name, str):
            return _error(400, "you must provide a model parameter")
        if not self.has_model(name):
            return _error(404, f"The model `{name}` does not exist or you do not have access to it.",
                          code="model_not_found")
        return None

    # ------------------------------------------------------------ handlers
    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": m, "object": "model", "created": 1_700_000_000, "owned_by": "fake"}
            for m in self.models if self.has_model(m)]})

    async def _embeddings_v1(self, request: web.Request) -> web.Response:
        body = await request.json()
        if (bad := self._unknown_model(body)) is not None:
            return bad
        inp = body.get("input")
        texts = [inp] if isinstance(inp, str) else inp
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
            return _error(400, "'input' must be a string or a non-empty array of strings")
        if self.embed_garbage:
            return web.Response(text='{"object": "list", "data": [{"embedding": [0.1,', content_type="application/json")
        items = [{"object": "embedding", "index": i, "embedding": vec} for i, vec in enumerate(self._vectors(texts))]
        if self.shuffle_embeddings:
            items.reverse()
        tokens = sum(len(self.tokens(t)) for t in texts)
        return web.json_response({"object": "list", "data": items, "model": body["model"],
                                  "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})

    def _format_problem(self, body: dict) -> web.Response | None:
        """A 400 for a malformed `response_format`, or the refusal of a type this server does not take."""
        fmt = body.get("response_format")
        if fmt is None:
            return None
        kind = fmt.get("type") if isinstance(fmt, dict) else None
        if kind in self.refuse_formats:
            return _error(self.refuse_status, f'response_format type must be one of "text" or "json_object", '
                                              f"but got: {kind}")
        if kind == "json_schema":
            spec = fmt.get("json_schema")
            if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict) or not spec.get("name"):
                return _error(400, "response_format.json_schema needs a name and a schema")
        elif kind not in ("json_object", "text"):
            return _error(400, f"Invalid value for 'response_format.type': {kind!r}")
        return None

    async def _chat_completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if (bad := self._unknown_model(body) or self._format_problem(body)) is not None:
            return bad
        if not isinstance(body.get("messages"), list) or not body["messages"]:
            return _error(400, "'messages' must be a non-empty array")
        if self.chat_replies and self.chat_replies[0] == self.RATE_LIMITED:
            self.chat_replies.pop(0)
            return _error(429, "Rate limit reached for requests", "requests", "rate_limit_exceeded",
                          headers={"Retry-After": str(self.retry_after)})
        reply = await self._next_reply(body)
        if isinstance(reply, web.Response):  # the Ollama-shaped failure: said again in this API's words
            return _error(reply.status, "fake openai: scripted chat failure", "server_error")
        ident, created, model = f"chatcmpl-{len(self.requests)}", int(time.time()), body["model"]
        if not body.get("stream"):
            return web.json_response({
                "id": ident, "object": "chat.completion", "created": created, "model": model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": reply},
                             "logprobs": None, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 10, "completion_tokens": max(1, len(reply.split())),
                          "total_tokens": 10 + max(1, len(reply.split()))}})

        def event(delta: dict, finish: str | None = None) -> bytes:
            chunk = {"id": ident, "object": "chat.completion.chunk", "created": created, "model": model,
                     "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
            return f"data: {json.dumps(chunk)}\n\n".encode()

        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        await resp.write(b": OPENAI-COMPATIBLE FAKE PROCESSING\n\n")
        await resp.write(event({"role": "assistant", "content": ""}))
        pieces = self._pieces(reply)
        for number, piece in enumerate(pieces):
            if number == self.stream_fail_after:  # what vLLM sends when generation fails mid-answer
                error = {"error": {"object": "error", "message": "fake openai: the engine died mid-answer",
                                   "type": "InternalServerError", "code": 500}}
                await resp.write(f"data: {json.dumps(error)}\n\n".encode())
                await resp.write(b"data: [DONE]\n\n")
                await resp.write_eof()
                return resp
            if self.stream_delay:
                await asyncio.sleep(self.stream_delay)
            await resp.write(event({"content": piece}))
        await resp.write(event({}, "stop"))
        if (body.get("stream_options") or {}).get("include_usage"):
            usage = {"id": ident, "object": "chat.completion.chunk", "created": created, "model": model,
                     "choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": len(pieces),
                                              "total_tokens": 10 + len(pieces)}}
            await resp.write(f"data: {json.dumps(usage)}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


class FakeOpenAIThread(FakeOllamaThread):
    """``FakeOpenAI`` running on its own event loop in a daemon thread (see ``FakeOllamaThread``)."""

    RATE_LIMITED = FakeOpenAI.RATE_LIMITED

    def __init__(self, **kwargs: Any) -> None:
        object.__setattr__(self, "fake", FakeOpenAI(**kwargs))
        object.__setattr__(self, "_loop", None)
        object.__setattr__(self, "_thread", None)
