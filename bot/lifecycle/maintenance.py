"""Periodic maintenance: departed servers purged, decay archival, missing embeddings, missing
links, consolidation, history pruning.

`run_maintenance` is what `muninn maintain` and the bot's periodic task call. Each
step commits in small transactions (one batch of archivals, one cluster) and
remembers how far it got, so it is safe to interrupt and idempotent: a second run
right after the first finds nothing to do.

  servers        purge what Muninn kept of each server it was removed from more than
                 MUNINN_GUILD_RETENTION_DAYS ago and was not added back to (engine.guilds:
                 one transaction per server, then a scrub of the database files).
  decay          archive active memories whose retention fell below
                 MUNINN_ARCHIVE_RETENTION and whose importance is below
                 MUNINN_ARCHIVE_IMPORTANCE. Archived memories leave retrieval and stay
                 in the database: `list_archived` shows them, `Engine.restore` brings one back.
  embeddings     engine.backfill: vectors for memories stored while Ollama was away.
  consolidation  near-duplicates (cosine >= MUNINN_DEDUP_COSINE, value guard passed)
                 under one visibility key are merged: the LLM writes one sentence, or
                 without an LLM the clearest original is kept; the others are archived and
                 linked from the survivor as `consolidated`. Never across scopes or owners.
  links          semantic links for memories that have none checked yet.

The links and consolidation steps scan memories in id order and keep a watermark in
`meta`; they stop at the first memory without a vector (it is scanned once the
backfill has embedded it), so nothing is skipped and nothing is scanned twice. The
neighbours of each scanned batch are found once per run for both steps (`Neighbours`), on a
read connection, one matrix product per visibility key; the writer only holds the short
transactions that write links and merges, so recalls never wait long behind maintenance.
"""
from __future__ import annotations

import asyncio
import functools
import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Awaitable, Callable, Sequence

import numpy as np

from bot import validate
from bot.lifecycle.facts import FIRST_PERSON, GENERIC_SUBJECT
from bot.llm.answers import ask_json
from bot.memory import records
from bot.memory.engine import Engine
from bot.memory.guilds import Purged
from bot.memory.sql import leases
from bot.memory.writing import rules
from bot.memory.writing.upkeep import CONSOLIDATION_WATERMARK, LINKS_WATERMARK, Consolidation

log = logging.getLogger(__name__)

ARCHIVE_BATCH = 500
SCAN_BATCH = 200
CLUSTER_NEIGHBOURS = 8
NEIGHBOURS = max(CLUSTER_NEIGHBOURS, rules.LINK_NEIGHBOURS)
KEPT_NEIGHBOURS = 200_000  # memories whose neighbours wait for the links pass (~300 bytes each)


@dataclass
class MaintenanceReport:
    """What one maintenance run did: the departed servers purged, the ids decay archived, the
    vectors added, the clusters merged, the links added, the history rows pruned, and how long it took."""
    guilds_purged: list[Purged] = field(default_factory=list)
    archived: list[int] = field(default_factory=list)
    embedded: int = 0
    consolidated: list[Consolidation] = field(default_factory=list)
    links: int = 0
    history_pruned: int = 0
    seconds: float = 0.0

    def to_dict(self) -> dict:
        """The report as plain data, for `muninn maintain`'s output; its seconds rounded to milliseconds."""
        out = asdict(self)
        out["seconds"] = round(self.seconds, 3)
        return out

    def lines(self) -> list[str]:
        """One line per step, in the order of the run: servers, decay, embeddings, consolidation,
        links, history (decay's line lists only the first archived ids)."""
        merged = sum(len(c.originals) for c in self.consolidated)
        purged = self.guilds_purged
        return [f"servers: purged {len(purged)} servers Muninn was removed from "
                f"({sum(p.memories for p in purged)} memories, {sum(p.messages for p in purged)} messages; "
                "MUNINN_GUILD_RETENTION_DAYS)",
                f"decay: archived {len(self.archived)} faded memories"
                + (f" ({', '.join(f'#{i}' for i in self.archived[:20])}{' ...' if len(self.archived) > 20 else ''})"
                   if self.archived else ""),
                f"embeddings: added {self.embedded} missing vectors",
                f"consolidation: merged {merged} near-duplicates into {len(self.consolidated)} memories",
                f"links: added {self.links} semantic links",
                f"history: dropped {self.history_pruned} old messages (MUNINN_HISTORY_KEEP per channel)"]


# -- decay ---------------------------------------------------------------------

async def archive_decayed(engine: Engine, *, now: float | None = None) -> list[int]:
    """Decay: archive the memories faded as of `now` (retention below MUNINN_ARCHIVE_RETENTION, importance below
    MUNINN_ARCHIVE_IMPORTANCE), one transaction per batch, until none is left; returns the ids archived."""
    settings = engine.settings
    now = time.time() if now is None else now
    archived: list[int] = []
    while True:
        ids = await engine.upkeep.faded(now=now, retention_below=settings.archive_retention,
                                        importance_below=settings.archive_importance, limit=ARCHIVE_BATCH)
        if not ids:
            return archived
        archived += await engine.upkeep.archive_faded(ids, now=now)


async def archived(engine: Engine, *, reason: str | None = None, limit: int = 50) -> tuple[list[records.Memory], int]:
    """`muninn maintain --archived`: see list_archived."""
    return await engine.upkeep.archived(reason=reason, limit=limit)


# -- neighbours -------------------------------------------------------------------

class Neighbours:
    """The nearest neighbours of scanned memories, found once per maintenance run: the
    consolidation pass and the links pass scan the same memories, and the search (a matrix
    product per visibility key, on a read connection) is the expensive part. Kept as small
    arrays until the links pass takes them; memories archived in between are skipped there."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self._found: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    async def of(self, batch: Sequence[tuple[int, str]], k: int, *,
                 keep: bool) -> dict[int, list[tuple[int, float]]] | None:
        """{memory id: [(other id, cosine)], nearest first} for the batch; None without an index."""
        missing = [(mid, key) for mid, key in batch if mid not in self._found]
        if missing:
            # after the recalls in flight: a search that overlaps a recall shares the cores and the GIL
            # with it (in smaller steps each would read a big key's vectors again: much longer runs)
            await self.engine.yield_to_recalls()
            found = await self.engine.nearest_neighbours(missing, NEIGHBOURS)
            if found is None:
                return None
            for mid, pairs in found.items():
                if len(self._found) >= KEPT_NEIGHBOURS and keep:  # beyond it, the links pass searches again
                    self._found.pop(next(iter(self._found)))
                self._found[mid] = (np.array([o for o, _ in pairs], dtype=np.int64),
                                    np.array([c for _, c in pairs], dtype=np.float32))
        out = {}
        for mid, _ in batch:
            entry = self._found.get(mid) if keep else self._found.pop(mid, None)
            if entry is not None:
                ids, cosines = entry
                out[mid] = list(zip(ids[:k].tolist(), cosines[:k].tolist(), strict=True))
        return out


# -- links ------------------------------------------------------------------------

async def build_links(engine: Engine, *, now: float | None = None, neighbours: Neighbours | None = None) -> int:
    """The neighbours of each batch are found on a read connection (one matrix product per
    visibility key), so the writer only holds the short link-writing transaction."""
    now = time.time() if now is None else now
    neighbours = neighbours or Neighbours(engine)
    total = 0
    while True:
        batch, blocked = await engine.upkeep.scan(LINKS_WATERMARK, SCAN_BATCH)
        if not batch:
            return total
        found = await neighbours.of(batch, rules.LINK_NEIGHBOURS, keep=False)
        if found is None:  # no usable index (none yet, or a reindex is pending)
            return total
        await engine.yield_to_recalls()  # the writer serves the recalls' touches
        total += await engine.upkeep.write_links(batch, found, threshold=engine.settings.link_cosine, now=now)
        if blocked:
            return total


# -- consolidation -------------------------------------------------------------

MERGE_SCHEMA = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}

MERGE_SYSTEM = (
    "You merge memories that say nearly the same thing about the same subject into ONE short, "
    "self-contained sentence in the third person that keeps every detail. If they disagree, the newest "
    "(last) one is right. Name the subject as the memories do; never write I, me, my, you or \"the user\". "
    "Add nothing that is not in the memories. Reply with JSON only: {\"text\": \"...\"}")


def merge_messages(memories: Sequence[records.Memory]) -> list[dict[str, str]]:
    """The consolidation prompt: the cluster's memories in the order given (clusters
    come oldest first), each with its date, to be merged into one sentence."""
    listing = "\n".join(f"{i}. ({(records.iso(m.created_at) or '')[:10]}) {m.text}" for i, m in enumerate(memories, start=1))
    return [{"role": "system", "content": MERGE_SYSTEM}, {"role": "user", "content": f"Memories, oldest first:\n{listing}"}]


def check_merge(data: Any, memories: Sequence[records.Memory]) -> tuple[str, list[str]]:
    """The merged sentence, or ValueError: empty, first person, or a value none of the originals has.
    The reasons are logged, so they never quote the memories."""
    if isinstance(data, str):
        data = {"text": data}
    if not isinstance(data, dict) or not isinstance(data.get("text"), str):
        raise ValueError("expected {\"text\": \"...\"}")
    text = " ".join(validate.stored_text(data["text"], "'text'").split())
    if not 3 <= len(text) <= records.MAX_TEXT_CHARS:
        raise ValueError("'text' is empty or too long")
    if FIRST_PERSON.search(text) or GENERIC_SUBJECT.search(text):
        raise ValueError("'text' uses I/me/you or 'the user': name the subject")
    known: set[str] = set()
    for memory in memories:
        known |= rules.value_tokens(memory.text)
    invented = rules.value_tokens(text) - known
    if invented:  # the reason is logged: it names how many, not which (those are the memory's words)
        raise ValueError(f"'text' adds {len(invented)} name(s) or number(s) that no memory has")
    return text, []


async def consolidate(engine: Engine, *, now: float | None = None, use_llm: bool = True,
                      neighbours: Neighbours | None = None) -> list[Consolidation]:
    """Consolidation: merge the near-duplicate clusters (cosine >= MUNINN_DEDUP_COSINE) of each
    scanned batch, one transaction per cluster; the LLM writes the merged sentence when `use_llm`
    and Ollama allow, else the clearest original is kept. Moves the watermark past each batch, stops
    at the first memory without a vector (or at once without a usable index); returns what was merged."""
    settings = engine.settings
    now = time.time() if now is None else now
    neighbours = neighbours or Neighbours(engine)
    done: list[Consolidation] = []
    while True:
        batch, blocked = await engine.upkeep.scan(CONSOLIDATION_WATERMARK, SCAN_BATCH)
        if not batch:
            return done
        found = await neighbours.of(batch, CLUSTER_NEIGHBOURS, keep=True)
        if found is None:  # no usable index
            return done
        clusters = await engine.upkeep.clusters(batch, found, threshold=settings.dedup_cosine)
        for members in clusters:
            merged_text = None
            if use_llm and engine.ollama.enabled:
                merged_text = await ask_json(engine.ollama, merge_messages(members), MERGE_SCHEMA,
                                             functools.partial(check_merge, memories=members),
                                             what=f"consolidation of {[m.id for m in members]}")
            vector = None
            if merged_text is not None:
                vecs = await engine.embed_or_none([merged_text])
                vector = vecs[0] if vecs else None
            result = await engine.upkeep.consolidate([m.id for m in members], merged_text, vector,
                                                     model=engine.settings.embed_model,
                                                     base_stability_days=settings.base_stability_days, now=now)
            if result is not None:
                log.info("consolidated %s into #%d (%s)", result.originals, result.survivor, result.merged_by)
                done.append(result)
        await engine.upkeep.advance(CONSOLIDATION_WATERMARK, batch[-1][0])
        if blocked:
            return done


# -- the whole task ----------------------------------------------------------------

async def run_maintenance(engine: Engine, *, now: float | None = None, use_llm: bool = True,
                          on_step: Callable[[str], None] | None = None) -> MaintenanceReport:
    """Departed servers, decay, embeddings, consolidation, links, in that order (a purged server's
    memories are neither embedded nor linked, archived memories are not embedded, and clusters and
    links need the vectors). Each step's line goes to `on_step`."""
    started = time.perf_counter()
    report = MaintenanceReport()
    report.guilds_purged = await engine.guilds.purge_departed(engine.settings.guild_retention_days, now=now)
    _say(on_step, report.lines()[0])
    report.archived = await archive_decayed(engine, now=now)
    _say(on_step, report.lines()[1])
    report.embedded = await engine.backfill()
    _say(on_step, report.lines()[2])
    neighbours = Neighbours(engine)  # one search per memory serves both passes
    report.consolidated = await consolidate(engine, now=now, use_llm=use_llm, neighbours=neighbours)
    _say(on_step, report.lines()[3])
    report.links = await build_links(engine, now=now, neighbours=neighbours)
    await engine.upkeep.prune_vector_changes()
    await engine.upkeep.vector_indexes(engine.settings.vector_index_min, engine.settings.vector_index_build_mb)
    await engine.finish_scrub()  # forgotten memories' vectors, on PostgreSQL (postgres/scrub.py)
    _say(on_step, report.lines()[4])
    report.history_pruned = await engine.upkeep.prune_history(engine.settings.history_keep)
    _say(on_step, report.lines()[5])
    report.seconds = time.perf_counter() - started
    return report


def _say(on_step: Callable[[str], None] | None, line: str) -> None:
    if on_step is not None:
        on_step(line)


MAINTENANCE_LEASE = "maintenance"
LEASE_SECONDS = 90.0      # a holder that died blocks maintenance this long at most


async def maintain_periodically(engine: Engine, *, hours: float | None = None, first_delay: float = 60.0,
                                lease_seconds: float = LEASE_SECONDS, holder: str | None = None) -> None:
    """The bot's background task: run maintenance every `hours` (MUNINN_MAINTENANCE_HOURS) until
    cancelled. A failed run is logged and retried at the next interval.

    Several bot processes (shards) may share the database: only the holder of the maintenance
    lease (`bot.memory.sql.leases`, renewed every third of `lease_seconds`) runs it, and the time of
    the last run is kept in the database, so a process that takes over after the holder stopped
    or died keeps the same schedule instead of starting one of its own."""
    hours = engine.settings.maintenance_hours if hours is None else hours
    if hours <= 0:
        return
    holder = holder or leases.new_holder()
    held = False
    not_before = time.time() + first_delay
    try:
        while True:
            taken = await engine.take_lease(MAINTENANCE_LEASE, holder, lease_seconds)
            if taken != held:
                held = taken
                log.info("this process %s the periodic maintenance", "now runs" if held else "no longer runs")
            if held:
                last = await engine.last_run(MAINTENANCE_LEASE)
                due = max(not_before, (last or 0.0) + hours * 3600)
                if time.time() >= due:
                    await _run_holding(engine, holder, lease_seconds)
                    continue
            await asyncio.sleep(lease_seconds / 3)
    finally:
        if held:
            try:
                await engine.release_lease(MAINTENANCE_LEASE, holder)
            except Exception as exc:  # the engine is closing; the lease expires on its own
                log.debug("could not release the maintenance lease: %s", exc)


class MaintenanceBusy(Exception):
    """Another process holds the maintenance lease (it is running, or about to run, maintenance)."""

    def __init__(self, holder: str | None):
        super().__init__(f"maintenance is already running in another process ({holder or 'unknown'}); "
                         "wait for it to finish, it takes over the schedule")
        self.holder = holder


async def run_with_lease(engine: Any, *, use_llm: bool = True, on_step: Callable[[str], None] | None = None,
                         lease_seconds: float = LEASE_SECONDS, holder: str | None = None) -> MaintenanceReport:
    """One maintenance run for `muninn maintain`: only while holding the lease the bot processes
    use, so a run from the command line never overlaps the bot's own (two runs would embed,
    link and consolidate the same memories twice); recorded as the last run, so the bot's
    schedule counts it. Raises MaintenanceBusy when another process holds the lease."""
    holder = holder or leases.new_holder()
    if not await engine.take_lease(MAINTENANCE_LEASE, holder, lease_seconds):
        other = await engine.lease_holder(MAINTENANCE_LEASE)
        # A run killed on this machine (kill -9, a crash) left its lease: not "running in another
        # process". Release only that holder's (atomic), then take it like any free lease.
        if not (other is not None and leases.abandoned(other)
                and await engine.release_lease(MAINTENANCE_LEASE, other)
                and await engine.take_lease(MAINTENANCE_LEASE, holder, lease_seconds)):
            raise MaintenanceBusy(await engine.lease_holder(MAINTENANCE_LEASE))
        log.warning("took over the maintenance lease of %s: that process of this machine is gone (killed?)", other)
    try:
        report = await _holding(engine, holder, lease_seconds,
                                lambda: run_maintenance(engine, use_llm=use_llm, on_step=on_step))
        await engine.record_run(MAINTENANCE_LEASE, time.time())
        return report
    finally:
        await engine.release_lease(MAINTENANCE_LEASE, holder)


async def _holding(engine: Any, holder: str, lease_seconds: float,
                   job: Callable[[], Awaitable[MaintenanceReport]]) -> MaintenanceReport:
    """Run `job`, renewing the lease while it lasts (a run may outlast the lease)."""
    async def renew() -> None:
        while True:
            await asyncio.sleep(lease_seconds / 3)
            if not await engine.take_lease(MAINTENANCE_LEASE, holder, lease_seconds):
                log.warning("the maintenance lease was lost during a run (was this process paused?)")
    renewing = asyncio.create_task(renew())
    try:
        return await job()
    finally:
        renewing.cancel()


async def _run_holding(engine: Any, holder: str, lease_seconds: float) -> None:
    """One periodic maintenance run of the lease holder; a failure waits for the next interval."""
    try:
        report = await _holding(engine, holder, lease_seconds, lambda: run_maintenance(engine))
        log.info("maintenance: %s", "; ".join(report.lines()))
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("maintenance run failed; trying again at the next interval")
    await engine.record_run(MAINTENANCE_LEASE, time.time())
