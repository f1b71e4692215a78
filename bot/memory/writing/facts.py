"""Storing extracted facts, on the database thread: duplicates reinforced, updates that
supersede, semantic and co_extracted links, all of one author's facts in one transaction.

Subjects and owners. A memory's *subject* is who or what it is about: the owner for a personal
memory (wherever it was learned), the channel for a room memory, nobody for a global one.
De-duplication and semantic links stay inside one visibility key (same scope, same owner or
room, and for personal memories the same place learned), so reinforcing or linking never
changes who can see what. An update may archive an older memory of the same subject learned
elsewhere (Alice's old city from a DM when she announces her new one in a server): the fact is
outdated everywhere. Nothing here ever touches a memory of another subject.

Fair share. One person teaches at most MUNINN_LEARN_PER_DAY new memories in one channel (or DM)
in 24 hours (LearnBudget, counted inside the write's transaction): their further facts are
dropped, while a fact that repeats a memory still reinforces it (that is not a new memory).

Room memories under moderation (sql/rooms.py): a claim waiting for a moderator is stored
archived, as pending; it replaces nothing, links to nothing, and only the same words already
shown or already waiting absorb it. A moderator's fact is vouched for, also when it repeats a
member's claim. A member's claim never supersedes a memory a moderator vouched for.
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from bot.memory import records
from bot.memory.connection import Connection
from bot.memory.jobs import Jobs
from bot.memory.recall.words import tokens
from bot.memory.records import PENDING, SET, NewMemory
from bot.memory.scope import ACTIVE, personal_keys
from bot.memory.sql import rooms, store, teachers
from bot.memory.sql.queries import query_value
from bot.memory.sql.transactions import write_transaction
from bot.memory.storage import storage_of
from bot.memory.vectors import index as vectors
from bot.memory.writing.rules import (
    DUPLICATE_NEIGHBOURS,
    FACT_NEIGHBOURS,
    LINK_NEIGHBOURS,
    UPDATE_CANDIDATES,
    UpdateDecision,
    normalise,
    same_subject,
    values_conflict,
)
from bot.settings import Settings

log = logging.getLogger(__name__)

def subject_keys(conn: Connection, memory: records.NewMemory | records.Memory,
                 personal: dict[int, list[str]] | None = None) -> list[str]:
    """Visibility keys holding memories about the same subject as `memory`. `personal`: owners'
    personal_keys read already (storage.plan_state)."""
    keys = [memory.vis_key]
    if memory.scope == "personal" and memory.owner_id is not None:
        owned = personal[memory.owner_id] if personal is not None else personal_keys(conn, memory.owner_id)
        keys += [key for key in owned if key != memory.vis_key]
    return keys


SAME_TEXT_LIMIT = 50   # memories holding every word of a new fact, checked for the same text


def same_text_match(conn: Connection, vis_key: str, text: str,
                    found: Sequence[tuple[int, str]] | None = None) -> int | None:
    """An active memory under `vis_key` whose normalised text equals `text`'s. `found`: the
    keyword search of `text`'s words under `vis_key` the caller has made (storage.begin_fact_write)."""
    wanted = normalise(text)
    words = tokens(text)
    rows: Any
    if words and found is not None:
        rows = found
    elif words:
        rows = storage_of(conn).keyword_search(conn, words, [vis_key], all_words=True, limit=SAME_TEXT_LIMIT)
    else:  # only stop words: compare directly (rare, short texts)
        rows = conn.execute("SELECT id, text FROM memories WHERE vis_key = ? AND " + ACTIVE +
                            " ORDER BY id LIMIT 500", (vis_key,))
    for memory_id, other in rows:
        if normalise(other) == wanted:
            return memory_id
    return None


def nearest(conn: Connection, info: vectors.IndexInfo | None, vector: Sequence[float] | None,
            keys: list[str], k: int) -> list[tuple[int, float]]:
    """[(memory id, cosine)] of the k nearest active memories under `keys`, best first."""
    if info is None or vector is None or not keys or len(vector) != info.dim:
        return []
    return [(mid, vectors.cosine_from_distance(d)) for mid, d in storage_of(conn).knn(conn, info, vector, keys, k)]


def texts_of(conn: Connection, ids: Sequence[int]) -> dict[int, str]:
    """The texts of those of the ids that exist, by id."""
    return {mid: m.text for mid, m in store.get_many(conn, list(ids)).items()}


def find_duplicate(conn: Connection, info: vectors.IndexInfo | None, memory: records.NewMemory,
                   vector: Sequence[float] | None, threshold: float,
                   near: Sequence[tuple[int, float]] | None = None,
                   same_words: Sequence[tuple[int, str]] | None = None) -> int | None:
    """An active memory with the same visibility key that says the same thing, if any. `near`:
    the caller's `nearest(..., [memory.vis_key], k >= DUPLICATE_NEIGHBOURS)`, to search once;
    `same_words`: its keyword search for the exact-text check (`same_text_match`)."""
    match = same_text_match(conn, memory.vis_key, memory.text, same_words)
    if match is not None and same_time(conn, memory, match):
        return match
    if near is None:
        near = nearest(conn, info, vector, [memory.vis_key], DUPLICATE_NEIGHBOURS)
    hits = [(mid, cos) for mid, cos in near[:DUPLICATE_NEIGHBOURS] if cos >= threshold]
    texts = texts_of(conn, [mid for mid, _ in hits])
    for memory_id, _ in hits:
        if memory_id in texts and not values_conflict(memory.text, texts[memory_id]) \
                and same_time(conn, memory, memory_id):
            return memory_id
    return None


def same_time(conn: Connection, memory: records.NewMemory, memory_id: int) -> bool:
    """Whether the stored memory may be the same fact as `memory` by their dates: "Alice sees the
    dentist on Friday" said in two weeks is two appointments. A side without a date matches."""
    if memory.happens_on is None:
        return True
    stored = query_value(conn, "SELECT happens_on FROM memories WHERE id = ?", (memory_id,))
    return stored is None or records.Memory.happens_of(stored) in (None, memory.happens_on)


def update_candidates(conn: Connection, info: vectors.IndexInfo | None, memory: records.NewMemory,
                      vector: Sequence[float] | None, *, threshold: float, subject_name: str | None = None,
                      exclude: Sequence[int] = (), limit: int = UPDATE_CANDIDATES,
                      near: Sequence[tuple[int, float]] | None = None,
                      keys: list[str] | None = None) -> list[tuple[int, str]]:
    """Older active memories of the same subject that the new fact might update: the vector
    neighbours above `threshold`, or without vectors the keyword matches on its content words
    (the subject's name left out, since every memory about Alice contains "Alice"). `near`: the
    caller's `nearest(..., [memory.vis_key], k)`, used when that key is the subject's only one.
    `keys`: subject_keys(conn, memory) when the caller has read them (storage.plan_state)."""
    keys = subject_keys(conn, memory) if keys is None else keys
    if info is not None and vector is not None:
        wanted = limit + len(exclude)
        if near is None or keys != [memory.vis_key] or len(near) < wanted:
            near = nearest(conn, info, vector, keys, wanted)
        ids = [mid for mid, cos in near[:wanted] if cos >= threshold]
    else:
        name_words = set(tokens(subject_name or ""))
        words = [w for w in tokens(memory.text) if w not in name_words]
        if not words:
            return []
        ids = [memory_id for memory_id, _ in storage_of(conn).keyword_search(
            conn, words, keys, all_words=False, limit=limit + len(exclude))]
    texts = texts_of(conn, ids)
    return [(mid, texts[mid]) for mid in ids if mid not in exclude and mid in texts][:limit]


def reinforce(conn: Connection, memory_id: int, *, importance: float, source_ids: Sequence[Any],
              growth: float, now: float, teacher: int | None = None, taught_at: float | None = None) -> None:
    """The same fact was stated again: strengthen the memory instead of storing a copy. `teacher`:
    who stated it, for a room memory (they teach it from now on, if they did not already:
    sql/teachers.py; `taught_at`, or `now`, is when)."""
    with write_transaction(conn):
        row = conn.execute("SELECT m.source_message_ids, t.source_message_ids FROM memories m "
                           "LEFT JOIN memory_teachers t ON t.memory_id = m.id AND t.user_id = ? WHERE m.id = ?",
                           (teacher, memory_id)).fetchall()
        raw, known = row[0] if row else ("[]", None)
        sources = [str(s) for s in json.loads(raw or "[]")]
        sources += [str(s) for s in source_ids if str(s) not in sources]
        taught = None if teacher is None else (teacher, now if taught_at is None else taught_at,
                                               teachers.merged_sources(known, source_ids))
        storage_of(conn).reinforce(conn, memory_id, importance=importance, sources=sources, growth=growth, now=now,
                                   teacher=taught)


def supersede(conn: Connection, old_id: int, new_id: int, *, now: float) -> bool:
    """Archive `old_id` in favour of `new_id` (which must exist, be active and be about the
    same subject), linking old -> new as superseded_by. Returns whether it happened."""
    if old_id == new_id:
        return False
    with write_transaction(conn):
        found = store.get_many(conn, [old_id, new_id])
        old, new = found.get(old_id), found.get(new_id)
        if old is None or new is None or old.archived_at is not None or new.archived_at is not None:
            return False
        if not same_subject(old, new):
            return False
        storage_of(conn).archive(conn, old_id, f"superseded by #{new_id}", now=now)
        storage_of(conn).add_link(conn, old_id, new_id, "superseded_by", now=now)
    return True


def link_similar(conn: Connection, info: vectors.IndexInfo | None, memory_id: int, vis_key: str, *,
                 threshold: float, now: float, k: int = LINK_NEIGHBOURS,
                 neighbours: Sequence[tuple[int, float]] | None = None) -> int:
    """Semantic links between `memory_id` and its nearest memories under the same visibility
    key. One row per pair, always newer -> older, so re-running adds nothing. `neighbours`
    ((id, cosine), nearest first) saves the search when the caller has just made it.
    Returns new links."""
    if info is None:
        return 0
    if neighbours is None:
        neighbours = [(other, vectors.cosine_from_distance(distance))
                      for other, distance in storage_of(conn).similar_to_memory(conn, info, memory_id, [vis_key], k)]
    close = [(other, cosine) for other, cosine in neighbours[:k] if other != memory_id and cosine >= threshold]
    if not close:  # no transaction (inside a fact write: no savepoint, two round trips on PostgreSQL)
        return 0
    added = 0
    with write_transaction(conn):
        for other, cosine in close:
            added += add_semantic_link(conn, memory_id, other, cosine, now=now)
    return added


def add_semantic_link(conn: Connection, memory_id: int, other: int, cosine: float, *, now: float) -> int:
    """One semantic link (newer -> older) unless the pair has one or either side left retrieval; 1 if added."""
    source, target = max(memory_id, other), min(memory_id, other)
    exists = query_value(conn, "SELECT count(*) FROM memory_links WHERE kind = 'semantic' AND "
                               "((source_id = ? AND target_id = ?) OR (source_id = ? AND target_id = ?))",
                         (source, target, target, source))
    if exists or query_value(conn, f"SELECT count(*) FROM memories WHERE id IN (?, ?) AND {ACTIVE}",
                             (source, target)) != 2:
        return 0
    storage_of(conn).add_link(conn, source, target, "semantic", weight=round(cosine, 4), now=now)
    return 1


# plan_updates' answer: per fact the memories to judge and its search, the change mark, the counts for the cap
Plan = tuple[list[list[tuple[int, str]]], list[list[tuple[int, float]] | None], Any, dict[tuple[int, int], int]]


@dataclass
class WriteOutcome:
    """What `write_facts` did with each fact, in order."""
    ids: list[int] = field(default_factory=list)          # stored or reinforced memory id per fact (none if dropped)
    inserted: list[int] = field(default_factory=list)
    reinforced: list[int] = field(default_factory=list)
    superseded: list[tuple[int, int]] = field(default_factory=list)  # (old, new)
    pending: list[int] = field(default_factory=list)      # inserted as room claims waiting for a moderator
    # (owner, channel) -> (facts dropped, memories taught there in the 24 hours before): over MUNINN_LEARN_PER_DAY
    dropped: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)


DAY_S = 86_400.0


class LearnBudget:
    """How many new memories each person may still teach in each channel: `per_day` (0 = no cap)
    less what they taught there in the 24 hours before (store.taught_since), counted down as this
    write inserts. `taught`: those counts as the write's planning read them (plan_updates; the
    writes of one person in one channel come from one process, one after another); a pair it
    lacks is counted inside the write's transaction, as of `now`."""

    def __init__(self, conn: Connection, per_day: int, now: float,
                 taught: dict[tuple[int, int], int] | None = None) -> None:
        self._conn, self._per_day, self._now = conn, per_day, now
        self._taught: dict[tuple[int, int], int] = dict(taught or {})   # before this write
        self._added: dict[tuple[int, int], int] = {}                    # by this write

    def take(self, memory: NewMemory, out: WriteOutcome) -> bool:
        """Whether `memory` may be stored as a new memory (and count it); False records it in `out.dropped`."""
        if self._per_day <= 0 or memory.owner_id is None or memory.channel_id is None:
            return True
        key = (memory.owner_id, memory.channel_id)
        if key not in self._taught:
            self._taught[key] = store.taught_since(self._conn, *key, self._now - DAY_S)
        added = self._added.get(key, 0)
        if self._taught[key] + added >= self._per_day:
            dropped, _ = out.dropped.get(key, (0, 0))
            out.dropped[key] = (dropped + 1, self._taught[key] + added)
            return False
        self._added[key] = added + 1
        return True


def write_facts(conn: Connection, memories: Sequence[records.NewMemory],
                vecs: Sequence[Sequence[float]] | None, decisions: Sequence[UpdateDecision | None], *,
                settings: Settings, now: float, searched: Sequence[list[tuple[int, float]] | None] = (),
                searched_mark: Any = None, taught: dict[tuple[int, int], int] | None = None) -> WriteOutcome:
    """Store the facts of one exchange in ONE transaction: for each fact, reinforce its
    duplicate or insert it (with its vector; or drop it past its author's MUNINN_LEARN_PER_DAY
    here: LearnBudget), archive what it replaces, link it to similar memories; then link the
    exchange's memories pairwise as co_extracted. A failure anywhere rolls back all of it.
    Vectors go in the embedding model's index (created on the first embedding); when they do
    not fit it, the facts are stored without them. The thresholds, the stability constants and
    the cap come from `settings`. `searched`: each fact's `nearest(...,
    [its vis_key], FACT_NEIGHBOURS)` made by the planning step at `storage.plan_state`'s
    mark `searched_mark`; reused when no vector was stored or removed since. `taught`: what the
    planning counted for the cap (LearnBudget)."""
    out = WriteOutcome()
    storage = storage_of(conn)
    budget = LearnBudget(conn, settings.learn_per_day, now, taught)
    probes = [(m.vis_key, tokens(m.text)) for m in memories]
    with write_transaction(conn):
        # The keys' locks (other processes' facts: stored before, or after), the index, whether
        # any vector changed since the planning search and each fact's exact-text duplicate
        # check, in one step (PostgreSQL: one round trip; the lock is held from here to COMMIT).
        info, unchanged, same_words = storage.begin_fact_write(
            conn, [m.vis_key for m in memories], settings.embed_model, len(vecs[0]) if vecs else None,
            searched_mark if any(s is not None for s in searched) else None, probes, SAME_TEXT_LIMIT,
            [memory_id for near in searched if near for memory_id, _ in near])
        added: list[tuple[str, int, str]] = []   # (vis_key, id, text) stored by this write
        archived: set[int] = set()
        for index, memory in enumerate(memories):
            vector = vecs[index] if vecs and info is not None else None
            decision = (decisions[index] if index < len(decisions) else None) or UpdateDecision()
            # A claim waiting for a moderator changes nothing that is shown: it replaces no memory,
            # and only the same words already shown or already waiting absorb it.
            waits = memory.standing == PENDING
            if waits:
                decision = UpdateDecision()
            # One search serves the duplicate check and the semantic links (same key, same vector);
            # the planning one while no vector changed, in other processes or in this write.
            earlier = searched[index] if index < len(searched) else None
            if earlier is not None and vector is not None and unchanged and not (out.inserted or archived):
                near = earlier
            else:
                near = nearest(conn, info, vector, [memory.vis_key], FACT_NEIGHBOURS)
            # the exact-text check read at the start, with what this write has stored or archived since
            words_found = [(mid, text) for mid, text in same_words[index] if mid not in archived]
            words_found += [(mid, text) for key, mid, text in added if key == memory.vis_key]
            target = find_duplicate(conn, info, memory, vector, settings.dedup_cosine, near=near,
                                    same_words=words_found)
            if target is None:
                target = rooms.pending_twin(conn, memory.vis_key, memory.text) if waits else \
                    _llm_duplicate(conn, memory, decision)
            if target is not None:
                reinforce(conn, target, importance=memory.importance, source_ids=memory.source_message_ids,
                          growth=settings.stability_growth, now=now,
                          teacher=memory.owner_id if memory.scope == "room" else None, taught_at=memory.created_at)
                out.reinforced.append(target)
                if memory.happens_on is not None:  # the fact said again, now with its date
                    conn.execute("UPDATE memories SET happens_on = ? WHERE id = ? AND happens_on IS NULL",
                                 (memory.happens_on, target))
                if memory.standing == SET:  # a moderator said what a member had: approved
                    rooms.vouch(conn, target, rooms.APPROVED, memory.owner_id, now)
            elif not budget.take(memory, out):
                continue  # its author's share of new memories here is used up: neither stored nor replacing anything
            else:
                target = storage.insert(conn, [memory], base_stability_days=settings.base_stability_days,
                                        model=settings.embed_model,
                                        vecs=[list(vector)] if vector is not None and not waits else None,
                                        now=now, info=info)[0]
                rooms.settle(conn, target, memory, now)
                out.inserted.append(target)
                if waits:
                    out.pending.append(target)
                else:
                    added.append((memory.vis_key, target, memory.text))
                    link_similar(conn, info, target, memory.vis_key, threshold=settings.link_cosine, now=now,
                                 neighbours=near)
            # A member's room claim never retires what a moderator set or approved.
            vouched = rooms.approvals(conn, decision.replaces) if memory.scope == "room" and not memory.standing \
                else {}
            # the people it names may find and erase it, whichever memory holds it now
            store.add_mentions(conn, target, memory.mentions)
            for old in decision.replaces:
                if old != target and old not in vouched and supersede(conn, old, target, now=now):
                    out.superseded.append((old, target))
                    archived.add(old)
            out.ids.append(target)
        for a, b in store.pairs([memory_id for memory_id in out.ids if memory_id not in out.pending]):
            storage.add_link(conn, a, b, "co_extracted", now=now)
    return out


def _llm_duplicate(conn: Connection, memory: records.NewMemory, decision: UpdateDecision) -> int | None:
    """The first memory the LLM called the same fact, if it is still active and shares the
    new fact's visibility key (reinforcing it must not change who can see the fact)."""
    if not decision.same:
        return None
    found = store.get_many(conn, list(decision.same))
    for memory_id in decision.same:
        other = found.get(memory_id)
        if other is not None and other.archived_at is None and other.vis_key == memory.vis_key \
                and other.happens_on in (None, memory.happens_on):
            return memory_id
    return None


def write_if_kept(conn: Connection, keep: Callable[[], bool] | None, *args: Any, **kwargs: Any) -> WriteOutcome:
    """`write_facts`, unless `keep` (asked on the database thread, right before) says no: the
    author was forgotten while the facts were extracted."""
    if keep is not None and not keep():
        log.info("dropped %d facts: their author was forgotten while they were extracted", len(args[0]))
        return WriteOutcome()
    return write_facts(conn, *args, **kwargs)


def plan_updates(conn: Connection, model: str, memories: list[NewMemory],
                  vecs: list[list[float]] | None, settings: Settings, names: list[str], now: float | None = None
                  ) -> Plan:
    """For each fact that is not a plain duplicate: the older memories the LLM should judge;
    each fact's search of its own key with the change mark it was made at (the write reuses it
    if no vector changed meanwhile); and what each author taught in each fact's channel in the
    24 hours before `now` (default: the time now), for MUNINN_LEARN_PER_DAY (LearnBudget).
    Read-only: the index is created by the write. On PostgreSQL the mark, the index, the owners'
    personal keys, the exact-text checks and the counts are one round trip, and the vector
    cache reads its change log once for all the searches."""
    storage = storage_of(conn)
    owners = [m.owner_id for m in memories if m.scope == "personal" and m.owner_id is not None]
    probes = [(m.vis_key, tokens(m.text)) for m in memories]
    taught = ([(m.owner_id, m.channel_id) for m in memories if m.owner_id is not None and m.channel_id is not None]
              if settings.learn_per_day > 0 else [])
    since = (time.time() if now is None else now) - DAY_S
    with storage.one_log_read(conn):
        state = storage.plan_state(conn, model, owners, probes, SAME_TEXT_LIMIT, taught, since)
        info = state.info if vecs else None
        out: list[list[tuple[int, str]]] = []
        searched: list[list[tuple[int, float]] | None] = []
        for index, memory in enumerate(memories):
            vector = vecs[index] if vecs is not None and info is not None and len(vecs[index]) == info.dim else None
            near = nearest(conn, info, vector, [memory.vis_key], FACT_NEIGHBOURS)
            searched.append(near if vector is not None else None)
            duplicate = find_duplicate(conn, info, memory, vector, settings.dedup_cosine, near=near,
                                       same_words=state.same_words[index])
            if duplicate is not None:
                out.append([])
                continue
            out.append(update_candidates(conn, info, memory, vector, threshold=settings.update_cosine,
                                         subject_name=names[index], near=near,
                                         keys=subject_keys(conn, memory, state.personal)))
    return out, searched, state.mark, state.taught


class FactWrites:
    """`engine.facts`: plan a batch of facts (read-only), then write it in one transaction."""

    def __init__(self, jobs: Jobs) -> None:
        self._jobs = jobs

    async def plan(self, model: str, memories: list[NewMemory], vecs: list[list[float]] | None,
                   settings: Settings, names: list[str], now: float | None = None) -> Plan:
        """For each fact: the older memories the LLM should judge as repeated or replaced, the
        search of its own key, the change mark it was made at, and what each author taught in the
        fact's channel in the day before `now` (plan_updates)."""
        return await self._jobs.read(plan_updates, model, memories, vecs, settings, names, now)

    async def taught_since(self, owner_id: int, channel_id: int, since: float) -> int:
        """How many memories `owner_id` taught in `channel_id` stored at or after `since`
        (store.taught_since: what MUNINN_LEARN_PER_DAY counts, archived ones included)."""
        return await self._jobs.read(store.taught_since, owner_id, channel_id, since)

    async def write(self, keep: Callable[[], bool] | None, memories: list[NewMemory], vecs: list[list[float]] | None,
                    decisions: list[UpdateDecision | None], *, settings: Settings, now: float,
                    searched: Sequence[list[tuple[int, float]] | None], searched_mark: Any,
                    taught: dict[tuple[int, int], int] | None = None) -> WriteOutcome:
        """Store the facts in one transaction (write_facts), unless `keep` says no."""
        return await self._jobs.write(write_if_kept, keep, memories, vecs, decisions,
                                      what=f"store {len(memories)} extracted facts", settings=settings, now=now,
                                      searched=searched, searched_mark=searched_mark, taught=taught)
