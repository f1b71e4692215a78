"""A small, fallible-by-design client for Ollama's HTTP API (/api/embed, /api/chat, /api/tags).

Ollama runs elsewhere and may be down, slow, or missing a model. Every call has a
short timeout and a bounded number of retries, raises one of the OllamaError
subclasses (bot/llm/errors.py), and logs one line that says what to fix.

Cooldowns are kept per purpose, so one failure never blocks another kind of call:
- embeddings: after a failure, none for `cooldown` seconds (recall goes keyword-only, so a
  dead server does not add a timeout to every message);
- replies: after a failure, calls fail fast, but from `PROBE_AFTER` seconds on the next reply
  first asks a cheap `/api/version` (one probe at a time): if Ollama is back the reply goes
  through at once instead of waiting out the cooldown;
- background work (extraction, consolidation): its own cooldown, which replies never see.

Several hosts (OLLAMA_URL=a,b) get an `OllamaHosts`: a client per host, and
bot/llm/hosts.py's choice of the host for each call. OpenAI-compatible servers (llama-server,
vLLM, LM Studio, OpenRouter) get bot/llm/openai_api.py's client: this one with their paths,
bodies and errors; bot/llm/servers.py picks the kind per purpose.
"""
from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, AsyncGenerator, AsyncIterator, Sequence

from bot.llm.errors import (
    OllamaBadResponse,
    OllamaDisabled,
    OllamaError,
    OllamaModelMissing,
    OllamaUnavailable,
    Purpose,
)
from bot.llm.hosts import HostChoice, split_urls
from bot.redact import redact_url

if TYPE_CHECKING:  # imported lazily: keyword-only command-line calls never need it
    import aiohttp

log = logging.getLogger(__name__)

PROBE_AFTER = 1.0      # seconds after a failed reply before the next one may probe Ollama
PROBE_TIMEOUT = 1.0    # seconds a probe may take
MAX_RETRY_WAIT = 2.0   # a Retry-After up to this is waited out within the call; a longer one starts the cooldown
MAX_RETRY_AFTER = 600.0  # the longest cooldown a server's Retry-After may ask for


def usable_vector(vector: Any) -> bool:
    """A non-empty list of finite numbers that is not all zeros. Checked with C-level builtins
    (math.hypot is NaN or infinite for such input): this runs on the event loop, and a
    per-element generator was slow enough to hold it up on every embedding."""
    if not (isinstance(vector, list) and vector and set(map(type, vector)) <= {int, float}):
        return False
    try:
        return 0.0 < math.hypot(*vector) < math.inf  # NaN fails both comparisons
    except OverflowError:  # an integer too large for a float
        return False


class OllamaClient:
    """The client of one Ollama server (one host of several: `OllamaHosts`); `from_settings` makes
    the right one. Use it on one event loop: its HTTP session is opened on the loop of its first call.
    `url_setting` is the setting messages tell the operator to fix."""

    SERVER = "Ollama"           # how messages name the server
    CHAT_PATH = "/api/chat"
    EMBED_PATH = "/api/embed"
    MODELS_PATH = "/api/tags"
    PROBE_PATH = "/api/version"  # the cheap call that asks whether the server is back

    def __init__(self, url: str, *, chat_model: str = "llama3.2", embed_model: str = "nomic-embed-text",
                 embed_timeout: float = 2.0, chat_timeout: float = 60.0, retries: int = 1,
                 cooldown: float = 15.0, concurrency: int = 2, url_setting: str = "OLLAMA_URL",
                 api_key: str = ""):
        self.url = url.rstrip("/")
        self.url_setting = url_setting
        self.api_key = api_key
        self.where = redact_url(self.url)  # what messages name: the URL without its credentials
        self.chat_model = chat_model
        self.embed_model = embed_model
        self.embed_timeout = embed_timeout
        self.chat_timeout = chat_timeout
        self.retries = retries
        self.cooldown = cooldown
        self.concurrency = concurrency
        # Replies and background work (extraction, consolidation) wait in separate lines, so
        # a backlog of background calls can never delay an answer to a person.
        self._reply_slots = asyncio.Semaphore(concurrency)
        self._background_slots = asyncio.Semaphore(1)
        self._session: aiohttp.ClientSession | None = None
        self._down_until: dict[str, float] = {"embed": 0.0, "reply": 0.0, "background": 0.0}
        self._last_failure: dict[str, float] = {"embed": 0.0, "reply": 0.0, "background": 0.0}
        self._probe: asyncio.Task | None = None

    @classmethod
    def from_settings(cls, settings) -> "OllamaClient":
        """The Ollama client for OLLAMA_URL; several comma-separated hosts get an `OllamaHosts`
        (bot/llm/servers.py's `make_client` is the one that honours the kind settings)."""
        options = dict(chat_model=settings.chat_model, embed_model=settings.embed_model,
                       embed_timeout=settings.embed_timeout, chat_timeout=settings.chat_timeout,
                       retries=settings.ollama_retries, cooldown=settings.ollama_cooldown,
                       concurrency=settings.ollama_concurrency)
        urls = split_urls(settings.ollama_url)
        return OllamaHosts(urls, **options) if len(urls) > 1 else cls(settings.ollama_url, **options)

    @property
    def enabled(self) -> bool:
        """Whether there is a URL; without one every call raises OllamaDisabled."""
        return bool(self.url)

    @property
    def embeds(self) -> bool:
        """Whether embeddings have a server (the same one as chat)."""
        return self.enabled

    async def close(self) -> None:
        """Close the HTTP session; a later call opens a new one."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> "OllamaClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    # -- API -----------------------------------------------------------------

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One embedding per text, in order."""
        if not self.enabled:
            raise OllamaDisabled(f"no {self.url_setting} configured")
        if self.cooling_down("embed"):
            raise OllamaUnavailable(f"{self.SERVER} failed recently; skipping embeddings during the cooldown")
        try:
            data = await self._post(self.EMBED_PATH, self._embed_body(texts), self.embed_timeout, retry_timeouts=False)
        except OllamaUnavailable as exc:
            self._failed("embed", exc.retry_after)
            self._log_embed_failure(exc)
            raise
        vectors = self._vectors_in(data)
        if not isinstance(vectors, list) or len(vectors) != len(texts) or not all(map(usable_vector, vectors)) \
                or len({len(v) for v in vectors}) != 1:
            raise OllamaBadResponse(f"{self.EMBED_PATH} returned no usable embeddings for {len(texts)} inputs "
                                    "(missing, empty, zero, not finite or of mixed sizes)")
        return vectors

    def _embed_body(self, texts: Sequence[str]) -> dict[str, Any]:
        return {"model": self.embed_model, "input": list(texts)}

    def _vectors_in(self, data: dict) -> Any:
        """The vectors of an embedding answer, in input order (checked by the caller)."""
        return data.get("embeddings")

    async def chat(self, messages: list[dict[str, str]], *, format: Any = None,
                   options: dict[str, Any] | None = None, timeout: float | None = None,
                   background: bool = False) -> str:
        """The assistant's reply text (non-streaming). `timeout` bounds the whole call, the
        wait for a free slot included; `background` work queues apart from replies, and its
        failures never put replies on cooldown."""
        purpose: Purpose = "background" if background else "reply"
        body = self._chat_body(messages, format, options, stream=False)
        timeout = timeout or self.chat_timeout
        deadline = time.monotonic() + timeout
        async with self._slot(purpose, timeout):
            try:
                data = await self._post(self.CHAT_PATH, body, max(0.1, deadline - time.monotonic()),
                                        retry_timeouts=False)
            except OllamaUnavailable as exc:
                self._failed(purpose, exc.retry_after)
                raise
        self._recovered(purpose)
        return self._content_of(data)

    def _content_of(self, data: dict) -> str:
        """The reply text of a whole (non-streamed) chat answer."""
        message = data.get("message")
        if not isinstance(message, dict) or not isinstance(message.get("content"), str):
            raise OllamaBadResponse("/api/chat returned no message content")
        return message["content"]

    async def chat_stream(self, messages: list[dict[str, str]], *,
                          timeout: float | None = None) -> AsyncGenerator[str, None]:
        """A reply as it is written: the content pieces of Ollama's NDJSON stream, in order.
        `timeout` bounds the wait for a slot and for each piece (a long answer may take longer
        in all, as long as it keeps coming). Raises OllamaError like `chat`, also mid-stream;
        a connection error before the first piece is retried like `chat` does."""
        body = self._chat_body(messages, None, None, stream=True)
        timeout = timeout or self.chat_timeout
        async with self._slot("reply", timeout):
            attempt = 0
            while True:
                started = False
                try:
                    async for piece in self._stream_once(body, timeout):
                        started = True
                        yield piece
                    break
                except OllamaUnavailable as exc:
                    timed_out = isinstance(exc.__cause__, asyncio.TimeoutError)
                    if started or timed_out or attempt >= self.retries or exc.retry_after is not None:
                        self._failed("reply", exc.retry_after)
                        raise
                    attempt += 1
                    await asyncio.sleep(0.2 * attempt)
        self._recovered("reply")

    async def _stream_once(self, body: dict[str, Any], timeout: float) -> AsyncIterator[str]:
        import aiohttp
        session = self._open_session()
        try:
            async with session.post(self.url + self.CHAT_PATH, json=body, headers=self._headers(),
                                    timeout=aiohttp.ClientTimeout(total=None, sock_connect=timeout,
                                                                  sock_read=timeout)) as resp:
                if resp.status >= 400:
                    self._raise_for(resp.status, await resp.text(), self.CHAT_PATH, body, resp.headers)
                async for line in resp.content:
                    piece, done = self._stream_piece(line)
                    if piece:
                        yield piece
                    if done:
                        return
            raise OllamaBadResponse(f"{self.CHAT_PATH} ended its stream without saying it was done")
        except asyncio.TimeoutError as exc:
            raise OllamaUnavailable(f"{self.SERVER} at {self.where} stopped answering {self.CHAT_PATH} for "
                                    f"{timeout:g} s (is the model loading? raise OLLAMA_CHAT_TIMEOUT if it is "
                                    "just slow)") from exc
        except aiohttp.ClientError as exc:
            raise OllamaUnavailable(f"cannot reach {self.SERVER} at {self.where} ({exc.__class__.__name__}): "
                                    f"{self._start_hint()}") from exc

    def _start_hint(self) -> str:
        """What to do when the server cannot be reached."""
        return f"start it with `ollama serve` or fix {self.url_setting}"

    def _headers(self) -> dict[str, str]:
        """The request headers: the API key as a bearer token when one is set (a proxy in front of
        the server may ask for it)."""
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    @staticmethod
    def _stream_piece(line: bytes) -> tuple[str, bool]:
        """(content, done) of one NDJSON line of /api/chat."""
        if not line.strip():
            return "", False
        try:
            data = json.loads(line)
        except json.JSONDecodeError:
            raise OllamaBadResponse("/api/chat streamed a line that is not JSON") from None
        if not isinstance(data, dict):
            raise OllamaBadResponse("/api/chat streamed something that is not an object")
        if data.get("error"):
            raise OllamaUnavailable(f"Ollama failed while answering: {data['error']}")
        message = data.get("message") or {}
        content = message.get("content", "") if isinstance(message, dict) else ""
        return (content if isinstance(content, str) else ""), bool(data.get("done"))

    def _chat_body(self, messages: list[dict[str, str]], format: Any, options: dict[str, Any] | None, *,
                   stream: bool) -> dict[str, Any]:
        if not self.enabled:
            raise OllamaDisabled(f"no {self.url_setting} configured")
        body: dict[str, Any] = {"model": self.chat_model, "messages": messages, "stream": stream}
        if format is not None:
            body["format"] = format
        if options:
            body["options"] = options
        return body

    @asynccontextmanager
    async def _slot(self, purpose: Purpose, timeout: float) -> AsyncIterator[None]:
        """A free chat slot of the purpose's line, after checking its cooldown."""
        if self.cooling_down(purpose) and not (purpose == "reply" and await self._back_up()):
            raise OllamaUnavailable(f"{self.SERVER} at {self.where} failed moments ago; not asking again for a few seconds")
        slots = self._background_slots if purpose == "background" else self._reply_slots
        try:
            await asyncio.wait_for(slots.acquire(), timeout)
        except asyncio.TimeoutError:
            raise OllamaUnavailable(f"all {self.concurrency} chat slots stayed busy for {timeout:g} s "
                                    "(raise OLLAMA_MAX_CONCURRENCY if Ollama can take more)") from None
        try:
            yield
        finally:
            slots.release()

    def _log_embed_failure(self, exc: OllamaError) -> None:
        log.warning("embedding failed, recall uses keywords only for %.0f s: %s", self.cooldown, exc)

    # -- cooldowns -----------------------------------------------------------

    def cooling_down(self, purpose: Purpose) -> bool:
        """Whether calls of `purpose` are in the cooldown after a failure (a reply may still probe
        whether Ollama is back: `_back_up`)."""
        return time.monotonic() < self._down_until[purpose]

    def _failed(self, purpose: Purpose, retry_after: float | None = None) -> None:
        """Start the purpose's cooldown: OLLAMA_COOLDOWN, or as long as the server asked (Retry-After,
        bounded by MAX_RETRY_AFTER). Replies do not probe the server before a Retry-After is over."""
        now = time.monotonic()
        wait = self.cooldown if retry_after is None else min(retry_after, MAX_RETRY_AFTER)
        self._down_until[purpose] = now + wait
        self._last_failure[purpose] = now if retry_after is None else now + max(0.0, wait - PROBE_AFTER)

    def _recovered(self, purpose: Purpose) -> None:
        self._down_until[purpose] = 0.0

    async def _back_up(self) -> bool:
        """During the reply cooldown: is Ollama answering again? At most one probe at a time,
        and none in the first PROBE_AFTER seconds after a failure (that would only fail too)."""
        if time.monotonic() - self._last_failure["reply"] < PROBE_AFTER:
            return False
        if self._probe is None or self._probe.done():
            self._probe = asyncio.get_running_loop().create_task(self._probe_once())
        return await asyncio.shield(self._probe)

    async def _probe_once(self) -> bool:
        try:
            await self._request("GET", self.PROBE_PATH, None, min(PROBE_TIMEOUT, self.embed_timeout))
        except OllamaError:
            self._last_failure["reply"] = time.monotonic()
            return False
        log.info("%s at %s answers again", self.SERVER, self.where)
        for purpose in ("reply", "background"):
            self._recovered(purpose)
        return True

    async def model_names(self) -> list[str]:
        """Models pulled on the server (/api/tags; /v1/models on OpenAI-compatible servers)."""
        if not self.enabled:
            raise OllamaDisabled(f"no {self.url_setting} configured")
        data = await self._request("GET", self.MODELS_PATH, None, self.embed_timeout * 2)
        return self._model_names_in(data)

    def _model_names_in(self, data: dict) -> list[str]:
        models = data.get("models")
        if not isinstance(models, list):
            raise OllamaBadResponse("/api/tags returned no model list")
        return [m.get("name", "") for m in models if isinstance(m, dict)]

    async def has_model(self, model: str) -> bool:
        """Whether the server has pulled `model` (a name without a tag matches its :latest); raises
        OllamaError as `model_names` does."""
        names = await self.model_names()
        wanted = {model, f"{model}:latest"} if ":" not in model else {model}
        return any(name in wanted for name in names)

    def missing_model(self, model: str) -> OllamaModelMissing:
        """The error that says `model` is not on this server and what to run about it."""
        return OllamaModelMissing(model)

    # -- transport -----------------------------------------------------------

    async def _post(self, path: str, body: dict, timeout: float, *, retry_timeouts: bool) -> dict:
        attempt = 0
        while True:
            try:
                return await self._request("POST", path, body, timeout)
            except OllamaUnavailable as exc:
                timed_out = isinstance(exc.__cause__, asyncio.TimeoutError)
                # A server that asks for a pause longer than a retry's wait gets its cooldown instead.
                told_to_wait = exc.retry_after is not None and exc.retry_after > MAX_RETRY_WAIT
                if attempt >= self.retries or (timed_out and not retry_timeouts) or told_to_wait:
                    raise
                attempt += 1
                await asyncio.sleep(max(0.2 * attempt, exc.retry_after or 0.0))

    def _open_session(self) -> "aiohttp.ClientSession":
        import aiohttp
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession()
        return self._session

    async def _request(self, method: str, path: str, body: dict | None, timeout: float) -> dict:
        import aiohttp
        session = self._open_session()
        url = self.url + path
        try:
            async with session.request(method, url, json=body, headers=self._headers(),
                                       timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
                text = await resp.text()
                status, headers = resp.status, resp.headers
        except asyncio.TimeoutError as exc:
            raise OllamaUnavailable(
                f"{self.SERVER} at {self.where} did not answer {path} within {timeout:g} s "
                "(is the model loading? raise the timeout setting if it is just slow)") from exc
        except aiohttp.ClientError as exc:
            raise OllamaUnavailable(
                f"cannot reach {self.SERVER} at {self.where} ({exc.__class__.__name__}): {self._start_hint()}") from exc
        try:
            data = json.loads(text) if text else {}
        except json.JSONDecodeError:
            data = None
        if status >= 400:
            self._raise_for(status, text, path, body, headers)
        if not isinstance(data, dict):
            raise OllamaBadResponse(f"{self.SERVER} at {self.where} answered {path} with something that is not JSON")
        return data

    def _raise_for(self, status: int, text: str, path: str, body: dict | None, headers: Any = None) -> None:
        """The OllamaError for an HTTP error answer."""
        try:
            data = json.loads(text) if text else {}
        except json.JSONDecodeError:
            data = None
        error = data.get("error") if isinstance(data, dict) else None
        if status == 404 and error and "not found" in str(error):
            raise OllamaModelMissing((body or {}).get("model", "?"))
        if status >= 500:
            raise OllamaUnavailable(f"Ollama at {self.where} answered {status} on {path}: {error or text[:200]}")
        raise OllamaBadResponse(f"Ollama at {self.where} answered {status} on {path}: {error or text[:200]}")


class _Host(OllamaClient):
    """One host of several: its failures are logged by `OllamaHosts`, which knows whether
    another host took the call over (so the line never claims recall lost its vectors when it
    did not)."""

    def _log_embed_failure(self, exc: OllamaError) -> None:
        pass


class OllamaHosts(HostChoice, OllamaClient):
    """The `OllamaClient` API over several hosts, each a plain client of its own; which host
    takes a call is `HostChoice`'s (bot/llm/hosts.py)."""

    def __init__(self, urls: Sequence[str], **options: Any):
        super().__init__(",".join(urls), **options)
        self._take_hosts([_Host(url, **options) for url in urls])
