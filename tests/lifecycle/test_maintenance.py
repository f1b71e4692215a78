"""Maintenance: decay archival, backfill, links, consolidation; real engine, fake Ollama, the CLI."""
from __future__ import annotations

import asyncio
import json
import logging
import threading
import time

import pytest

from bot.cli import main as cli
from bot.lifecycle import maintenance
from bot.memory import records
from bot.memory.engine import Engine
from bot.memory.recall import touches
from bot.memory.scope import Viewer
from bot.memory.sql import store
from bot.memory.sqlite import db
from bot.memory.writing import upkeep
from tests.fakes.ollama import FakeOllama, FakeOllamaThread
from tests.helpers import (
    ALICE,
    BOB,
    CHANNEL,
    GUILD,
    axis,
    blend,
    links_of,
    memories_of,
    one,
)

pytestmark = pytest.mark.usefixtures("backend")  # maintenance on both storage backends

DAY = 86400.0


def alice(text: str, *, importance: float = 0.5, days_ago: float = 0.0, owner: int = ALICE,
          source: int = 1) -> records.NewMemory:
    return records.NewMemory(text=text, scope="personal", owner_id=owner, channel_id=CHANNEL, guild_id=GUILD,
                           importance=importance, created_at=time.time() - days_ago * DAY,
                           source_message_ids=[source])


# -- decay ---------------------------------------------------------------------------

async def test_faded_unimportant_memories_are_archived_not_deleted(engine):
    faded = await engine.remember(alice("Alice had toast for breakfast.", importance=0.1, days_ago=60))
    important = await engine.remember(alice("Alice is allergic to peanuts.", importance=0.9, days_ago=400))
    fresh = await engine.remember(alice("Alice is reading Dune.", importance=0.1, days_ago=1))
    recalled = await engine.remember(alice("Alice owns a red kayak.", importance=0.1, days_ago=60))
    # a recall resets the clock
    await engine.write(touches.touch_and_load_all, engine.storage, [([recalled], [recalled], time.time())], 1.5)

    report = await maintenance.run_maintenance(engine)
    assert report.archived == [faded]
    memory = await one(engine, faded)
    assert memory.archived_at is not None and memory.archive_reason.startswith("decayed (retention ")
    assert {m.id for m in await memories_of(engine)} == {important, fresh, recalled}
    assert len(await memories_of(engine, active_only=False)) == 4             # nothing hard-deleted
    assert faded not in (await engine.recall("toast breakfast", Viewer(ALICE, CHANNEL, GUILD), touch=False)).ids

    listed, total = await engine.write(upkeep.list_archived, reason="decayed")
    assert total == 1 and [m.id for m in listed] == [faded]
    assert (await maintenance.run_maintenance(engine)).archived == []         # idempotent

    await engine.restore(faded)
    await maintenance.run_maintenance(engine)                                 # backfill re-embeds it
    assert (await one(engine, faded)).archived_at is None
    assert (await one(engine, faded)).embedded
    assert faded in (await engine.recall("toast breakfast", Viewer(ALICE, CHANNEL, GUILD))).ids
    assert (await maintenance.run_maintenance(engine)).archived == []         # a restore is not undone


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)  # a SQLite file opened directly
def test_faded_ids_matches_the_retention_formula(tmp_path):
    conn = db.connect(tmp_path / "m.db")
    now = time.time()
    ids = store.insert_many(conn, [alice(f"fact {i}", importance=0.2, days_ago=d) for i, d in enumerate((20, 40))],
                            base_stability_days=7.0, now=now)
    memories = store.get_many(conn, ids)
    # stability 7 x 1.4 = 9.8 days: retention 0.13 after 20 days, 0.017 after 40
    assert [round(memories[i].retention(now), 3) for i in ids] == [0.13, 0.017]
    assert upkeep.faded_ids(conn, now=now, retention_below=0.05, importance_below=0.4, limit=10) == [ids[1]]
    assert upkeep.faded_ids(conn, now=now, retention_below=0.2, importance_below=0.4, limit=10) == ids
    assert upkeep.faded_ids(conn, now=now, retention_below=0.2, importance_below=0.2, limit=10) == []
    conn.close()


# -- embeddings and links -------------------------------------------------------------

async def test_missing_embeddings_and_links_are_filled_in(engine, fake_ollama):
    fake_ollama.vectors.update({"Alice likes hiking.": axis(0), "Alice hikes every weekend.": blend(0, 1, 0.8),
                                "Bob likes hiking.": axis(0), "Alice collects stamps.": axis(5)})
    await fake_ollama.go_down()
    a = await engine.remember(alice("Alice likes hiking."))
    b = await engine.remember(alice("Alice hikes every weekend."))
    await engine.remember(alice("Bob likes hiking.", owner=BOB))      # same vector, another owner: no link
    await engine.remember(alice("Alice collects stamps."))           # another subject: no link
    down = await maintenance.run_maintenance(engine)
    assert (down.embedded, down.links) == (0, 0)                             # waits for the vectors
    await fake_ollama.come_up()
    report = await maintenance.run_maintenance(engine)
    assert report.embedded == 4
    assert report.links == 1
    assert {(s, t) for s, t, kind in await links_of(engine) if kind == "semantic"} == {(b, a)}
    again = await maintenance.run_maintenance(engine)
    assert (again.embedded, again.links, again.archived, again.consolidated) == (0, 0, [], [])


async def test_a_memory_added_later_is_linked_to_older_ones(engine, fake_ollama):
    fake_ollama.vectors.update({"Alice likes hiking.": axis(0), "Alice hikes every weekend.": blend(0, 1, 0.8)})
    a = await engine.remember(alice("Alice likes hiking."))
    await maintenance.run_maintenance(engine)
    b = await engine.remember(alice("Alice hikes every weekend."))
    assert (await maintenance.run_maintenance(engine)).links == 1
    assert (b, a, "semantic") in await links_of(engine)


# -- consolidation ----------------------------------------------------------------

TEA = {"Alice likes green tea.": axis(0), "Alice enjoys green tea.": blend(0, 1, 0.95),
       "Alice loves drinking green tea.": blend(0, 2, 0.94)}


async def tea_cluster(engine, fake_ollama):
    fake_ollama.vectors.update(TEA)
    fake_ollama.vectors["Bob likes green tea."] = axis(0)
    fake_ollama.vectors["This channel likes green tea."] = axis(0)
    ids = [await engine.remember(alice(text, importance=0.3 + 0.1 * i, days_ago=3 - i, source=i))
           for i, text in enumerate(TEA)]
    bob = await engine.remember(alice("Bob likes green tea.", owner=BOB))
    room = await engine.remember(records.NewMemory("This channel likes green tea.", "room", ALICE, CHANNEL, GUILD))
    return ids, bob, room


async def test_near_duplicates_are_merged_by_the_llm(engine, fake_ollama, script):
    ids, bob, room = await tea_cluster(engine, fake_ollama)
    script.add("merge", '<think>all the same</think>{"text": "Alice loves green tea."}')
    report = await maintenance.run_maintenance(engine)
    (merge,) = report.consolidated
    assert merge.merged_by == "llm" and sorted(merge.originals) == sorted(ids)
    merged = await one(engine, merge.survivor)
    assert merged.text == "Alice loves green tea." and merged.vis_key == f"p:{ALICE}:{GUILD}"
    assert merged.importance == pytest.approx(0.5) and merged.embedded
    assert sorted(merged.source_message_ids) == ["0", "1", "2"]
    for original in ids:
        memory = await one(engine, original)
        assert memory.archive_reason == f"consolidated into #{merged.id}"
        assert (merged.id, original, "consolidated") in await links_of(engine)
    assert (await one(engine, bob)).archived_at is None and (await one(engine, room)).archived_at is None
    (request,) = script.seen["merge"]
    assert "Bob" not in json.dumps(request) and "channel" not in request["messages"][1]["content"]
    recalled = (await engine.recall("green tea", Viewer(ALICE, CHANNEL, GUILD), touch=False)).ids
    assert merged.id in recalled and not set(recalled) & set(ids)
    again = await maintenance.run_maintenance(engine)
    assert again.consolidated == [] and len(script.seen["merge"]) == 1


async def test_without_an_llm_the_clearest_original_is_kept(engine, fake_ollama, script):
    ids, _, _ = await tea_cluster(engine, fake_ollama)
    (merge,) = (await maintenance.run_maintenance(engine, use_llm=False)).consolidated
    assert merge.merged_by == "kept" and merge.text == "Alice loves drinking green tea."
    assert merge.survivor == ids[2] and sorted(merge.originals) == sorted(ids[:2])
    assert (await one(engine, ids[2])).archived_at is None
    assert {(s, t) for s, t, k in await links_of(engine) if k == "consolidated"} == {(ids[2], ids[0]), (ids[2], ids[1])}
    assert script.seen["merge"] == []


async def test_an_invented_detail_falls_back_to_the_clearest_original(engine, fake_ollama, script, caplog):
    ids, _, _ = await tea_cluster(engine, fake_ollama)
    invented = '{"text": "Alice loves green tea from Japan."}'
    script.add("merge", invented, '{"text": "I love green tea."}')
    with caplog.at_level(logging.DEBUG):
        (merge,) = (await maintenance.run_maintenance(engine)).consolidated
    assert merge.merged_by == "kept" and merge.survivor == ids[2]
    assert len(script.seen["merge"]) == 2
    loud = " ".join(r.getMessage() for r in caplog.records if r.levelno >= logging.INFO)
    assert "invalid twice" in loud and "consolidated" in loud
    for word in ("tea", "Japan", "japan"):       # ids and counts only; the texts stay at DEBUG
        assert word not in loud
    assert "Japan" in " ".join(r.getMessage() for r in caplog.records if r.levelno < logging.INFO)


async def test_chat_failure_during_consolidation_keeps_the_clearest(engine, fake_ollama, script):
    ids, _, _ = await tea_cluster(engine, fake_ollama)
    fake_ollama.chat_replies.append(FakeOllama.HTTP_500)
    (merge,) = (await maintenance.run_maintenance(engine)).consolidated
    assert merge.merged_by == "kept" and merge.survivor == ids[2]


async def test_an_interrupted_run_leaves_no_half_merge_and_resumes(fake_ollama, make_settings, script):
    async with Engine(make_settings(fake_ollama.url)) as engine:
        ids, _, _ = await tea_cluster(engine, fake_ollama)
        fake_ollama.delay = 5.0
        fake_ollama.chat_replies.append(FakeOllama.TIMEOUT)        # the merge hangs
        task = asyncio.create_task(maintenance.run_maintenance(engine))
        for _ in range(200):
            if fake_ollama.chat_requests():
                break
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert {m.id for m in await memories_of(engine)} >= set(ids)
        assert len(await memories_of(engine, active_only=False)) == 5
        script.add("merge", '{"text": "Alice loves green tea."}')
        (merge,) = (await maintenance.run_maintenance(engine)).consolidated
        assert merge.merged_by == "llm" and sorted(merge.originals) == sorted(ids)


async def test_periodic_task_runs_until_cancelled(engine):
    faded = await engine.remember(alice("Alice had toast for breakfast.", importance=0.1, days_ago=60))
    task = asyncio.create_task(maintenance.maintain_periodically(engine, hours=1.0, first_delay=0.0))
    for _ in range(300):
        if (await one(engine, faded)).archived_at is not None:
            break
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert (await one(engine, faded)).archived_at is not None


# -- the command line ----------------------------------------------------------

@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)  # a SQLite file opened directly
def test_cli_maintain_is_idempotent_and_lists_and_restores(tmp_path, monkeypatch, capsys):
    path = tmp_path / "main.db"
    conn = db.connect(path)
    now = time.time()
    faded, kept = store.insert_many(conn, [alice("Alice had toast for breakfast.", importance=0.1, days_ago=60),
                                           alice("Alice is allergic to peanuts.", importance=0.9)],
                                    base_stability_days=7.0, now=now)
    conn.close()
    monkeypatch.chdir(tmp_path)
    with FakeOllamaThread() as fake:
        for key, value in {"MUNINN_DB_PATH": str(path), "OLLAMA_URL": fake.url, "OLLAMA_COOLDOWN": "0",
                           "OLLAMA_RETRIES": "0"}.items():
            monkeypatch.setenv(key, value)
        assert cli.main(["maintain", "--json"]) == 0
        first = json.loads(capsys.readouterr().out)
        assert first["archived"] == [faded] and first["embedded"] == 1
        assert cli.main(["maintain"]) == 0
        human = capsys.readouterr().out
        assert "archived 0 faded memories" in human and "added 0 missing vectors" in human
        assert cli.main(["maintain", "--archived", "--json"]) == 0
        listed = json.loads(capsys.readouterr().out)
        assert listed["total"] == 1 and listed["memories"][0]["id"] == faded
        assert cli.main(["maintain", "--restore", str(faded)]) == 0
        assert f"restored #{faded}" in capsys.readouterr().out
        assert cli.main(["maintain", "--restore", str(kept)]) == 2
        assert "is not archived" in capsys.readouterr().err



def test_cli_maintain_never_overlaps_a_bot_process_and_counts_as_its_run(tmp_path, monkeypatch, capsys):
    from bot.memory.sql import leases
    path = tmp_path / "main.db"
    conn = db.connect(path)
    [faded] = store.insert_many(conn, [alice("Alice had toast for breakfast.", importance=0.1, days_ago=60)],
                                base_stability_days=7.0, now=time.time())
    assert leases.take(conn, maintenance.MAINTENANCE_LEASE, "bot-shard-0", 90.0)   # a bot process is maintaining
    monkeypatch.chdir(tmp_path)
    for key, value in {"MUNINN_DB_PATH": str(path), "OLLAMA_URL": ""}.items():
        monkeypatch.setenv(key, value)
    assert cli.main(["maintain"]) == 2
    err = capsys.readouterr().err
    assert "maintenance is already running in another process (bot-shard-0)" in err
    assert store.get(conn, faded).archived_at is None and leases.last_run(conn, "maintenance") is None
    assert leases.release(conn, maintenance.MAINTENANCE_LEASE, "bot-shard-0")
    started = time.time()
    assert cli.main(["maintain", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["archived"] == [faded]
    assert leases.holder_of(conn, maintenance.MAINTENANCE_LEASE) is None          # released: the bot may take it
    assert (leases.last_run(conn, "maintenance") or 0) >= started                # the bot's schedule counts it
    conn.close()

async def test_maintenance_trims_the_channel_history(make_settings):
    from bot.memory.sql import history
    async with Engine(make_settings("", MUNINN_HISTORY_KEEP="100")) as engine:
        def fill(conn):
            with db.write_transaction(conn):
                for i in range(130):
                    conn.execute("INSERT INTO messages (id, channel_id, author_id, author_name, role, content, "
                                 "created_at) VALUES (?, 5, 1, 'Ana', 'user', ?, ?)", (i + 1, f"message {i}", 1000.0 + i))
        await engine.write(fill)
        report = await maintenance.run_maintenance(engine, use_llm=False)
        assert report.history_pruned == 30
        kept = await engine.write(history.recent, 5, 1000)
        assert len(kept) == 100 and kept[-1].content == "message 129"
        assert (await maintenance.run_maintenance(engine, use_llm=False)).history_pruned == 0


# -- beside recalls ----------------------------------------------------------------------

async def test_maintenance_waits_for_the_recalls_in_flight_at_most_a_while(engine, fake_ollama):
    await engine.remember_many([alice(f"apple orchard fact {i}") for i in range(5)])
    fake_ollama.mode, fake_ollama.delay = "slow", 0.6  # the recall's embedding call keeps it in flight
    recall = asyncio.create_task(engine.recall("apple orchard", Viewer(ALICE, dm=True)))
    await asyncio.sleep(0.1)
    await engine.yield_to_recalls()
    assert recall.done() and recall.result().ids  # the step started only once the recall had ended

    recall = asyncio.create_task(engine.recall("apple orchard", Viewer(ALICE, dm=True)))
    await asyncio.sleep(0.1)
    started = time.perf_counter()
    await engine.yield_to_recalls(longest=0.05)  # a bot that never stops talking still gets maintained
    assert not recall.done() and time.perf_counter() - started < 0.4
    await recall
    started = time.perf_counter()
    await engine.yield_to_recalls()  # none in flight: at once
    assert time.perf_counter() - started < 0.05


async def test_maintenance_searches_on_a_thread_of_its_own(engine, monkeypatch):
    ids = await engine.remember_many([alice(f"apple orchard fact {i}") for i in range(5)])
    key = (await engine.get(ids[0])).vis_key
    seen: dict = {}
    search = engine.storage.neighbours_many

    def spy(conn, info, items, k):
        seen["thread"] = threading.current_thread().name
        return search(conn, info, items, k)
    monkeypatch.setattr(engine.storage, "neighbours_many", spy)
    found = await engine.nearest_neighbours([(ids[0], key)], 3)
    assert found is not None and len(found[ids[0]]) == 3
    assert seen["thread"].startswith("muninn-background")  # no read connection a recall waits for


async def test_maintenance_gives_a_big_key_its_own_vector_index_on_postgresql(fake_ollama, make_settings, backend):
    """A key of at least MUNINN_VECTOR_INDEX_MIN vectors gets an HNSW index of its own on PostgreSQL
    (postgres/ann.py), and loses it when the setting says none; SQLite needs none (vec0 partitions
    by key). Recall finds the same through it."""
    def indexes() -> int:
        if not backend:
            return 0
        import psycopg
        with psycopg.connect(backend) as conn:
            row = conn.execute("SELECT count(*) FROM pg_indexes WHERE starts_with(indexname, 'memory_vectors_ann_')")
            return int(row.fetchone()[0])
    # no vector cache: every search is the database's own (on PostgreSQL, through the index once made)
    async with Engine(make_settings(fake_ollama.url, MUNINN_VECTOR_INDEX_MIN="0", MUNINN_VECTOR_CACHE_MB="0")) as engine:
        for i in range(8):
            await engine.remember(alice(f"Alice fact number {i} about hiking.", source=i))
        await engine.remember(alice("Bob likes tea.", owner=BOB))
        await maintenance.run_maintenance(engine, use_llm=False)
        before = (await engine.recall("hiking", Viewer(ALICE, CHANNEL, GUILD), touch=False)).ids
        assert await engine.upkeep.vector_indexes(6, 0) == ((1, 0) if backend else (0, 0))
        assert indexes() == (1 if backend else 0)
        assert (await engine.recall("hiking", Viewer(ALICE, CHANNEL, GUILD), touch=False)).ids == before
        await maintenance.run_maintenance(engine, use_llm=False)  # MUNINN_VECTOR_INDEX_MIN=0: none kept
        assert indexes() == 0
