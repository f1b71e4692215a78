"""Maintenance's reads and writes, on the database thread: faded memories archived, the id-order
scans with their watermarks, semantic links from precomputed neighbours, near-duplicate clusters
and their consolidation in one transaction each. `engine.upkeep` runs them; the order and the LLM
are bot/lifecycle/maintenance.py's."""
from __future__ import annotations

import asyncio
import json
import math
from dataclasses import dataclass
from typing import Sequence

from bot.memory import decay, records, vector_indexes
from bot.memory.connection import Connection
from bot.memory.jobs import Jobs
from bot.memory.scope import ACTIVE
from bot.memory.sql import history, store, teachers
from bot.memory.sql.queries import get_meta, query_value, set_meta
from bot.memory.sql.transactions import write_transaction
from bot.memory.sqlite import vec0
from bot.memory.storage import storage_of
from bot.memory.writing.facts import add_semantic_link
from bot.memory.writing.rules import clearest, normalise, values_conflict

MAX_CLUSTER = 8
LINKS_WATERMARK = "maintenance.links_through"
CONSOLIDATION_WATERMARK = "maintenance.consolidated_through"


@dataclass
class Consolidation:
    """One consolidated cluster: what stands for it now and what was archived into it."""
    survivor: int                  # the memory that now stands for the cluster
    originals: list[int]           # archived into it
    merged_by: str                 # "llm" (a new memory) or "kept" (the clearest original)
    text: str


# -- decay ---------------------------------------------------------------------

def faded_ids(conn: Connection, *, now: float, retention_below: float, importance_below: float,
              limit: int) -> list[int]:
    """Active memories with low importance whose retention fell below the threshold."""
    if retention_below <= 0:
        return []
    # retention < r  <=>  elapsed_days > -ln(r) * stability (no exp() per row needed)
    horizon = -math.log(retention_below)
    return [row[0] for row in conn.execute(
        f"SELECT id FROM memories WHERE {ACTIVE} AND importance < ? AND "
        f"(? - coalesce(last_accessed, created_at)) / {decay.SECONDS_PER_DAY} > ? * stability "
        "ORDER BY id LIMIT ?", (importance_below, now, horizon, limit))]


def archive_faded(conn: Connection, ids: Sequence[int], *, now: float) -> list[int]:
    """Archive those of the faded ids still active, in one transaction; returns the ids archived."""
    done = []
    with write_transaction(conn):
        for memory_id in ids:
            memory = store.get_many(conn, [memory_id]).get(memory_id)
            if memory is None or memory.archived_at is not None:
                continue  # forgotten or archived by another process since it was found
            storage_of(conn).archive(conn, memory_id, f"decayed (retention {memory.retention(now):.3f})", now=now)
            done.append(memory_id)
    return done


def list_archived(conn: Connection, *, owner_id: int | None = None, reason: str | None = None,
                  limit: int = 50, offset: int = 0) -> tuple[list[records.Memory], int]:
    """Archived memories, most recently archived first, and how many there are.
    `reason` matches the start of the archive reason (decayed, superseded, consolidated)."""
    where = "archived_at IS NOT NULL"
    params: list = []
    if owner_id is not None:
        where += " AND owner_id = ?"
        params.append(owner_id)
    if reason:
        where += " AND archive_reason LIKE ? ESCAPE '\\'"
        params.append(reason.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%")
    total = query_value(conn, f"SELECT count(*) FROM memories WHERE {where}", params)
    rows = conn.execute(f"SELECT {records.COLUMNS} FROM memories WHERE {where} "
                        "ORDER BY archived_at DESC, id DESC LIMIT ? OFFSET ?", (*params, limit, offset))
    return [records.Memory.from_row(row) for row in rows], total


# -- the id-order scans ---------------------------------------------------------

def scan_batch(conn: Connection, watermark_key: str, limit: int) -> tuple[list[tuple[int, str]], bool]:
    """The next active memories after the watermark, [(id, vis_key)], stopping before the first
    one without a vector; and whether such a blocker was hit."""
    after = int(get_meta(conn, watermark_key) or 0)
    out: list[tuple[int, str]] = []
    for memory_id, vis_key, embedded in conn.execute(
            "SELECT id, vis_key, embedded FROM memories WHERE id > ? AND " + ACTIVE + " ORDER BY id LIMIT ?",
            (after, limit)):
        if not embedded:
            return out, True
        out.append((memory_id, vis_key))
    return out, False


def advance(conn: Connection, watermark_key: str, memory_id: int) -> None:
    """Move a watermark forward to `memory_id` (never back)."""
    with write_transaction(conn):
        current = int(get_meta(conn, watermark_key) or 0)
        if memory_id > current:
            set_meta(conn, watermark_key, str(memory_id))


def write_links(conn: Connection, batch: Sequence[tuple[int, str]],
                found: dict[int, list[tuple[int, float]]], *, threshold: float, now: float) -> int:
    """Semantic links for a scanned batch from its precomputed neighbours (id, cosine), and the
    watermark moved past it: one short transaction on the writer."""
    added = 0
    with write_transaction(conn):
        for memory_id, _ in batch:
            for other, cosine in found.get(memory_id, []):
                if cosine >= threshold:
                    added += add_semantic_link(conn, memory_id, other, cosine, now=now)
        if batch:
            advance(conn, LINKS_WATERMARK, batch[-1][0])
    return added


# -- consolidation -------------------------------------------------------------

def find_clusters(conn: Connection, batch: Sequence[tuple[int, str]],
                  found: dict[int, list[tuple[int, float]]], *, threshold: float) -> list[list[records.Memory]]:
    """Clusters of near-duplicates among a scanned batch and its precomputed neighbours (same
    visibility key, (id, cosine) nearest first). Only the memories above the threshold are read."""
    clusters: list[list[int]] = []
    taken: set[int] = set()
    for memory_id, _ in batch:
        close = [other for other, cosine in found.get(memory_id, []) if cosine >= threshold and other not in taken]
        if memory_id in taken or not close:
            continue
        rows = store.get_many(conn, [memory_id, *close])
        seed = rows.get(memory_id)
        if seed is None or seed.archived_at is not None:
            continue
        members = [memory_id]
        for other_id in close:
            other = rows.get(other_id)
            if other is None or other.archived_at is not None or values_conflict(seed.text, other.text):
                continue
            members.append(other_id)
            if len(members) >= MAX_CLUSTER:
                break
        if len(members) > 1:
            clusters.append(members)
            taken.update(members)
    return [sorted(store.get_many(conn, ids).values(), key=lambda m: (m.created_at, m.id)) for ids in clusters]


def apply_consolidation(conn: Connection, cluster_ids: Sequence[int], merged_text: str | None,
                        vector: Sequence[float] | None, *,
                        model: str, base_stability_days: float, now: float) -> Consolidation | None:
    """One cluster, one transaction: write the survivor (its vector in `model`'s index, the
    members' teachers), archive the others, link them."""
    with write_transaction(conn):
        found = store.get_many(conn, list(cluster_ids))
        members = [found[i] for i in cluster_ids if i in found and found[i].archived_at is None]
        if len(members) < 2 or len({m.vis_key for m in members}) != 1:
            return None  # changed since it was found (restored, archived, recalled elsewhere)
        sources: list[str] = []
        for memory in members:
            sources += [str(s) for s in memory.source_message_ids if str(s) not in sources]
        importance = max(m.importance for m in members)
        stability = max(m.stability for m in members)
        last_seen = max(m.last_accessed or m.created_at for m in members)
        first = min(members, key=lambda m: (m.created_at, m.id))
        if merged_text is not None and normalise(merged_text) not in {normalise(m.text)
                                                                                  for m in members}:
            survivor_id = storage_of(conn).insert(  # the vector goes in only if it fits `model`'s index
                conn, [records.NewMemory(text=merged_text, scope=first.scope, owner_id=first.owner_id,
                                       channel_id=first.channel_id, guild_id=first.guild_id, importance=importance,
                                       created_at=first.created_at, source_message_ids=sources,
                                       private=first.private, happens_on=first.happens_on
                                       if len({m.happens_on for m in members}) == 1 else None)],
                base_stability_days=base_stability_days, model=model,
                vecs=[list(vector)] if vector is not None else None, now=now)[0]
            merged_by, originals = "llm", [m.id for m in members]
        else:
            if merged_text is not None:  # the LLM returned one of the originals verbatim: keep that one
                keep = next(m for m in members if normalise(m.text) == normalise(merged_text))
            else:
                keep = clearest(members)
            survivor_id, merged_by = keep.id, "kept"
            originals = [m.id for m in members if m.id != keep.id]
        conn.execute("UPDATE memories SET importance = ?, stability = ?, last_accessed = ?, source_message_ids = ?, "
                     "updated_at = ? WHERE id = ?",
                     (importance, stability, last_seen, json.dumps(sources), now, survivor_id))
        store.copy_mentions(conn, originals, survivor_id)  # whom the originals named, the survivor names
        # Taught by everyone who taught a member, owned by the earliest: one of them forgetting
        # everything leaves it to the others.
        teachers.merge(conn, survivor_id, [m.id for m in members])
        for original in originals:
            storage_of(conn).archive(conn, original, f"consolidated into #{survivor_id}", now=now)
            storage_of(conn).add_link(conn, survivor_id, original, "consolidated", now=now)
        text = store.get(conn, survivor_id).text
    return Consolidation(survivor_id, originals, merged_by, text)


class Upkeep:
    """`engine.upkeep`: maintenance's named jobs (bot/lifecycle/maintenance.py decides their order)."""

    def __init__(self, jobs: Jobs) -> None:
        self._jobs = jobs

    async def faded(self, *, now: float, retention_below: float, importance_below: float, limit: int) -> list[int]:
        """Active, unimportant memories whose retention fell below the threshold (faded_ids)."""
        return await self._jobs.read(faded_ids, now=now, retention_below=retention_below,
                                     importance_below=importance_below, limit=limit)

    async def archive_faded(self, ids: Sequence[int], *, now: float) -> list[int]:
        """Archive those still active, in one transaction; returns the ids archived."""
        return await self._jobs.write(archive_faded, list(ids), now=now, what=f"archive {len(ids)} faded memories")

    async def archived(self, *, owner_id: int | None = None, reason: str | None = None, limit: int = 50,
                       offset: int = 0) -> tuple[list[records.Memory], int]:
        """Archived memories, most recently archived first, and how many there are (list_archived)."""
        return await self._jobs.read(list_archived, owner_id=owner_id, reason=reason, limit=limit, offset=offset)

    async def scan(self, watermark_key: str, limit: int) -> tuple[list[tuple[int, str]], bool]:
        """The next batch after a watermark (scan_batch)."""
        return await self._jobs.read(scan_batch, watermark_key, limit)

    async def advance(self, watermark_key: str, memory_id: int) -> None:
        """Move a watermark past `memory_id`."""
        await self._jobs.write(advance, watermark_key, memory_id, what="move a maintenance watermark")

    async def write_links(self, batch: Sequence[tuple[int, str]], found: dict[int, list[tuple[int, float]]], *,
                          threshold: float, now: float) -> int:
        """Semantic links for a scanned batch, and the links watermark past it (write_links)."""
        return await self._jobs.write(write_links, batch, found, threshold=threshold, now=now,
                                      what="write semantic links")

    async def clusters(self, batch: Sequence[tuple[int, str]], found: dict[int, list[tuple[int, float]]], *,
                       threshold: float) -> list[list[records.Memory]]:
        """Near-duplicate clusters among a scanned batch (find_clusters)."""
        return await self._jobs.read(find_clusters, batch, found, threshold=threshold)

    async def consolidate(self, cluster_ids: Sequence[int], merged_text: str | None, vector: Sequence[float] | None,
                          *, model: str, base_stability_days: float, now: float) -> Consolidation | None:
        """One cluster merged in one transaction (apply_consolidation)."""
        return await self._jobs.write(apply_consolidation, list(cluster_ids), merged_text, vector, model=model,
                                      base_stability_days=base_stability_days, now=now,
                                      what=f"consolidate {list(cluster_ids)}")

    async def prune_vector_changes(self) -> int:
        """Drop all but the newest entries of the vector change log."""
        return await self._jobs.write(vec0.prune_changes, what="prune the vector change log")

    async def vector_indexes(self, min_vectors: int, build_mb: int) -> tuple[int, int]:
        """The big keys' own ANN indexes made and the obsolete or invalid ones dropped (PostgreSQL;
        vector_indexes.py): (made, dropped). The builds run on a thread and a connection of their own."""
        job = await self._jobs.read(vector_indexes.planned, min_vectors)
        if job is None or job.empty:
            return (0, 0)
        try:
            return await asyncio.to_thread(vector_indexes.carried_out, job, build_mb)
        except asyncio.CancelledError:  # the bot stops: a build of minutes must not hold it
            job.cancel()
            raise

    async def prune_history(self, keep: int) -> int:
        """Every channel's history down to its newest `keep` messages."""
        return await self._jobs.write(history.prune_all, keep, what="prune the history")
