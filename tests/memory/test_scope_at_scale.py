"""The scope rule on the code paths that only run at scale, forced on small worlds.

tests/memory/test_scope.py property-tests the scope rule on tiny worlds. The engine takes other paths
once keys and words get big: common words (recall.keywords.COMMON_MIN_DOCS, MATCH_BUDGET, COMMON_WINDOW,
COMMON_HITS, COMMON_EXACT, the scorer given the counts), match-first or visible-first keyword plans
(recall.keywords.DENSE_VISIBLE), the shared word-count cache and the removals counter, the vector cache's
sign-code shortlists (MUNINN_VECTOR_CODES_MIN, vector_codes.RERANK_*), keys loaded in the
background (vector_cache.INLINE_LOAD_MAX), keys too big for the cache budget (searched in vec0 /
the server), evictions, the change log, int8 rows rescored from the store (MUNINN_VECTOR_FORM), the
neighbour loan, the graph walk, the name re-rank, and on PostgreSQL the common-word walk per key and
the word estimates from the statistics.

Here those thresholds are lowered so that a world of ~450 memories takes them, with one key far
bigger than the others (a busy room), words common to many keys, private channels, DMs, archived
and forgotten memories, viewers who see nothing, and memories added, archived, restored and
forgotten by another engine ("another process") between recalls. Every path is instrumented and
the test asserts that it really ran (`PATHS_*`); every surfaced memory (and every memory id a
result's reason names) is checked against an oracle written independently of bot/memory/scope.py
(tests/memory/test_scope.py's `oracle_visible`). MUNINN_SCALE_SEED=N draws other worlds and queries.

No leak was found. Two other bugs it found (not leaks to another viewer) are tested at the end:
a memory archived between a recall's search and its load was returned, and on PostgreSQL a key's
load whose catch-up found no change failed the recall (`id IN ()`).
"""
from __future__ import annotations

import asyncio
import collections
import os
import random
import threading
import time

import pytest

from bot.memory.engine import Engine
from bot.memory.recall import keywords as shared_keywords
from bot.memory.recall import retrieval, steps, subqueries
from bot.memory.records import NewMemory
from bot.memory.scope import Viewer
from bot.memory.sql import removals
from bot.memory.sqlite import fts
from bot.memory.vectors import cache as vector_cache
from bot.memory.vectors import codes as vector_codes
from bot.memory.vectors import keys as cache_keys
from tests.fakes.ollama import FakeOllama
from tests.memory.test_scope import check_listing_and_lookups, oracle_visible

pytestmark = pytest.mark.usefixtures("backend")

S = 10 ** 17
G1, G2 = S + 100, S + 200
BUSY = S + 11        # G1, public: the busy room, one key far bigger than the others
C12 = S + 12         # G1, public
C13 = S + 13         # G1, private (personal memories learned here stay here and in DMs)
QUIET = S + 14       # G1, public, no room memories: a lurker there sees only global ones
C21 = S + 21         # G2, public
C22 = S + 22         # G2, private
GUILD_OF = {BUSY: G1, C12: G1, C13: G1, QUIET: G1, C21: G2, C22: G2}
PRIVATE = {C13, C22}
HEAVY, U2, U3, U4, ARCHIVED_ONLY = S + 1, S + 2, S + 3, S + 4, S + 5
LURKER = S + 9       # never taught anything
USERS = [HEAVY, U2, U3, U4, ARCHIVED_ONLY]
DIM = 64

# What each configuration must have run, on each backend (checked at the end of each test).
PATHS_COMMON = {
    "names:rerank", "neighbour:loan", "graph:link", "graph:invisible-link-offered",
    "counts:forgotten-by-removals-counter", "vec:log-applied", "vec:inline-load", "vec:background-load",
    "vec:store-search", "vec:reset", "vec:warm-listed",
    "viewer:sees-nothing", "viewer:dm", "viewer:private-channel",
}
PATHS_SQLITE = {"fts:common", "fts:rare", "fts:window", "fts:scorer", "fts:common:match-first",
                 "fts:common:visible-first", "fts:rare:match-first",
                "fts:rare:visible-first"}
PATHS_POSTGRES = {"pg:common-walk-per-key", "pg:window", "pg:rare-any-keys", "pg:estimates", "pg:estimates-used"}
PATHS_CODED = {"vec:codes-shortlist-cut", "vec:reload-drop"}
PATHS_TIGHT = {"vec:too-big", "vec:evicted", "vec:codes-shortlist-cut"}


# -- the world -------------------------------------------------------------------------

def make_world(rng: random.Random) -> list[dict]:
    """Memory specs (scope, owner, guild, channel, private, text words); ids come later."""
    mems: list[dict] = []

    def add(scope: str, owner: int, channel: int | None, *, private: bool = False, n: int = 1) -> None:
        for _ in range(n):
            guild = GUILD_OF.get(channel) if channel is not None else None
            mems.append({"scope": scope, "owner": owner, "guild": guild, "channel": channel,
                         "private": private and scope == "personal", "archived": False})

    for _ in range(230):  # the busy room: many people's room memories in one key
        add("room", rng.choice(USERS[:4]), BUSY)
    add("room", U2, C12, n=18)
    add("room", U3, C21, n=12)
    add("room", U4, C22, n=6)
    add("global", HEAVY, None, n=5)
    add("personal", HEAVY, BUSY, n=45)        # a heavy user's guild key (bigger than INLINE_LOAD_MAX)
    add("personal", HEAVY, C13, private=True, n=8)
    add("personal", HEAVY, C21, n=10)
    add("personal", HEAVY, None, n=30)        # DM key
    add("personal", HEAVY, C22, private=True, n=4)
    for user in (U2, U3, U4):
        add("personal", user, rng.choice([BUSY, C12]), n=6)
        add("personal", user, C13, private=True, n=3)
        add("personal", user, C21, n=4)
        add("personal", user, None, n=5)
    add("personal", ARCHIVED_ONLY, C12, n=3)
    add("personal", ARCHIVED_ONLY, None, n=3)
    rng.shuffle(mems)  # interleave the keys in id order: windows and neighbours cross keys
    for i, mem in enumerate(mems):
        words = []
        if rng.random() < 0.6:
            words.append("apple")
        if rng.random() < 0.3:
            words.append("river")
        if rng.random() < 0.2:
            words.append("Caroline")
        if rng.random() < 0.04:
            words.append("garden")
        words.append(f"tok{i}")
        mem["text"] = " ".join(words) + f" said by owner{mem['owner']}"
    return mems


def new_memory(mem: dict) -> NewMemory:
    return NewMemory(mem["text"], mem["scope"], owner_id=mem["owner"], channel_id=mem["channel"],
                     guild_id=mem["guild"], private=mem["private"])


VIEWERS = (
    [Viewer(user, dm=True) for user in USERS]
    + [Viewer(user, channel, GUILD_OF[channel]) for user in USERS for channel in (BUSY, C12, C13, C21, C22)]
    + [Viewer(LURKER, QUIET, G1), Viewer(LURKER, dm=True), Viewer(LURKER, BUSY, G1), Viewer(HEAVY, QUIET, G1)]
)


def queries(rng: random.Random, n: int) -> list[str]:
    picks = ["apple", "apple river", "garden apple", "what did Caroline say about tok{a} and tok{b} garden?",
             "tok{a} apple", "tok{a}", "river Caroline"]
    out = []
    for text in picks:
        out.append(text.format(a=rng.randrange(n), b=rng.randrange(n)))
    return out


# -- instrumentation ---------------------------------------------------------------------

class Paths:
    """Which scale-only paths ran (counted by wrappers around the real functions)."""

    def __init__(self) -> None:
        self.seen: collections.Counter[str] = collections.Counter()
        self.lock = threading.Lock()

    def hit(self, name: str, n: int = 1) -> None:
        with self.lock:
            self.seen[name] += n

    def missing(self, wanted: set[str]) -> set[str]:
        return {name for name in wanted if self.seen[name] == 0}


def instrument(monkeypatch, paths: Paths, postgres: bool) -> None:
    """Thresholds down, and wrappers that count each path taken."""
    monkeypatch.setattr(shared_keywords, "COMMON_MIN_DOCS", 10)
    monkeypatch.setattr(shared_keywords, "MATCH_BUDGET", 20)
    monkeypatch.setattr(shared_keywords, "COMMON_HITS", 15)
    monkeypatch.setattr(shared_keywords, "COMMON_EXACT", 100)
    monkeypatch.setattr(shared_keywords, "COMMON_WINDOW", 120)
    monkeypatch.setattr(shared_keywords, "DENSE_VISIBLE", 25)
    monkeypatch.setattr(cache_keys, "INLINE_LOAD_MAX", 40)
    monkeypatch.setattr(cache_keys, "RELOAD_AFTER_CHANGES", 5)
    monkeypatch.setattr(cache_keys, "MAX_APPLY", 30)
    monkeypatch.setattr(vector_codes, "RERANK_MIN", 4)
    monkeypatch.setattr(vector_codes, "RERANK_PER_K", 1)

    real_plan = fts.plan

    def plan(conn, text, keys, as_of):
        planned = real_plan(conn, text, keys, as_of)
        if planned.hits is not None:
            cte = planned.hits[0]
            kind = "common" if f"LIMIT {shared_keywords.COMMON_HITS}" in cte else "rare"
            first = "visible" if "visible(id)" in cte else "match"
            paths.hit(f"fts:{kind}")
            paths.hit(f"fts:{kind}:{first}-first")
            if "rowid > ?" in cte:
                paths.hit("fts:window")
        return planned
    monkeypatch.setattr(fts, "plan", plan)

    real_bm25 = fts.once_bm25

    def once_bm25(api, *documents):
        paths.hit("fts:scorer")
        return real_bm25(api, *documents)
    monkeypatch.setattr(fts, "once_bm25", once_bm25)  # registered on connections opened from now on

    real_observe = removals.observe

    def observe(database, value, forget):
        def counted(removed):
            if removed is not None:
                paths.hit("counts:forgotten-by-removals-counter")
            return forget(removed)
        return real_observe(database, value, counted)
    monkeypatch.setattr(removals, "observe", observe)

    real_search_many = vector_codes.search_many

    def search_many(parts, q, k, skip):
        total = sum(part[3] for part in parts)
        if vector_codes.rerank_count(total, k) < total:
            paths.hit("vec:codes-shortlist-cut")
        paths.hit("vec:codes")
        return real_search_many(parts, q, k, skip)
    monkeypatch.setattr(vector_codes, "search_many", search_many)

    real_lend = retrieval.lend_to_neighbours

    def lend(by_id, found, share):
        ranked = real_lend(by_id, found, share)
        paths.hit("neighbour:loan", sum(c.neighbour_of is not None for c in ranked))
        return ranked
    monkeypatch.setattr(retrieval, "lend_to_neighbours", lend)

    real_names = subqueries.name_hits

    def name_hits(conn, question, hits):
        found = real_names(conn, question, hits)
        if found:
            paths.hit("names:rerank")
        return found
    monkeypatch.setattr(subqueries, "name_hits", name_hits)

    if postgres:
        import psycopg

        real_execute = psycopg.Connection.execute

        def execute(self, query, *args, **kwargs):
            text = query.decode() if isinstance(query, bytes) else str(query)
            if "CROSS JOIN LATERAL ((SELECT m.id, m.text_search" in text:
                paths.hit("pg:common-walk-per-key")
                if "v(key)) - %s" in text:
                    paths.hit("pg:window")
            elif "m.vis_key = ANY(%s) AND m.text_search @@" in text and "h.text_search @@" in text:
                paths.hit("pg:rare-any-keys")
            elif ("= ANY(%(common)s::text[])" in text and args and isinstance(args[0], dict)
                  and args[0].get("common") not in (None, "{}")):
                paths.hit("pg:estimates-used")  # words the statistics call common are not counted
            return real_execute(self, query, *args, **kwargs)
        monkeypatch.setattr(psycopg.Connection, "execute", execute)


def instrument_cache(cache: vector_cache.VectorCache, paths: Paths) -> None:
    real_load, real_evict, real_apply = cache._load, cache._evict_beside, cache._apply
    real_search, real_reset, real_drop = cache.source.search, cache._reset, cache._drop
    evicting = threading.local()

    def load(conn, info, key, **options):
        where = "background" if threading.current_thread().name.startswith("muninn-vecload") else "inline"
        paths.hit(f"vec:{where}-load")
        entry = real_load(conn, info, key, **options)
        if entry is None and key in cache._too_big:
            paths.hit("vec:too-big")
        return entry

    def evict_beside(key):
        before = len(cache._keys)
        evicting.on = True
        try:
            real_evict(key)
        finally:
            evicting.on = False
        if len(cache._keys) < before:
            paths.hit("vec:evicted", before - len(cache._keys))

    def drop(key):
        if not getattr(evicting, "on", False):
            paths.hit("vec:reload-drop")  # too many changes to one cached key: dropped, reloaded on demand
        return real_drop(key)

    def reset():
        if cache._identity is not None:  # not the first read's start: a pruned log or too many changes
            paths.hit("vec:reset")
        return real_reset()

    def apply(conn, info, ids, states=None):
        paths.hit("vec:log-applied" if ids else "vec:empty-catch-up")  # an empty one: _load's catch-up found none
        return real_apply(conn, info, ids, states)

    def search(conn, info, query, keys, k, as_of):
        paths.hit("vec:store-search")
        return real_search(conn, info, query, keys, k, as_of)

    cache._load, cache._evict_beside, cache._apply = load, evict_beside, apply  # type: ignore[method-assign]
    cache._drop, cache._reset = drop, reset  # type: ignore[method-assign]
    cache.source.search = search  # type: ignore[method-assign]


class OtherProcess:
    """Writes through engine B as if from another process: this process's word-count caches and
    removals bookkeeping are put back as they were before B wrote, so engine A can learn of the
    removals only through the counter in the database (removals.py)."""

    def __init__(self) -> None:
        from bot.memory.postgres import keywords
        self.dicts: list[dict] = [shared_keywords._counts, shared_keywords._removed_since_forget, removals._seen,
                                  keywords._counts,
                                  keywords._newest, keywords._estimates, keywords._generation]

    def __enter__(self) -> "OtherProcess":
        self.saved = [{k: (dict(v) if isinstance(v, dict) else v) for k, v in d.items()} for d in self.dicts]
        return self

    def __exit__(self, *exc) -> None:
        for d, saved in zip(self.dicts, self.saved, strict=True):
            d.clear()
            d.update(saved)


# -- the checks ---------------------------------------------------------------------------

async def wait_for_loader(engine: Engine) -> None:
    """Until the background loads queued so far have run (one loader thread, FIFO)."""
    if engine._loader is not None:
        await asyncio.get_running_loop().run_in_executor(engine._loader, lambda: None)


async def check_viewer(engine: Engine, world: dict[int, dict], links: list[tuple[int, int, str]], viewer: Viewer,
                       texts: list[str], paths: Paths, rng: random.Random) -> None:
    allowed = {mid for mid, mem in world.items() if oracle_visible(mem, viewer)}
    embedded = {mid for mid in allowed if world[mid]["embedded"]}
    if not allowed:
        paths.hit("viewer:sees-nothing")
    if viewer.dm:
        paths.hit("viewer:dm")
    if viewer.channel_id in PRIVATE:
        paths.hit("viewer:private-channel")
    for text in texts:
        limit = rng.choice([5, 5, 20])
        as_of = time.time() + 60 if rng.random() < 0.15 else None
        result = await engine.recall(text, viewer, limit=limit, touch=rng.random() < 0.5 and as_of is None,
                                     as_of=as_of)
        surfaced = set(result.ids)
        assert surfaced <= allowed, f"LEAK in recall({text!r}) to {viewer}: {sorted(surfaced - allowed)}"
        for recalled in result.memories:
            reason = recalled.candidate.reason()
            named = {reason.get("neighbour_of"), (reason.get("link") or {}).get("from")} - {None}
            assert named <= allowed, f"LEAK of ids in a reason to {viewer}: {reason}"
            assert recalled.memory.archived_at is None, f"archived memory #{recalled.memory.id} recalled"
            if recalled.candidate.via == "link":
                paths.hit("graph:link")
        for seed in surfaced:
            if any((a == seed and b not in allowed) or (b == seed and a not in allowed)
                   for a, b, kind in links if kind in retrieval.GRAPH_LINK_KINDS and a in world and b in world):
                paths.hit("graph:invisible-link-offered")
        # the keyword step alone, deeper than recall's limit
        found = await engine.read(steps.keyword_step, engine.storage, text, viewer, 60, None)
        keys, hits = found.keys, found.hits
        found = {h.memory_id for h in hits}
        assert found <= allowed, f"LEAK in the keyword step ({text!r}) to {viewer}: {sorted(found - allowed)}"
        # the vector step alone: k small, so that a shortlist by code really cuts
        info = await engine.read(engine.storage.index_info)
        if info is not None:
            query = (await engine.ollama.embed([text]))[0]
            k = rng.choice([3, 10])
            near = await engine.read(engine.storage.vector_candidates, info, query, keys, k, None)
            got = {h.memory_id for h in near}
            assert got <= allowed, f"LEAK in the vector step ({text!r}) to {viewer}: {sorted(got - allowed)}"
            assert len(got) == min(k, len(embedded)), (len(got), k, len(embedded))  # not a leak: a short answer
    # a rare word of a visible memory is found by keywords (the check above is not vacuous)
    if allowed:
        mid = rng.choice(sorted(allowed))
        found = await engine.read(steps.keyword_step, engine.storage, f"tok{world[mid]['index']}", viewer, 5, None)
        keys, hits = found.keys, found.hits
        assert [h.memory_id for h in hits] == [mid]
    # listings and single lookups
    sample = rng.sample(sorted(world), min(25, len(world)))
    sample += [mid for mid, mem in world.items() if mem["archived"]][:10]
    await check_listing_and_lookups(engine, viewer, sample, allowed, limit=2000)


async def check_exports(engine: Engine, world: dict[int, dict]) -> None:
    """/memory export and forget-all cover a person's personal memories and the room memories they
    taught (archived included), nobody else's."""
    for user in [*USERS, LURKER]:
        mine = {m.id for m in await engine.memories_of(user)}
        expected = {mid for mid, mem in world.items() if mem["owner"] == user and mem["scope"] in ("personal", "room")}
        assert mine == expected, f"export of {user}: extra {sorted(mine - expected)}, missing {sorted(expected - mine)}"


async def round_of_checks(engine, world, links, rng, paths, viewers=None) -> None:
    texts = queries(rng, max(m["index"] for m in world.values()) + 1)
    named, others = texts[3], texts[:3] + texts[4:]  # the name re-rank's question, every time
    for viewer in viewers or VIEWERS:
        await check_viewer(engine, world, links, viewer, [named, *rng.sample(others, 3)], paths, rng)


def busy_room(owner: int) -> dict:
    return {"scope": "room", "owner": owner, "guild": G1, "channel": BUSY, "private": False}


def busy_personal(owner: int) -> dict:
    return {"scope": "personal", "owner": owner, "guild": G1, "channel": BUSY, "private": False}


def heavy_dm() -> dict:
    return {"scope": "personal", "owner": HEAVY, "guild": None, "channel": None, "private": False}


def private_c13(owner: int) -> dict:
    return {"scope": "personal", "owner": owner, "guild": G1, "channel": C13, "private": True}


def guild_personal(owner: int, channel: int) -> dict:
    return {"scope": "personal", "owner": owner, "guild": GUILD_OF[channel], "channel": channel, "private": False}


async def add_memories(other: Engine, world: dict[int, dict], counter: list[int], specs: list[dict]) -> None:
    """Store `specs` (copied) through `other`, each with common words and a rare word of its own."""
    fresh = [dict(spec, archived=False) for spec in specs]
    for mem in fresh:
        mem["index"] = counter[0]
        mem["text"] = f"apple river Caroline garden tok{counter[0]} said by owner{mem['owner']}"
        counter[0] += 1
    for memory_id, mem in zip(await other.remember_many([new_memory(m) for m in fresh]), fresh, strict=True):
        world[memory_id] = {**mem, "embedded": True}


# -- the test ---------------------------------------------------------------------------------

@pytest.fixture
async def small_ollama():
    async with FakeOllama(dim=DIM) as fake:
        yield fake


@pytest.mark.parametrize("config", ["coded", "tight"])
async def test_scale_paths_never_leak(config, backend, small_ollama, make_settings, monkeypatch):
    postgres = bool(backend)
    paths = Paths()
    instrument(monkeypatch, paths, postgres)
    rng = random.Random(f"{config}-{postgres}-{os.environ.get('MUNINN_SCALE_SEED', '')}")  # other seeds: more worlds
    env = {"MUNINN_VECTOR_CODES_MIN": "40", "MUNINN_GRAPH_LIMIT": "50", "MUNINN_RECALL_LIMIT": "5",
           # both forms of the cache's rows: int8 (rescored from the store) beside codes, float32 in the tight budget
           "MUNINN_VECTOR_FORM": "int8" if config == "coded" else "float32"}
    settings = make_settings(small_ollama.url, **env)

    specs = make_world(rng)
    async with Engine(settings, warm=False) as other:  # "another process": builds and changes the world
        ids = await other.remember_many([new_memory(m) for m in specs])
        world: dict[int, dict] = {}
        for i, (memory_id, mem) in enumerate(zip(ids, specs, strict=True)):
            world[memory_id] = {**mem, "index": i, "embedded": True}
        # archived: ~8 %, and every memory of ARCHIVED_ONLY
        for memory_id, mem in world.items():
            if (mem["owner"] == ARCHIVED_ONLY and mem["scope"] == "personal") or rng.random() < 0.08:
                await other.archive(memory_id, "test")
                mem["archived"], mem["embedded"] = True, False
        # links, many across keys (two people's personal memories are refused by add_link)
        links: list[tuple[int, int, str]] = []
        for _ in range(150):
            a, b = rng.sample(ids, 2)
            kind = rng.choice(["co_extracted", "consolidated", "semantic", "superseded_by"])
            if await other.write(other.storage.add_link, a, b, kind):
                links.append((a, b, kind))
        if postgres:
            from bot.memory.postgres import keywords
            monkeypatch.setattr(keywords, "ESTIMATE_MIN", 30)
            await other.write(lambda conn: conn.pg.execute("ANALYZE memories"))

        async with Engine(settings, warm=False) as engine:
            if config == "tight":  # the busy key does not fit; the others evict each other
                engine.vector_cache.budget_bytes = 16 << 10
            instrument_cache(engine.vector_cache, paths)
            if postgres:
                from bot.memory.postgres import keywords
                estimated = await engine.read(keywords.refresh_estimates)
                if any(n >= keywords.ESTIMATE_MIN for n in estimated.values()):
                    paths.hit("pg:estimates")

            # 1. cold: small keys load inline, big ones in the background (vec0 / the server meanwhile)
            await round_of_checks(engine, world, links, rng, paths, VIEWERS[::2])
            await wait_for_loader(engine)
            # 2. warm: big keys cached (or too big), shortlists by code
            await round_of_checks(engine, world, links, rng, paths, VIEWERS[1::2])
            await check_exports(engine, world)

            # 3. another process adds, archives, restores, re-embeds and forgets between recalls
            counter = [len(specs)]
            sees_nothing = [Viewer(LURKER, QUIET, G1), Viewer(LURKER, dm=True), Viewer(ARCHIVED_ONLY, dm=True)]

            def some_viewers() -> list[Viewer]:
                return rng.sample(VIEWERS, 8) + sees_nothing

            with OtherProcess():  # 12 new ones in the busy key: more than RELOAD_AFTER_CHANGES (lowered)
                await add_memories(other, world, counter, [busy_room(U2)] * 12)
            await round_of_checks(engine, world, links, rng, paths, some_viewers())
            with OtherProcess():  # more changes at once than MAX_APPLY (lowered): the cache starts over
                await add_memories(other, world, counter, [busy_room(U3), heavy_dm(), private_c13(U3),
                                                           guild_personal(U4, C21), busy_personal(HEAVY)] * 8)
            await round_of_checks(engine, world, links, rng, paths, some_viewers())
            with OtherProcess():
                active = [mid for mid, mem in world.items() if not mem["archived"]]
                for memory_id in rng.sample(active, 12):
                    await other.archive(memory_id, "test")
                    world[memory_id]["archived"], world[memory_id]["embedded"] = True, False
            await round_of_checks(engine, world, links, rng, paths, some_viewers())
            with OtherProcess():
                archived = [mid for mid, mem in world.items() if mem["archived"] and mem["owner"] != ARCHIVED_ONLY]
                restored = rng.sample(archived, 4)
                for memory_id in restored:
                    await other.write(other.storage.restore, memory_id)
                    world[memory_id]["archived"] = False  # restored without its vector
            await round_of_checks(engine, world, links, rng, paths, some_viewers())
            with OtherProcess():
                assert await other.backfill() >= len(restored)  # their vectors come back: the change log again
                for memory_id in restored:
                    world[memory_id]["embedded"] = True
            await round_of_checks(engine, world, links, rng, paths, some_viewers())
            with OtherProcess():
                active = [mid for mid, mem in world.items() if not mem["archived"]]
                gone = list(dict.fromkeys(rng.sample(active, 10)
                                          + [mid for mid, mem in world.items() if mem["scope"] == "global"]))
                await other.forget(gone)
                for memory_id in gone:
                    world.pop(memory_id)
                links[:] = [link for link in links if link[0] in world and link[1] in world]
            await round_of_checks(engine, world, links, rng, paths, some_viewers())
            await wait_for_loader(engine)
            await round_of_checks(engine, world, links, rng, paths, VIEWERS[1::3])
            await check_exports(engine, world)

        # 4. a fresh engine warming its cache in the background, recalls in flight while the other
        # process writes: whatever a recall returns was visible before or after those writes
        async with Engine(settings) as warming:
            if config == "tight":
                warming.vector_cache.budget_bytes = 16 << 10
            instrument_cache(warming.vector_cache, paths)
            # every state the world passes through (memories only appear, or leave scope by archive/forget)
            states = [{mid: dict(mem) for mid, mem in world.items()}]

            async def writes() -> None:
                with OtherProcess():
                    await add_memories(other, world, counter, [busy_room(U4), heavy_dm(), private_c13(HEAVY)] * 4)
                    states.append({mid: dict(mem) for mid, mem in world.items()})
                    for memory_id in rng.sample([mid for mid, mem in world.items() if not mem["archived"]], 8):
                        await other.archive(memory_id, "test")
                        world[memory_id]["archived"], world[memory_id]["embedded"] = True, False
                    gone = rng.sample(sorted(world), 6)
                    await other.forget(gone)
                    for memory_id in gone:
                        world.pop(memory_id)

            texts = queries(rng, counter[0])
            jobs = [(viewer, text) for viewer in VIEWERS for text in rng.sample(texts, 2)]
            results = await asyncio.gather(writes(), *(warming.recall(text, viewer, limit=5, touch=True)
                                                       for viewer, text in jobs))
            for (viewer, text), result in zip(jobs, results[1:], strict=True):
                allowed = {mid for state in [*states, world] for mid, mem in state.items() if oracle_visible(mem, viewer)}
                assert set(result.ids) <= allowed, \
                    f"LEAK in a recall racing writes ({text!r}) to {viewer}: {sorted(set(result.ids) - allowed)}"
            await wait_for_loader(warming)
            if warming.vector_cache._listed is not None:
                paths.hit("vec:warm-listed")  # the start-up warm listed the keys with vectors
            await round_of_checks(warming, world, links, rng, paths, some_viewers())

    wanted = PATHS_COMMON | (PATHS_POSTGRES if postgres else PATHS_SQLITE)
    wanted |= PATHS_CODED if config == "coded" else PATHS_TIGHT
    assert not paths.missing(wanted), f"paths not taken: {sorted(paths.missing(wanted))}; seen {dict(paths.seen)}"


async def test_a_memory_archived_during_a_recall_is_not_returned(backend, small_ollama, make_settings):
    settings = make_settings(small_ollama.url)
    async with Engine(settings, warm=False) as other, Engine(settings, warm=False) as engine:
        memory_id = await other.remember(NewMemory("apple orchard plans", "personal", owner_id=HEAVY))
        load = engine._touches.touch_and_load

        async def archived_meanwhile(touched, ids, now):  # maintenance archives it between search and load
            await other.archive(memory_id, "faded")
            return await load(touched, ids, now)
        engine._touches.touch_and_load = archived_meanwhile  # type: ignore[method-assign]
        result = await engine.recall("apple orchard", Viewer(HEAVY, dm=True))
        archived = await engine.get(memory_id)
        assert archived.archived_at is not None
        assert memory_id not in result.ids, "an archived memory was returned"
        assert archived.access_count == 0, "an archived memory was touched"


@pytest.mark.parametrize("backend", ["postgresql"], indirect=True)
async def test_postgres_an_empty_catch_up_after_a_key_load_does_not_fail_the_recall(backend, small_ollama,
                                                                                     make_settings):
    import psycopg

    settings = make_settings(small_ollama.url)
    async with Engine(settings, warm=False) as engine:
        memory_id = await engine.remember(NewMemory("apple orchard plans", "personal", owner_id=HEAVY))
        cache = engine.vector_cache
        load_key = cache.source.load_key

        def load_key_while_another_recall_polls(conn, info, key):
            loaded = load_key(conn, info, key)
            with psycopg.connect(backend, autocommit=True) as pg:  # any transaction commits meanwhile
                pg.execute("SELECT txid_current()")
            cache._read_log(conn, info)  # and another reader's search reads the log (VectorCache._sync)
            return loaded
        cache.source.load_key = load_key_while_another_recall_polls  # type: ignore[method-assign]
        try:
            result = await engine.recall("apple orchard", Viewer(HEAVY, dm=True))
        except psycopg.errors.SyntaxError as exc:
            pytest.fail(f"the recall failed: {exc}")
        assert result.ids == [memory_id]
