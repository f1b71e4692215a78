"""The scope rule, property-tested: no path (FTS, KNN, graph links, listings) ever leaks a memory.

The oracle below is written independently of bot/scope.py on purpose. Every test here runs on
both storage backends (SQLite, PostgreSQL): a leak is the worst bug either could have.
"""
from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hyp_settings
from hypothesis import strategies as st

from bot.memory import records
from bot.memory.engine import Engine
from bot.memory.records import NewMemory
from bot.memory.scope import Viewer
from bot.settings import load_settings
from tests.fakes.ollama import FakeOllamaThread
from tests.postgres_fixtures import empty_database

pytestmark = pytest.mark.usefixtures("backend")

# Snowflake-sized ids: vec0 stores text metadata longer than 12 characters on another path.
S = 10 ** 17
USERS = [S + 1, S + 2, S + 3]
GUILD_CHANNELS = {S + 100: [S + 11, S + 12], S + 200: [S + 21]}
PLACES = [(guild, channel) for guild, channels in GUILD_CHANNELS.items() for channel in channels] + [(None, S + 900)]


def oracle_visible(mem: dict, viewer: Viewer) -> bool:
    if mem["archived"]:
        return False
    if mem["scope"] == "global":
        return True
    if mem["scope"] == "room":
        return (not viewer.dm) and mem["channel"] == viewer.channel_id
    # personal: only the owner; in a DM always, in a guild only the guild where it was learned,
    # and only the very channel when that channel is private
    if mem["owner"] != viewer.user_id:
        return False
    if viewer.dm:
        return True
    if mem["guild"] is None or mem["guild"] != viewer.guild_id:
        return False
    return not mem["private"] or mem["channel"] == viewer.channel_id


memory_strategy = st.fixed_dictionaries({
    "scope": st.sampled_from(["personal", "personal", "room", "global"]),
    "owner": st.sampled_from(USERS),
    "place": st.sampled_from(PLACES),
    "archived": st.sampled_from([False, False, True]),
    "private": st.booleans(),
})

world_strategy = st.lists(memory_strategy, min_size=1, max_size=14).flatmap(
    lambda mems: st.tuples(
        st.just(mems),
        st.lists(st.tuples(st.integers(0, len(mems) - 1), st.integers(0, len(mems) - 1),
                           st.sampled_from(["co_extracted", "consolidated", "semantic", "superseded_by"])),
                 max_size=20),
    ))

viewer_strategy = st.builds(
    lambda user, place, dm: Viewer(user, dm=True) if dm else Viewer(user, place[1], place[0]),
    st.sampled_from(USERS), st.sampled_from([p for p in PLACES if p[0] is not None]), st.booleans())


@pytest.fixture(scope="module")
def ollama_thread():
    with FakeOllamaThread(dim=32) as fake:
        yield fake


async def build_world(engine: Engine, mems: list[dict], links) -> list[int]:
    new = []
    for i, mem in enumerate(mems):
        guild, channel = mem["place"]
        if mem["scope"] == "room" and guild is None:
            guild, channel = S + 100, S + 11  # rooms live in guild channels
        mem["guild"], mem["channel"] = guild, channel
        mem["private"] = mem["private"] and guild is not None and mem["scope"] == "personal"
        new.append(NewMemory(f"apple fact number{i} from owner{mem['owner']}", mem["scope"], owner_id=mem["owner"],
                             channel_id=channel, guild_id=guild, private=mem["private"]))
    ids = await engine.remember_many(new)

    for a, b, kind in links:
        if a != b:
            await engine.write(engine.storage.add_link, ids[a], ids[b], kind)
    for memory_id, mem in zip(ids, mems, strict=True):
        if mem["archived"]:
            await engine.archive(memory_id, "test")
    return ids


async def check_listing_and_lookups(engine: Engine, viewer: Viewer, ids, allowed: set[int], *,
                                    limit: int = 1000) -> None:
    """The viewer's listing holds exactly `allowed`, and a lookup of each of `ids` finds it iff allowed."""
    listed, total = await engine.list_visible(viewer, limit=limit)
    assert {m.id for m in listed} == allowed and total == len(allowed), f"listing for {viewer}"
    for memory_id in ids:
        try:
            await engine.get_visible(viewer, memory_id)
            seen = True
        except records.MemoryNotFound:
            seen = False
        assert seen == (memory_id in allowed), f"get_visible #{memory_id} for {viewer}"


@hyp_settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(world=world_strategy, viewers=st.lists(viewer_strategy, min_size=1, max_size=4))
def test_no_path_leaks_a_memory(ollama_thread, backend, world, viewers):
    mems, links = world

    async def scenario(db_path: Path, database_url: str):
        settings = load_settings({"MUNINN_DB_PATH": str(db_path), "MUNINN_DATABASE_URL": database_url,
                                  "OLLAMA_URL": ollama_thread.url, "OLLAMA_COOLDOWN": "0", "MUNINN_GRAPH_LIMIT": "50"})
        async with Engine(settings) as engine:
            ids = await build_world(engine, mems, links)
            by_id = dict(zip(ids, mems, strict=True))
            for viewer in viewers:
                allowed = {mid for mid, mem in by_id.items() if oracle_visible(mem, viewer)}
                # hybrid recall, graph walk included
                result = await engine.recall("apple fact", viewer, limit=len(ids))
                assert set(result.ids) <= allowed, f"leak to {viewer}: {set(result.ids) - allowed}"
                assert {r.memory.id for r in result.memories if r.candidate.via != "link"} == allowed
                # KNN alone, with k = what the viewer may see: only a filter inside the KNN returns
                # all of it (a global top-k filtered afterwards would come back short)
                keys = await engine.read(engine.storage.visible_keys, viewer)
                info = await engine.read(engine.storage.index_info)
                query = (await engine.ollama.embed(["apple fact"]))[0]
                hits = await engine.read(engine.storage.vector_candidates, info, query, keys, max(1, len(allowed)), None)
                assert {h.memory_id for h in hits} == allowed
                await check_listing_and_lookups(engine, viewer, ids, allowed)

    with tempfile.TemporaryDirectory() as tmp:
        if not backend:
            asyncio.run(scenario(Path(tmp) / "m.db", ""))
            return
        empty_database(backend)  # the same database, emptied, for each example
        asyncio.run(scenario(Path(tmp) / "m.db", backend))


async def test_personal_memory_learned_in_dm_stays_in_dms(fts_engine):
    memory_id = await fts_engine.remember(NewMemory("my apple allergy", "personal", owner_id=1))
    assert (await fts_engine.recall("apple allergy", Viewer(1, dm=True))).ids == [memory_id]
    assert (await fts_engine.recall("apple allergy", Viewer(1, 11, 100))).ids == []
    assert (await fts_engine.recall("apple allergy", Viewer(2, dm=True))).ids == []


async def test_personal_memory_learned_in_a_guild_never_reaches_another_guild(fts_engine):
    memory_id = await fts_engine.remember(NewMemory("my apple orchard", "personal", owner_id=1,
                                                    guild_id=100, channel_id=11))
    assert (await fts_engine.recall("apple orchard", Viewer(1, 12, 100))).ids == [memory_id]
    assert (await fts_engine.recall("apple orchard", Viewer(1, dm=True))).ids == [memory_id]
    assert (await fts_engine.recall("apple orchard", Viewer(1, 21, 200))).ids == []
    assert (await fts_engine.recall("apple orchard", Viewer(2, 11, 100))).ids == []


def test_viewer_rejects_a_dm_with_a_guild():
    with pytest.raises(ValueError):
        Viewer(1, 5, 100, dm=True)


async def test_personal_memory_learned_in_a_private_channel_stays_there(fts_engine):
    memory_id = await fts_engine.remember(NewMemory("my apple orchard plans", "personal", owner_id=1,
                                                    guild_id=100, channel_id=11, private=True))
    assert (await fts_engine.recall("apple orchard", Viewer(1, 11, 100))).ids == [memory_id]
    assert (await fts_engine.recall("apple orchard", Viewer(1, dm=True))).ids == [memory_id]
    assert (await fts_engine.recall("apple orchard", Viewer(1, 12, 100))).ids == []
    assert (await fts_engine.recall("apple orchard", Viewer(2, 11, 100))).ids == []
    stored = await fts_engine.get(memory_id)
    copy = NewMemory(stored.text, stored.scope, owner_id=stored.owner_id, channel_id=stored.channel_id,
                     guild_id=stored.guild_id, private=stored.private)
    assert copy.vis_key == stored.vis_key  # a copy (consolidation) keeps it in its channel


async def test_a_user_with_few_memories_still_gets_their_nearest_among_many(engine):
    """The scope filter runs inside the KNN: 40 closer memories of someone else do not crowd out
    the one memory Alice may see."""
    bob = 2
    await engine.remember_many([NewMemory(f"apple fact {i}", "personal", owner_id=bob) for i in range(40)])
    alice = await engine.remember(NewMemory("pear note", "personal", owner_id=1))
    viewer = Viewer(1, dm=True)
    keys = await engine.read(engine.storage.visible_keys, viewer)
    info = await engine.read(engine.storage.index_info)
    query = (await engine.ollama.embed(["apple fact"]))[0]
    hits = await engine.read(engine.storage.vector_candidates, info, query, keys, 3, None)
    assert [h.memory_id for h in hits] == [alice]
