"""Storing extracted facts: embed, find duplicates and older memories a fact updates (the LLM
decides), then write everything of one author in one transaction, new memories up to the
author's MUNINN_LEARN_PER_DAY in each channel (bot/memory/writing/facts.py, LearnBudget)."""
from __future__ import annotations

import logging
import time
from typing import Callable, Sequence, TypeVar

from bot.conversation.exchange import Exchange
from bot.lifecycle import writes
from bot.lifecycle.facts import Fact
from bot.llm.answers import ask_json
from bot.llm.servers import LLMClient
from bot.memory.engine import Engine
from bot.memory.records import PENDING
from bot.memory.writing.facts import WriteOutcome
from bot.memory.writing.rules import UpdateDecision

log = logging.getLogger(__name__)
T = TypeVar("T")

# -- storing -------------------------------------------------------------------

async def decide_update(client: LLMClient, fact_text: str,
                        candidates: Sequence[tuple[int, str]]) -> UpdateDecision | None:
    """Ask the LLM whether the new fact repeats or replaces any of these older memories."""
    if not candidates or not client.enabled:
        return None
    return await ask_json(client, writes.update_messages(fact_text, candidates), writes.UPDATE_SCHEMA,
                          lambda data: writes.check_update_reply(data, candidates),
                          what="update decision")


async def store_facts(engine: Engine, facts: Sequence[Fact], exchange: Exchange | Sequence[Exchange] | None = None,
                      *, now: float | None = None, keep: Callable[[], bool] | None = None) -> list[int]:
    """Store the facts of one exchange (or one author's batch) in one transaction; returns the
    memory id of each fact (the reinforced memory for a repeated fact)."""
    outcome = await store_facts_detailed(engine, facts, exchange, now=now, keep=keep)
    return outcome.ids


async def store_facts_detailed(engine: Engine, facts: Sequence[Fact],
                               exchange: Exchange | Sequence[Exchange] | None = None, *,
                               now: float | None = None, keep: Callable[[], bool] | None = None
                               ) -> WriteOutcome:
    """`keep`, if given, is asked on the database thread right before the write: False stores
    nothing (the author was forgotten meanwhile). A forget-all that runs on that thread after
    the write deletes what it wrote, so between the two nothing can slip through."""
    if not facts:
        return WriteOutcome()
    exchanges = [] if exchange is None else [exchange] if isinstance(exchange, Exchange) else list(exchange)
    now = time.time() if now is None else now
    said_at = max((e.created_at for e in exchanges if e.created_at is not None), default=None)
    memories = [fact.to_new_memory(created_at=said_at) for fact in facts]
    settings = engine.settings
    # Embeddings first (network, outside the transaction) so the duplicate check can use them;
    # without them the facts are stored unembedded and maintenance embeds them later.
    vecs = await engine.embed_or_none([m.text for m in memories])
    candidates, searched, mark, taught = await engine.facts.plan(settings.embed_model, memories, vecs, settings,
                                                                 [f.about for f in facts], now)
    decisions: list[UpdateDecision | None] = []
    for fact, found in zip(facts, candidates, strict=True):
        # a claim waiting for a moderator replaces nothing (write_facts): no question to ask
        decisions.append(await decide_update(engine.ollama, fact.text, found)
                         if found and fact.standing != PENDING else None)
    outcome = await engine.facts.write(keep, memories, vecs, decisions, settings=settings, now=now,
                                       searched=searched, searched_mark=mark, taught=taught)
    if outcome.inserted or outcome.reinforced or outcome.superseded:
        log.info("memories: stored %s, reinforced %s, superseded %s, waiting for a moderator %s", outcome.inserted,
                 outcome.reinforced, [f"#{old}->#{new}" for old, new in outcome.superseded], outcome.pending)
    if outcome.dropped:  # counts and ids only: never what the facts said
        log.info("MUNINN_LEARN_PER_DAY=%d reached: dropped %s", settings.learn_per_day, "; ".join(
            f"{dropped} new facts of user {owner} in channel {channel} ({taught} taught there in 24 h)"
            for (owner, channel), (dropped, taught) in outcome.dropped.items()))
    return outcome
