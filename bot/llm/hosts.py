"""Several Ollama hosts behind one client: OLLAMA_URL=http://gpu1:11434,http://gpu2:11434.

Each host is a plain `OllamaClient` with everything that client keeps per server: its
cooldowns per purpose, its recovery probe, its chat slots (OLLAMA_MAX_CONCURRENCY per host).
`OllamaHosts` (bot/llm/ollama.py) only chooses, through `HostChoice` here: every call (reply,
streamed reply, embedding, background work) goes to the least busy host that is not cooling
down for that purpose (fewest of our calls in flight; ties take turns), and when a host
cannot be reached the same call moves on to the next one, with one log line naming the
failed host. A streamed reply moves on only before its first piece (a person never sees
half an answer twice). Replies may still go to a cooling host when every other one failed:
its probe (`OllamaClient._back_up`) is what brings a host back. Embeddings and background
work skip cooling hosts until their cooldown ends. When every host failed, the call raises
like the single-host client, so the callers' usual fallbacks apply (keyword-only recall,
"cannot think right now").
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, Protocol, TypeVar

from bot.llm.errors import OllamaError, OllamaUnavailable, Purpose

log = logging.getLogger(__name__)
T = TypeVar("T")


def split_urls(raw: str) -> list[str]:
    """The hosts of an OLLAMA_URL value, in order, without blanks or repeats."""
    return list(dict.fromkeys(part.strip().rstrip("/") for part in raw.split(",") if part.strip()))


class Host(Protocol):
    """What `HostChoice` uses of each host's client (an `OllamaClient`)."""

    url: str
    where: str  # the URL as messages name it, without its credentials

    async def close(self) -> None:
        """Close the host's HTTP session."""

    def cooling_down(self, purpose: Purpose) -> bool:
        """Whether calls of `purpose` to this host are in the cooldown after a failure."""

    async def _back_up(self) -> bool: ...

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One embedding per text, in order."""

    async def chat(self, messages: list[dict[str, str]], *, format: Any = None,
                   options: dict[str, Any] | None = None, timeout: float | None = None,
                   background: bool = False) -> str:
        """The reply text; OllamaUnavailable when the host cannot answer."""

    def chat_stream(self, messages: list[dict[str, str]], *,
                    timeout: float | None = None) -> AsyncIterator[str]:
        """The reply in pieces as it is written."""

    async def model_names(self) -> list[str]:
        """The models pulled on this host."""


class HostChoice:
    """The `OllamaClient` API over several hosts (see the module docstring): the half of
    `OllamaHosts` that chooses a host for each call. The client half sets the attributes."""

    SERVER: str                    # how messages name the kind of server
    url: str
    where: str                     # the URLs as messages name them, without their credentials
    cooldown: float
    chat_timeout: float
    hosts: Sequence[Host]
    in_flight: dict[str, int]      # our calls in flight, per host URL
    _turn: int                     # whose turn it is among equally busy hosts
    _probes: set[asyncio.Task]     # recovery probes of cooling hosts, running in the background

    def _take_hosts(self, hosts: Sequence[Host]) -> None:
        """Start with `hosts`, none busy, none probed (the client half's constructor calls it)."""
        if not hosts:
            raise ValueError(f"{type(self).__name__} needs at least one URL")
        self.hosts = hosts
        self.in_flight = {host.url: 0 for host in hosts}
        self._turn = 0
        self._probes = set()

    async def close(self) -> None:
        """Cancel the recovery probes still running, then close every host's client."""
        for probe in list(self._probes):
            probe.cancel()
        await asyncio.gather(*self._probes, return_exceptions=True)
        for host in self.hosts:
            await host.close()

    def cooling_down(self, purpose: Purpose) -> bool:
        """Whether every host is cooling down for `purpose`."""
        return all(host.cooling_down(purpose) for host in self.hosts)

    # -- choosing a host -----------------------------------------------------

    def candidates(self, purpose: Purpose) -> list[Host]:
        """The hosts to try, best first: healthy ones by load (ties take turns); for replies
        then the cooling ones, whose recovery probe may find them back."""
        count = len(self.hosts)
        self._turn = (self._turn + 1) % count
        turn = [self.hosts[(self._turn + i) % count] for i in range(count)]
        healthy = sorted((h for h in turn if not h.cooling_down(purpose)), key=lambda h: self.in_flight[h.url])
        cooling = [h for h in turn if h.cooling_down(purpose)] if purpose == "reply" else []
        if healthy:
            for host in cooling:
                self._probe_soon(host)
        return healthy + cooling

    def _probe_soon(self, host: Host) -> None:
        """While other hosts take the replies, ask a cooling host in the background whether it is
        back (its own probe: at most one at a time, none in the first PROBE_AFTER seconds)."""
        probe = asyncio.get_running_loop().create_task(host._back_up())
        self._probes.add(probe)
        probe.add_done_callback(self._probes.discard)

    async def _first_that_answers(self, purpose: Purpose, call: Callable[[Host], Awaitable[T]],
                                  deadline: float | None = None) -> T:
        hosts = self.candidates(purpose)
        if not hosts:
            raise OllamaUnavailable(f"every {self.SERVER} host ({self.where}) failed moments ago; "
                                    "not asking again for a few seconds")
        failure: OllamaUnavailable | None = None
        for host in hosts:
            if deadline is not None and deadline - time.monotonic() < 0.05:
                break
            was_cooling = host.cooling_down(purpose)
            self.in_flight[host.url] += 1
            try:
                return await call(host)
            except OllamaUnavailable as exc:
                failure = exc
                if not was_cooling:
                    self._log_skip(host, purpose, exc)
            finally:
                self.in_flight[host.url] -= 1
        assert failure is not None
        raise failure

    def _log_skip(self, host: Host, purpose: Purpose, exc: OllamaError) -> None:
        log.warning("%s host %s failed a %s call, skipping it for %.0f s: %s", self.SERVER, host.where, purpose,
                    self.cooldown, exc)

    # -- the OllamaClient API ------------------------------------------------

    async def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One embedding per text, from the first host that answers. OllamaUnavailable when every host
        is cooling down for embeddings, or failed (said in one warning); a host's other OllamaError is raised as it is."""
        if self.cooling_down("embed"):
            raise OllamaUnavailable(f"every {self.SERVER} host failed recently; skipping embeddings during the cooldown")
        try:
            return await self._first_that_answers("embed", lambda host: host.embed(texts))
        except OllamaUnavailable as exc:
            log.warning("embedding failed on every %s host, recall uses keywords only for %.0f s: %s",
                        self.SERVER, self.cooldown, exc)
            raise

    async def chat(self, messages: list[dict[str, str]], *, format: Any = None,
                   options: dict[str, Any] | None = None, timeout: float | None = None,
                   background: bool = False) -> str:
        """`OllamaClient.chat` on the first host that answers, `timeout` bounding the whole call over
        every host tried; the last OllamaUnavailable when none answered."""
        timeout = timeout or self.chat_timeout
        deadline = time.monotonic() + timeout

        def ask(host: Host) -> Awaitable[str]:
            return host.chat(messages, format=format, options=options, background=background,
                             timeout=max(0.1, deadline - time.monotonic()))
        return await self._first_that_answers("background" if background else "reply", ask, deadline)

    async def chat_stream(self, messages: list[dict[str, str]], *,
                          timeout: float | None = None) -> AsyncGenerator[str, None]:
        """`OllamaClient.chat_stream` on the first host that answers: a host that fails before its first
        piece hands the reply to the next one, after it the error is raised (part of the reply was shown).
        OllamaUnavailable when no host answered."""
        hosts = self.candidates("reply")
        failure: OllamaUnavailable | None = None
        for host in hosts:
            was_cooling = host.cooling_down("reply")
            started = False
            self.in_flight[host.url] += 1
            try:
                async for piece in host.chat_stream(messages, timeout=timeout):
                    started = True
                    yield piece
                return
            except OllamaUnavailable as exc:
                if started:
                    raise
                failure = exc
                if not was_cooling:
                    self._log_skip(host, "reply", exc)
            finally:
                self.in_flight[host.url] -= 1
        raise failure or OllamaUnavailable(f"no {self.SERVER} host ({self.where}) answered")

    async def model_names(self) -> list[str]:
        """The models that every reachable host has (a reply may go to any of them); raises
        only when no host answers."""
        found: list[list[str]] = []
        failure: OllamaError | None = None
        for host in self.hosts:
            try:
                found.append(await host.model_names())
            except OllamaError as exc:
                failure = exc
        if not found:
            assert failure is not None
            raise failure
        return [name for name in found[0] if all(name in names for names in found[1:])]

    async def models_per_host(self) -> dict[str, list[str] | OllamaError]:
        """Each host's pulled models, or why it could not say (for `muninn doctor`), by the host's
        URL without its credentials."""
        out: dict[str, list[str] | OllamaError] = {}
        for host in self.hosts:
            try:
                out[host.where] = await host.model_names()
            except OllamaError as exc:
                out[host.where] = exc
        return out
