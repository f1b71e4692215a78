"""A local stand-in for an Ollama server that speaks its real HTTP protocol.

``FakeOllama`` is an aiohttp app on 127.0.0.1 (random free port) serving
``/api/embed``, ``/api/embeddings``, ``/api/chat``, ``/api/generate``,
``/api/tags``, ``/api/version`` and ``/``.  Behaviour is driven by plain
attributes (``mode``, ``delay``, ``wrong_dim``, ``missing``, ``chat_replies``...)
that tests may change at any time.  ``FakeOllamaThread`` runs the same thing in
a background thread for synchronous code (CLI tests, ``asyncio.run``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import math
import random
import re
import threading
from datetime import datetime, timezone
from functools import lru_cache
from typing import Any

from aiohttp import web

_TOKEN_RE = re.compile(r"\W+")
_NS = 1_000_000  # fake durations, in nanoseconds


def _norm_model(name: str) -> str:
    """``llama3.2`` and ``llama3.2:latest`` are the same model."""
    return name if ":" in name else f"{name}:latest"


@lru_cache(maxsize=65536)
def _token_vector(token: str, dim: int) -> tuple[float, ...]:
    """Deterministic pseudo-random unit vector for one token."""
    seed = int.from_bytes(hashlib.sha256(token.encode()).digest()[:8], "big")
    rng = random.Random(seed)
    vec = [rng.gauss(0.0, 1.0) for _ in range(dim)]
    n = math.sqrt(sum(x * x for x in vec)) or 1.0
    return tuple(x / n for x in vec)


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _err(status: int, msg: str) -> web.Response:
    return web.json_response({"error": msg}, status=status)


class FakeOllama:
    """Async fake Ollama server; also an async context manager."""

    HTTP_500 = "<<fake-ollama:http-500>>"  # chat_replies sentinel: answer 500 once
    TIMEOUT = "<<fake-ollama:timeout>>"  # chat_replies sentinel: sleep `delay` first

    def __init__(self, models: list[str] | None = None, dim: int = 768,
                 host: str = "127.0.0.1", port: int = 0) -> None:
        self.models = list(models or ["nomic-embed-text", "llama3.2"])
        self.dim = dim
        self.host, self.port = host, port
        self.version = "0.6.5"
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self.reset()

    def reset(self) -> None:
        """Back to a healthy server with no scripted replies and no history."""
        self.mode = "up"  # "up" | "error" | "slow" | "down"
        self.delay = 1.0
        self.wrong_dim: int | None = None
        self.missing: set[str] = set()
        self.embed_garbage = False
        self.synonyms: dict[str, str] = {}
        self.vectors: dict[str, list[float]] = {}
        self.chat_replies: list[Any] = []
        self.default_chat_reply: Any = self._default_reply
        self.requests: list[tuple[str, dict]] = []
        self.stream_delay = 0.0  # seconds between two streamed pieces (a model writing slowly)
        self.stream_pieces: int | None = None  # stream in this many pieces instead of word by word
        self.stream_fail_after: int | None = None  # send an error line after this many pieces

    # ----------------------------------------------------------- lifecycle
    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> "FakeOllama":
        app = web.Application(middlewares=[self._middleware])
        app.router.add_get("/", self._root)
        app.router.add_get("/api/version", self._version)
        app.router.add_get("/api/tags", self._tags)
        app.router.add_post("/api/embed", self._embed)
        app.router.add_post("/api/embeddings", self._embeddings)
        app.router.add_post("/api/chat", self._chat)
        app.router.add_post("/api/generate", self._generate)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1,
                                     handler_cancellation=True)
        await self._runner.setup()
        await self.come_up()
        return self

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        self._runner = self._site = None

    async def go_down(self) -> None:
        """Close the listening port and drop open connections (connection refused)."""
        if self._site is not None:
            await self._site.stop()
            self._site = None
        server = self._runner.server if self._runner else None
        for handler in (server.connections if server else []):
            if handler.transport is not None:
                handler.transport.abort()

    async def come_up(self) -> None:
        """(Re)open the listening socket on the same port."""
        if self._site is None:
            self._site = web.TCPSite(self._runner, self.host, self.port)
            await self._site.start()
            self.port = self._site._server.sockets[0].getsockname()[1]

    async def __aenter__(self) -> "FakeOllama":
        return await self.start()

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop()

    # ------------------------------------------------------------- helpers
    def chat_requests(self) -> list[dict]:
        return [body for path, body in self.requests if path == "/api/chat"]

    def embed_requests(self) -> list[dict]:
        return [body for path, body in self.requests if path in ("/api/embed", "/api/embeddings")]

    def tokens(self, text: str) -> list[str]:
        """Lowercased word tokens after applying ``synonyms``."""
        return [self.synonyms.get(t, t) for t in _TOKEN_RE.split(text.lower()) if t]

    def embed_text(self, text: str, dim: int | None = None) -> list[float]:
        """The (unit) vector this server returns for ``text``."""
        if text in self.vectors:
            return list(self.vectors[text])
        dim = dim or self.dim
        toks = self.tokens(text)
        if not toks:
            return [1.0] + [0.0] * (dim - 1)
        acc = [0.0] * dim
        for tok in toks:
            for i, x in enumerate(_token_vector(tok, dim)):
                acc[i] += x
        n = math.sqrt(sum(x * x for x in acc)) or 1.0
        return [x / n for x in acc]

    def has_model(self, name: str) -> bool:
        name = _norm_model(name)
        return (name in {_norm_model(m) for m in self.models}
                and name not in {_norm_model(m) for m in self.missing})

    @staticmethod
    def _default_reply(req: dict) -> str:
        return "{}" if req.get("format") else "ok"

    # ---------------------------------------------------------- middleware
    async def _record(self, request: web.Request) -> tuple[Any, web.Response | None]:
        """Record the request and return its JSON body (or what it sent instead); in "down" mode
        also a response, after dropping the connection (it never reaches the client)."""
        body: Any = {}
        if request.method == "POST":
            raw = await request.read()
            try:
                body = json.loads(raw or b"null")
            except ValueError:
                body = {"_invalid": raw.decode(errors="replace")}
        self.requests.append((request.path, body))
        if self.mode == "down":
            if request.transport is not None:
                request.transport.abort()
            return body, web.Response(status=503)
        return body, None

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        body, down = await self._record(request)
        if down is not None:
            return down
        if self.mode == "error":
            return _err(500, "fake ollama: simulated server error")
        if self.mode == "slow":
            await asyncio.sleep(self.delay)
        if not isinstance(body, dict) or "_invalid" in body:
            return _err(400, "invalid request body")
        return await handler(request)  # handlers re-read the (cached) body

    def _check_model(self, body: dict) -> web.Response | None:
        name = body.get("model")
        if not name or not isinstance(name, str):
            return _err(400, "model is required")
        if not self.has_model(name):
            return _err(404, f'model "{name}" not found, try pulling it first')
        return None

    # ------------------------------------------------------------ handlers
    async def _root(self, request: web.Request) -> web.Response:
        return web.Response(text="Ollama is running")

    async def _version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": self.version})

    async def _tags(self, request: web.Request) -> web.Response:
        models = []
        for m in self.models:
            if not self.has_model(m):
                continue
            name = _norm_model(m)
            embed = "embed" in name
            models.append({
                "name": name, "model": name, "modified_at": "2025-01-01T00:00:00Z",
                "size": 274302450 if embed else 2019393189,
                "digest": hashlib.sha256(name.encode()).hexdigest(),
                "details": {"parent_model": "", "format": "gguf",
                            "family": "nomic-bert" if embed else "llama",
                            "families": ["nomic-bert" if embed else "llama"],
                            "parameter_size": "137M" if embed else "3.2B",
                            "quantization_level": "F16" if embed else "Q4_K_M"}})
        return web.json_response({"models": models})

    def _vectors(self, texts: list[str]) -> list[list[float]]:
        return [self.embed_text(t, self.wrong_dim) for t in texts]

    async def _embed(self, request: web.Request) -> web.Response:
        body = await request.json()
        if (bad := self._check_model(body)) is not None:
            return bad
        inp = body.get("input", [])
        texts = [inp] if isinstance(inp, str) else inp
        if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
            return _err(400, "invalid input type")
        if self.embed_garbage:
            return web.Response(text='{"embeddings": [[0.1, 0.2,', content_type="application/json")
        return web.json_response({
            "model": body["model"], "embeddings": self._vectors(texts),
            "total_duration": 14 * _NS, "load_duration": _NS,
            "prompt_eval_count": sum(len(self.tokens(t)) for t in texts)})

    async def _embeddings(self, request: web.Request) -> web.Response:
        """Legacy single-text endpoint: ``{"prompt"}`` -> ``{"embedding"}``."""
        body = await request.json()
        if (bad := self._check_model(body)) is not None:
            return bad
        if self.embed_garbage:
            return web.Response(text='{"embedding": [0.1,', content_type="application/json")
        return web.json_response({"embedding": self._vectors([str(body.get("prompt", ""))])[0]})

    async def _next_reply(self, body: dict) -> str | web.Response:
        item = self.chat_replies.pop(0) if self.chat_replies else self.default_chat_reply
        if item == self.HTTP_500:
            return _err(500, "fake ollama: scripted chat failure")
        if item == self.TIMEOUT:
            await asyncio.sleep(self.delay)
            item = self.default_chat_reply
        if isinstance(item, BaseException):
            return _err(500, str(item) or type(item).__name__)
        return str(item(body) if callable(item) else item)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, chat=True)

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, chat=False)

    async def _complete(self, request: web.Request, chat: bool) -> web.StreamResponse:
        """Shared chat/generate logic; streams NDJSON unless ``stream`` is false."""
        body = await request.json()
        if (bad := self._check_model(body)) is not None:
            return bad
        reply = await self._next_reply(body)
        if isinstance(reply, web.Response):
            return reply
        model = body["model"]

        def chunk(text: str, done: bool) -> dict:
            d: dict[str, Any] = {"model": model, "created_at": _now()}
            if chat:
                d["message"] = {"role": "assistant", "content": text}
            else:
                d["response"] = text
            d["done"] = done
            if done:
                d.update(done_reason="stop", total_duration=50 * _NS, load_duration=_NS,
                         prompt_eval_count=10, prompt_eval_duration=5 * _NS,
                         eval_count=max(1, len(reply.split())), eval_duration=40 * _NS)
            return d

        if body.get("stream", True) is False:
            return web.json_response(chunk(reply, True))
        resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await resp.prepare(request)
        pieces = self._pieces(reply)
        for number, piece in enumerate(pieces):
            if number == self.stream_fail_after:  # what Ollama sends when the runner dies mid-answer
                await resp.write(b'{"error":"fake ollama: model runner has unexpectedly stopped"}\n')
                await resp.write_eof()
                return resp
            if self.stream_delay:
                await asyncio.sleep(self.stream_delay)
            await resp.write((json.dumps(chunk(piece, False)) + "\n").encode())
        await resp.write((json.dumps(chunk("", True)) + "\n").encode())
        await resp.write_eof()
        return resp

    def _pieces(self, reply: str) -> list[str]:
        """The streamed pieces of `reply`: `stream_pieces` equal parts, else a word (with the space before it) each."""
        if self.stream_pieces:
            size = -(-len(reply) // self.stream_pieces)
            return [reply[i:i + size] for i in range(0, len(reply), size)]
        return re.findall(r"\s*\S+", reply) + re.findall(r"\s+$", reply)


class FakeOllamaThread:
    """``FakeOllama`` running on its own event loop in a daemon thread.

    Unknown attributes are read from / written to the wrapped ``fake``, so
    ``t.mode = "error"`` or ``t.chat_replies.append("x")`` work directly.
    """

    HTTP_500, TIMEOUT = FakeOllama.HTTP_500, FakeOllama.TIMEOUT
    _OWN = {"fake", "_loop", "_thread"}

    def __init__(self, **kwargs: Any) -> None:
        object.__setattr__(self, "fake", FakeOllama(**kwargs))
        object.__setattr__(self, "_loop", None)
        object.__setattr__(self, "_thread", None)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.fake, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self._OWN:
            object.__setattr__(self, name, value)
        else:
            setattr(self.fake, name, value)

    def _call(self, coro: Any, timeout: float = 10.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def start(self) -> "FakeOllamaThread":
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever,
                                        name="fake-ollama", daemon=True)
        self._thread.start()
        self._call(self.fake.start())
        return self

    def stop(self) -> None:
        if self._loop is None:
            return
        try:
            self._call(self.fake.stop())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)
            self._loop.close()
            self._loop = self._thread = None

    def go_down(self) -> None:
        self._call(self.fake.go_down())

    def come_up(self) -> None:
        self._call(self.fake.come_up())

    @contextlib.contextmanager
    def down(self):
        """`with fake.down():` the server refuses connections inside the block, and is back after."""
        self.go_down()
        try:
            yield self
        finally:
            self.come_up()

    def __enter__(self) -> "FakeOllamaThread":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
