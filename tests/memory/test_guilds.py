"""engine.guilds: servers Muninn was removed from are purged after the retention, whole (room and
personal memories learned there with their vectors, links and sources, the history, the channel
options) and out of the files; other servers, DMs, global memories and servers it was added back
to stay. On SQLite and PostgreSQL."""
from __future__ import annotations

import time

import pytest

from bot.lifecycle.maintenance import run_maintenance
from bot.memory.engine import Engine
from bot.memory.guilds import DAY_S
from bot.memory.records import NewMemory
from bot.memory.sql import history

pytestmark = pytest.mark.usefixtures("backend")

ALICE, BOB = 11, 12
GONE, STAYING, BACK = 1001 << 22, 1002 << 22, 1003 << 22          # guild ids (snowflakes)
GONE_ROOM, STAYING_ROOM, BACK_ROOM, DM = 2001 << 22, 2002 << 22, 2003 << 22, 2004 << 22
SECRET = "Quokkaville Zanzibarite"


def _words_in_files(settings, backend: str) -> list[str]:
    if backend:
        from tests.memory.postgres.test_scrub import files_holding
        return [*files_holding(backend, "messages", "zanzibarit"), *files_holding(backend, "memories", "zanzibarit")]
    path = settings.db_path
    return [file.name for file in (path, path.with_name(path.name + "-wal"))
            if file.exists() and b"zanzibarite" in file.read_bytes().lower()]


async def say(engine: Engine, message_id: int, channel: int, guild: int | None, text: str, author: int = ALICE) -> None:
    await engine.write(history.record, channel_id=channel, guild_id=guild, author_id=author, author_name="Alice",
                       role="user", content=text, created_at=time.time(), message_id=message_id)


async def world(engine: Engine) -> dict[str, int]:
    """Memories, history and channel options in three servers and a DM."""
    ids = {}
    for name, guild, room in (("gone", GONE, GONE_ROOM), ("staying", STAYING, STAYING_ROOM), ("back", BACK, BACK_ROOM)):
        await say(engine, guild + 1, room, guild, f"in {name}: Alice lives on {SECRET} street" if name == "gone"
                  else f"in {name}: Alice likes tea")
        await engine.write(history.record, channel_id=room, guild_id=guild, author_id=99, author_name="Muninn",
                           role="assistant", content=f"noted, {name}", message_id=guild + 2, reply_to=guild + 1,
                           reply_to_author=ALICE)
        await engine.options.set_channel(room, guild, "answer", "every")
        ids[f"{name} personal"] = await engine.remember(NewMemory(
            f"Alice lives on {SECRET} street" if name == "gone" else f"Alice likes tea ({name})", "personal",
            owner_id=ALICE, channel_id=room, guild_id=guild, source_message_ids=[guild + 1]))
        ids[f"{name} room"] = await engine.remember(NewMemory(
            f"The {SECRET} club meets on Fridays" if name == "gone" else f"The {name} club meets on Fridays",
            "room", owner_id=BOB, channel_id=room, guild_id=guild, source_message_ids=[guild + 1]))
    await say(engine, DM + 1, DM, None, "in a DM: Alice has a cat")
    ids["dm personal"] = await engine.remember(NewMemory("Alice has a cat", "personal", owner_id=ALICE,
                                                         channel_id=DM, source_message_ids=[DM + 1]))
    ids["global"] = await engine.remember(NewMemory("The bot's owner said: be kind", "global", owner_id=BOB,
                                                    channel_id=GONE_ROOM, guild_id=GONE))
    await engine.write(engine.storage.add_link, ids["gone personal"], ids["dm personal"], "semantic")
    await engine.write(engine.storage.add_link, ids["staying personal"], ids["dm personal"], "semantic")
    for filler in range(30):  # enough rows that the words are not all on one page
        await engine.remember(NewMemory(f"filler fact {filler} about boats", "personal", owner_id=BOB))
    return ids


def counts(conn, memory_ids: list[int]) -> dict[str, int]:
    marks = ",".join("?" * len(memory_ids))
    one = lambda sql, params=(): int(conn.execute(sql, params).fetchall()[0][0])  # noqa: E731
    return {"links": one(f"SELECT count(*) FROM memory_links WHERE source_id IN ({marks}) OR target_id IN ({marks})",
                         (*memory_ids, *memory_ids)),
            "sources": one(f"SELECT count(*) FROM memory_sources WHERE memory_id IN ({marks})", memory_ids)}


async def test_a_departed_server_is_purged_after_the_retention_and_nothing_else(fake_ollama, make_settings, backend):
    settings = make_settings(fake_ollama.url)
    async with Engine(settings) as engine:
        ids = await world(engine)
        now = time.time()
        assert await engine.guilds.departed(GONE, at=now - 31 * DAY_S)
        assert not await engine.guilds.departed(GONE, at=now)           # the first departure stays
        assert await engine.guilds.departed(BACK, at=now - 40 * DAY_S)
        assert await engine.guilds.returned(BACK)                       # added back: kept
        assert not await engine.guilds.returned(STAYING)                # never left
        assert await engine.guilds.departures() == {GONE: pytest.approx(now - 31 * DAY_S)}
        assert (await engine.stats())["missing_vectors"] == 0
        assert _words_in_files(settings, backend)

        assert await engine.guilds.purge_departed(32, now=now) == []     # not gone long enough yet
        [purged] = await engine.guilds.purge_departed(30, now=now)

        assert (purged.guild_id, purged.memories, purged.messages, purged.channels) == (GONE, 2, 2, 1)
        gone = [ids["gone personal"], ids["gone room"]]
        assert await engine.get_many(gone) == {}
        kept = [i for name, i in ids.items() if not name.startswith("gone")]
        assert set(await engine.get_many(kept)) == set(kept)            # other servers, the DM, the global memory
        assert await engine.write(counts, gone) == {"links": 0, "sources": 0}
        assert await engine.write(counts, [ids["staying personal"]]) == {"links": 1, "sources": 1}
        assert await engine.messages.recent(GONE_ROOM, 10) == []
        assert [m.content for m in await engine.messages.recent(STAYING_ROOM, 10)] == [
            "in staying: Alice likes tea", "noted, staying"]
        assert len(await engine.messages.recent(BACK_ROOM, 10)) == 2
        assert [m.content for m in await engine.messages.recent(DM, 10)] == ["in a DM: Alice has a cat"]
        stored = await engine.options.stored(None, [GONE_ROOM, STAYING_ROOM, BACK_ROOM])
        assert stored.channels == {GONE_ROOM: {}, STAYING_ROOM: {"answer": "every"}, BACK_ROOM: {"answer": "every"}}
        assert await engine.guilds.departures() == {}
        stats = await engine.stats()
        assert stats["active"] == len(kept) + 30 and stats["missing_vectors"] == 0
        assert await engine.guilds.purge_departed(0) == []               # done: nothing left to purge
        assert not await engine.finish_scrub()                           # the purge scrubbed: nothing pending
        assert _words_in_files(settings, backend) == []


async def test_retention_zero_purges_at_the_next_maintenance_and_says_so(make_settings):
    async with Engine(make_settings("", MUNINN_GUILD_RETENTION_DAYS="0")) as engine:
        await say(engine, GONE + 1, GONE_ROOM, GONE, "hello from a server that will go")
        room = await engine.remember(NewMemory("The club meets on Fridays", "room", owner_id=BOB,
                                               channel_id=GONE_ROOM, guild_id=GONE))
        assert await engine.guilds.departed(GONE)
        lines: list[str] = []
        report = await run_maintenance(engine, use_llm=False, on_step=lines.append)
        assert [p.guild_id for p in report.guilds_purged] == [GONE]
        assert lines[0].startswith("servers: purged 1 servers Muninn was removed from (1 memories, 1 messages")
        assert report.to_dict()["guilds_purged"][0]["guild_id"] == GONE
        assert await engine.get_many([room]) == {}


async def test_a_server_added_back_before_the_purge_keeps_everything(make_settings):
    async with Engine(make_settings("")) as engine:
        await say(engine, BACK + 1, BACK_ROOM, BACK, "hello again")
        assert await engine.guilds.departed(BACK, at=time.time() - 90 * DAY_S)
        assert await engine.guilds.returned(BACK)
        assert await engine.guilds.purge_departed(0) == []
        assert len(await engine.messages.recent(BACK_ROOM, 10)) == 1


async def test_a_start_records_the_servers_left_while_offline_for_its_own_shards_only(make_settings):
    async with Engine(make_settings("")) as engine:
        for guild, room in ((GONE, GONE_ROOM), (STAYING, STAYING_ROOM), (BACK, BACK_ROOM)):
            await say(engine, guild + 1, room, guild, "hello")
        local = await engine.remember(NewMemory("Oz likes the terminal", "personal", owner_id=ALICE, guild_id=0,
                                                channel_id=0))  # `muninn chat`'s local guild 0: never judged
        other_shard = 1004 << 22
        await engine.options.set_channel(5 << 22, other_shard, "answer", "every")   # known by its channel option alone
        earlier = time.time() - 10 * DAY_S
        assert await engine.guilds.departed(BACK, at=earlier)

        result = await engine.guilds.reconcile({STAYING, BACK}, lambda guild: guild != other_shard)

        assert (result.departed, result.returned) == ((GONE,), (BACK,))
        assert set(await engine.guilds.departures()) == {GONE}
        again = await engine.guilds.reconcile({STAYING}, lambda guild: True, at=time.time() + 100)
        assert again.departed == (BACK, other_shard)
        departures = await engine.guilds.departures()
        assert departures[GONE] < time.time()                              # the first time stays
        assert (await engine.get(local)).text == "Oz likes the terminal"
