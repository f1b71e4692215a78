"""Storing extracted facts: embed, find duplicates and older memories a fact updates (the LLM
decides), then write everything of one author in one transaction."""
from __future__ import annotations

import logging
import time
from typing import Any, Callable, Sequence, TypeVar

import apsw

from bot.conversation.exchange import Exchange
from bot.lifecycle import writes
from bot.lifecycle.facts import Fact
from bot.llm.answers import ask_json
from bot.llm.ollama import OllamaClient
from bot.memory.engine import Engine
from bot.memory.sql.store import NewMemory
from bot.memory.sqlite import fts
from bot.memory.storage import storage_of
from bot.settings import Settings

log = logging.getLogger(__name__)
T = TypeVar("T")

# -- storing -------------------------------------------------------------------

async def decide_update(client: OllamaClient, fact_text: str,
                        candidates: Sequence[tuple[int, str]]) -> writes.UpdateDecision | None:
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
                               ) -> writes.WriteOutcome:
    """`keep`, if given, is asked on the database thread right before the write: False stores
    nothing (the author was forgotten meanwhile). A forget-all that runs on that thread after
    the write deletes what it wrote, so between the two nothing can slip through."""
    if not facts:
        return writes.WriteOutcome()
    exchanges = [] if exchange is None else [exchange] if isinstance(exchange, Exchange) else list(exchange)
    now = time.time() if now is None else now
    said_at = max((e.created_at for e in exchanges if e.created_at is not None), default=None)
    memories = [fact.to_new_memory(created_at=said_at) for fact in facts]
    settings = engine.settings
    # Embeddings first (network, outside the transaction) so the duplicate check can use them;
    # without them the facts are stored unembedded and maintenance embeds them later.
    vecs = await engine.embed_or_none([m.text for m in memories])
    candidates, searched, mark = await engine.read(_plan_updates, settings.embed_model, memories, vecs, settings,
                                                   [f.about for f in facts])
    decisions: list[writes.UpdateDecision | None] = []
    for fact, found in zip(facts, candidates, strict=True):
        decisions.append(await decide_update(engine.ollama, fact.text, found) if found else None)
    outcome = await engine.write(
        _write_if_kept, keep, memories, vecs, decisions, what=f"store {len(memories)} extracted facts",
        settings=settings, now=now, searched=searched, searched_mark=mark)
    if outcome.inserted or outcome.reinforced or outcome.superseded:
        log.info("memories: stored %s, reinforced %s, superseded %s", outcome.inserted, outcome.reinforced,
                 [f"#{old}->#{new}" for old, new in outcome.superseded])
    return outcome


def _write_if_kept(conn, keep: Callable[[], bool] | None, *args, **kwargs) -> writes.WriteOutcome:
    if keep is not None and not keep():
        log.info("dropped %d facts: their author was forgotten while they were extracted", len(args[0]))
        return writes.WriteOutcome()
    return writes.write_facts(conn, *args, **kwargs)


def _plan_updates(conn: apsw.Connection, model: str, memories: list[NewMemory],
                  vecs: list[list[float]] | None, settings: Settings, names: list[str]
                  ) -> tuple[list[list[tuple[int, str]]], list[list[tuple[int, float]] | None], Any]:
    """For each fact that is not a plain duplicate: the older memories the LLM should judge;
    and each fact's search of its own key with the change mark it was made at (the write
    reuses it if no vector changed meanwhile). Read-only: the index is created by the write.
    On PostgreSQL the mark, the index, the owners' personal keys and the exact-text checks are
    one round trip (were 2 + one per fact), and the vector cache reads its change log once for
    all the searches (was once per search: 1-2 per fact)."""
    storage = storage_of(conn)
    owners = [m.owner_id for m in memories if m.scope == "personal" and m.owner_id is not None]
    probes = [(m.vis_key, fts.tokens(m.text)) for m in memories]
    with storage.one_log_read(conn):
        state = storage.plan_state(conn, model, owners, probes, writes.SAME_TEXT_LIMIT)
        info = state.info if vecs else None
        out: list[list[tuple[int, str]]] = []
        searched: list[list[tuple[int, float]] | None] = []
        for index, memory in enumerate(memories):
            vector = vecs[index] if vecs is not None and info is not None and len(vecs[index]) == info.dim else None
            near = writes.nearest(conn, info, vector, [memory.vis_key], writes.FACT_NEIGHBOURS)
            searched.append(near if vector is not None else None)
            duplicate = writes.find_duplicate(conn, info, memory, vector, settings.dedup_cosine, near=near,
                                              same_words=state.same_words[index])
            if duplicate is not None:
                out.append([])
                continue
            out.append(writes.update_candidates(conn, info, memory, vector, threshold=settings.update_cosine,
                                                subject_name=names[index], near=near,
                                                keys=writes.subject_keys(conn, memory, state.personal)))
    return out, searched, state.mark
