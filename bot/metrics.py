"""The bot's Prometheus metrics (MUNINN_METRICS_PORT; served by cogs/health.py, docs/deployment.md).

Counted as they happen: answers, skips and their latency, recalls by mode and vector status
and their latency (the pipeline's `Watch`, bot/conversation/watch.py), Discord messages and
interactions seen. Read when Prometheus scrapes, never counted on a timer: the gateway's
connection and latency per shard, the servers, the extraction queue, the facts stored, each
LLM host's cooldowns, and whether the database answered its last health probe. Memories by
scope are counted in the database, so they come from the health cog's periodic count, not
from each scrape. Names follow discord-ext-prometheus where they overlap (`discord_connected`,
`discord_latency`, `discord_event_on_message`, `discord_event_on_interaction`,
`discord_stat_total_guilds`; an unsharded bot's `shard` label is "None", as there).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from bot.conversation.watch import Watch
from bot.llm.servers import parts_of
from bot.memory.recall.retrieval import RecallResult

disable_created_metrics()  # the `_created` series double every counter's lines and tell an operator nothing
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"   # Prometheus' text format
PURPOSES = ("reply", "embed", "background")                 # the LLM client's kinds of call (bot/llm/errors.py)
# A reply waits for the model (seconds to a minute); a recall is milliseconds (docs/performance.md).
REPLY_BUCKETS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0, 120.0)
RECALL_BUCKETS = (0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


@dataclass(frozen=True)
class Shard:
    """One gateway connection as a scrape sees it: its `shard` label, whether it is open, its
    heartbeat latency in seconds (NaN or infinite before the first heartbeat)."""
    label: str
    connected: bool
    latency: float


@dataclass
class Readings:
    """Where the scrape-time values come from; the health cog fills it in for the running bot."""
    shards: Callable[[], list[Shard]] = list
    guilds: Callable[[], int] = lambda: 0
    extractor: Any = None                     # bot.lifecycle's Extractor (waiting, stored, processed, failed)
    llm: Any = None                           # the LLM client: one host, or several in `.hosts`
    memories_by_scope: dict[str, int] = field(default_factory=dict)   # the last periodic count
    database_up: bool | None = None           # the last health probe's answer (None before the first)


class Metrics(Watch):
    """The metrics of one bot process in their own registry (several bots may share a process in
    tests); `render` is the text of /metrics. As the pipeline's `Watch` it counts what it hears."""

    def __init__(self, readings: Readings | None = None):
        self.readings = readings or Readings()
        self.registry = CollectorRegistry(auto_describe=True)
        self.answered_total = Counter("muninn_messages_answered", "Messages answered, by outcome (ok, or the "
                                      "fallback said when the LLM could not answer).", ["outcome"], registry=self.registry)
        self.skipped_total = Counter("muninn_messages_skipped", "Messages that asked for an answer and were only "
                                     "recorded: the person was over their fair share (rate) or the channel's "
                                     "queue was full (queue).", ["reason"], registry=self.registry)
        self.reply_seconds = Histogram("muninn_reply_seconds", "Seconds from a message's arrival to its answer "
                                       "being sent.", buckets=REPLY_BUCKETS, registry=self.registry)
        self.recall_seconds = Histogram("muninn_recall_seconds", "Seconds one recall for a prompt took (embedding "
                                        "wait included).", buckets=RECALL_BUCKETS, registry=self.registry)
        self.recalls_total = Counter("muninn_recalls", "Recalls for prompts, by mode and vector status (README, "
                                     "Fallbacks).", ["mode", "vector_status"], registry=self.registry)
        self.messages_total = Counter("discord_event_on_message", "Messages the bot saw on the gateway.",
                                      ["shard"], registry=self.registry)
        self.interactions_total = Counter("discord_event_on_interaction", "Interactions (slash commands, "
                                          "buttons) called by users.", ["shard", "interaction", "command"],
                                          registry=self.registry)
        for outcome in ("ok", "fallback"):
            self.answered_total.labels(outcome)
        for reason in ("rate", "queue"):
            self.skipped_total.labels(reason)
        self.registry.register(_Live(self.readings))

    # -- the pipeline's Watch --------------------------------------------------

    def recalled(self, result: RecallResult) -> None:
        """Count a recall by mode and vector status, and its latency."""
        self.recalls_total.labels(result.mode, str(result.vector_status)).inc()
        total = result.timings_ms.get("total")
        if total is not None:
            self.recall_seconds.observe(total / 1000)

    def skipped(self, reason: str) -> None:
        """Count a message recorded without an answer."""
        self.skipped_total.labels(reason).inc()

    def answered(self, ok: bool, seconds: float) -> None:
        """Count an answer and its latency."""
        self.answered_total.labels("ok" if ok else "fallback").inc()
        self.reply_seconds.observe(seconds)

    # -- Discord events ---------------------------------------------------------

    def message_seen(self, shard: str) -> None:
        """Count a message that arrived on the gateway."""
        self.messages_total.labels(shard).inc()

    def interaction_seen(self, shard: str, kind: str, command: str) -> None:
        """Count an interaction (its type and, for a slash command, the command's name)."""
        self.interactions_total.labels(shard, kind, command).inc()

    def render(self) -> bytes:
        """The metrics in Prometheus' text format."""
        return generate_latest(self.registry)


class _Live(Collector):
    """The values read when Prometheus scrapes (see the module docstring)."""

    def __init__(self, readings: Readings):
        self.readings = readings

    def collect(self) -> Iterator[Metric]:
        """Every scrape-time metric, read now."""
        r = self.readings
        connected = GaugeMetricFamily("discord_connected", "Whether the bot is connected to Discord.", labels=["shard"])
        latency = GaugeMetricFamily("discord_latency", "Heartbeat latency to Discord in seconds.", labels=["shard"])
        for shard in r.shards():
            connected.add_metric([shard.label], 1.0 if shard.connected else 0.0)
            if math.isfinite(shard.latency):
                latency.add_metric([shard.label], shard.latency)
        yield connected
        yield latency
        yield GaugeMetricFamily("discord_stat_total_guilds", "Servers the bot is a member of.", value=r.guilds())
        yield from _extraction(r.extractor)
        yield from _llm_hosts(r.llm)
        scopes = GaugeMetricFamily("muninn_memories", "Active memories by scope (counted periodically, not "
                                   "per scrape).", labels=["scope"])
        for scope, count in sorted(r.memories_by_scope.items()):
            scopes.add_metric([scope], count)
        yield scopes
        if r.database_up is not None:
            yield GaugeMetricFamily("muninn_database_up", "Whether the database answered the last health probe.",
                                    value=1.0 if r.database_up else 0.0)


def _extraction(extractor: Any) -> Iterable[Metric]:
    """The fact extractor's queue and counts (nothing without extraction)."""
    if extractor is None:
        return
    yield GaugeMetricFamily("muninn_extraction_waiting", "Exchanges waiting for fact extraction.",
                            value=getattr(extractor, "waiting", 0))
    yield CounterMetricFamily("muninn_facts_stored", "Memories written or strengthened by fact extraction.",
                              value=getattr(extractor, "stored", 0))
    batches = CounterMetricFamily("muninn_extraction_batches", "Extraction batches finished, by outcome.",
                                  labels=["outcome"])
    batches.add_metric(["done"], getattr(extractor, "processed", 0))
    batches.add_metric(["failed"], getattr(extractor, "failed", 0))
    yield batches


def _llm_hosts(client: Any) -> Iterable[Metric]:
    """Each LLM host's health: up when no kind of call is cooling down after a failure."""
    if client is None or not getattr(client, "enabled", True):
        return
    up = GaugeMetricFamily("muninn_llm_host_up", "Whether the LLM host takes every kind of call (no cooldown).",
                           labels=["host"])
    cooling = GaugeMetricFamily("muninn_llm_host_cooling_down", "Whether calls of a kind (reply, embed, background) "
                                "skip the host after a failure (OLLAMA_COOLDOWN).", labels=["host", "purpose"])
    clients = [part for part, _ in parts_of(client)]  # chat and embeddings may be on different servers
    hosts = [host for one in clients if getattr(one, "enabled", True) for host in (getattr(one, "hosts", None) or [one])]
    for host in hosts:
        down = [purpose for purpose in PURPOSES if host.cooling_down(purpose)]
        up.add_metric([host.where], 0.0 if down else 1.0)
        for purpose in PURPOSES:
            cooling.add_metric([host.where, purpose], 1.0 if purpose in down else 0.0)
    yield up
    yield cooling
