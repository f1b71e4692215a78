"""What the running bot says of itself, for the console's stats page: its Prometheus /metrics
(when MUNINN_METRICS_PORT is set), read once per page with a short timeout, never required.

The database holds what was learned and archived; how recalls went (latency, modes, fallbacks)
and how extraction fares live in the bot process, which exports them on /metrics.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from bot.redact import redact_url
from bot.settings import Settings

TIMEOUT_S = 1.0


@dataclass
class Live:
    """The bot's counters as the stats page draws them."""
    url: str
    recall_buckets: list[tuple[str, int]] = field(default_factory=list)   # (upper bound, count in the bucket)
    reply_buckets: list[tuple[str, int]] = field(default_factory=list)
    recalls: dict[str, int] = field(default_factory=dict)                 # "mode / vector status" -> count
    answered: dict[str, int] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)
    extraction: dict[str, int] = field(default_factory=dict)              # outcome -> batches, and facts stored
    waiting: int = 0


def metrics_url(settings: Settings) -> str | None:
    """Where the bot serves /metrics, or None when it serves none."""
    if settings.metrics_port is None:
        return None
    host = settings.metrics_host
    host = "127.0.0.1" if host in ("0.0.0.0", "") else "::1" if host == "::" else host
    return f"http://{'[' + host + ']' if ':' in host else host}:{settings.metrics_port}/metrics"


async def read(url: str, *, timeout: float = TIMEOUT_S) -> Live | str:
    """The bot's counters from `url`, or one line saying why they could not be read."""
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as http:
            async with http.get(url) as answer:
                if answer.status != 200:
                    return f"the bot's metrics at {redact_url(url)} answered HTTP {answer.status}"
                text = await answer.text()
    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
        return f"the bot's metrics at {redact_url(url)} did not answer ({type(exc).__name__}): is the bot running?"
    try:
        return parse(url, text)
    except ValueError as exc:
        return f"the bot's metrics at {redact_url(url)} could not be read: {exc}"


def parse(url: str, text: str) -> Live:
    """The counters the page draws, from Prometheus' text format."""
    live = Live(url)
    for family in text_string_to_metric_families(text):
        if family.name in ("muninn_recall_seconds", "muninn_reply_seconds"):
            target = live.recall_buckets if family.name == "muninn_recall_seconds" else live.reply_buckets
            cumulative = [(float(s.labels["le"]), int(s.value)) for s in family.samples if s.name.endswith("_bucket")]
            before = 0
            for bound, count in sorted(cumulative):
                target.append(("more" if math.isinf(bound) else f"≤{bound:g}s", count - before))
                before = count
        for sample in family.samples:
            if sample.name == "muninn_recalls_total":
                key = f"{sample.labels.get('mode', '?')} / {sample.labels.get('vector_status', '?')}"
                live.recalls[key] = int(sample.value)
            elif sample.name == "muninn_messages_answered_total":
                live.answered[sample.labels.get("outcome", "?")] = int(sample.value)
            elif sample.name == "muninn_messages_skipped_total":
                live.skipped[sample.labels.get("reason", "?")] = int(sample.value)
            elif sample.name == "muninn_extraction_batches_total":
                live.extraction[f"batches {sample.labels.get('outcome', '?')}"] = int(sample.value)
            elif sample.name == "muninn_facts_stored_total":
                live.extraction["facts stored"] = int(sample.value)
            elif sample.name == "muninn_extraction_waiting":
                live.waiting = int(sample.value)
    return live
