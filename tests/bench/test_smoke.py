"""Tiny runs of both benchmarks (no torch, no model): the harnesses work and measure what they say."""
from __future__ import annotations

import json

import pytest

from bench import beam, quality, shared_world, speed
from bench.world import DIM, VIEWER_CLASSES, Shape, SkewShape, build
from bot.memory import records
from bot.memory.sqlite import db
from tests.fakes.ollama import FakeOllama


async def test_speed_benchmark_on_500_memories(tmp_path):
    shape = Shape(500, channels=12, guilds=3, vocab=2000)
    path = tmp_path / "speed.db"
    built = await build(path, shape, chunk_size=16)
    assert built["build_s"] > 0
    reads = await speed.measure_reads(path, shape, viewers=10)
    for step in ("fts", "vector", "fuse_graph_touch", "total", "numpy"):
        assert reads[step]["n"] == 10 and 0 <= reads[step]["median"] <= reads[step]["p95"]
    assert reads["visible"]["median"] >= 5  # the global memories at least
    assert reads["raw_bytes"] > 500 * DIM * 4
    with speed.EmbedServerProcess("hash", dim=DIM) as url:
        writes = await speed.measure_writes(path, shape, url, singles=5, batches=2, batch_size=10)
        lag = await speed.measure_loop_lag(path, shape, url, burst=20, concurrency=5)
    assert writes["one_at_a_time_per_s"] > 0 and writes["batch_10_per_s"] > 0
    assert writes["left_unembedded"] == 0  # every write went through the embedding call
    assert lag["recalls_per_s"] > 0 and lag["lag_max_ms"] >= lag["lag_p99_ms"] >= 0


def counted_calls(monkeypatch, module, name: str) -> list[int]:
    calls: list[int] = []
    real = getattr(module, name)
    monkeypatch.setattr(module, name, lambda *args, **kwargs: (calls.append(1), real(*args, **kwargs))[1])
    return calls


def memories_in(path) -> int:
    conn = db.connect(path, migrate_schema=False)
    try:
        return int(conn.execute("SELECT count(*) FROM memories").fetchall()[0][0])
    finally:
        conn.close()


async def test_skewed_speed_benchmark_measures_every_viewer_class(tmp_path, monkeypatch):
    shape = SkewShape(600, users=40, channels=12, guilds=3, vocab=2000)
    path = tmp_path / "skew.db"
    await build(path, shape)
    classes = await speed.measure_classes(path, shape, per_class=4, warm=1)
    assert set(classes) == set(VIEWER_CLASSES)
    assert classes["busy"]["visible"]["median"] > classes["global_only"]["visible"]["median"] >= 600 * 0.01
    assert all(c["ratio"]["n"] == 4 and c["total"]["median"] > 0 for c in classes.values())
    assert all(0 < c["vector_cpu"]["median"] and 0 < c["fts_search"]["median"] <= c["fts"]["median"]
               for c in classes.values())  # the searches' own time, clocked on the storage
    forgotten = counted_calls(monkeypatch, speed, "forget_word_counts")
    before = memories_in(path)
    concurrency = await speed.measure_concurrency(path, shape, concurrency=4, burst=12)
    assert concurrency["x4"]["latency_ms"]["n"] == 12 and concurrency["p95_ratio"] > 0
    assert concurrency["x1"]["latency_ms"]["n"] == 24 and len(concurrency["x1_p95_runs"]) == 2  # before and after
    assert forgotten == [1, 1, 1] and memories_in(path) == before + 36   # a busy-channel message before each
    facts = await speed.measure_fact_writes(path, shape, per_kind=2)
    assert facts["busy_room"]["write_ms"]["n"] == 2
    upkeep = await speed.measure_maintenance(path, shape, added=20)
    assert upkeep["first_run_s"] > 0 and upkeep["incremental_added"] == 20


async def test_memory_per_process_and_the_forms_side_by_side(tmp_path, monkeypatch):
    """bench.speed --processes / --forms on a tiny world: every process's figures and their sum;
    each form's recalls in turn, the cache holding that form's rows."""
    import argparse
    shape = SkewShape(400, users=30, channels=8, guilds=2, vocab=1500)
    path = tmp_path / "skew.db"
    await build(path, shape)
    two = speed.memory_probe(path, 2)
    assert two["processes"] == 2 and len(two["each"]) == 2
    assert all(one["form"] == "int8" and one["cache_mb"] > 0 and one["all_keys_loaded"]["rssanon"] > 0
               for one in two["each"])
    assert two["total_cache_mb"] == pytest.approx(sum(one["cache_mb"] for one in two["each"]), abs=0.2)
    monkeypatch.delenv("MUNINN_VECTOR_FORM", raising=False)
    args = argparse.Namespace(forms="float32,int8", rounds=2, viewers=3, talk=True)
    forms = await speed.measure_forms(path, shape, args)
    assert set(forms) == {"float32", "int8"} and "MUNINN_VECTOR_FORM" not in __import__("os").environ
    assert all(len(forms[form]["p95"][kind]) == 2 and min(forms[form]["p95"][kind]) > 0
               for form in forms for kind in VIEWER_CLASSES)


def test_compact_bench_measures_recall_of_int8_against_exact():
    import numpy as np

    from bench import compact
    rng = np.random.default_rng(3)
    rows = compact.unit_rows(rng.standard_normal((600, 32)).astype(np.float32))
    got = compact.recall(rows[50:], rows[:50])
    assert got["bytes_per_row"]["int8"] < got["bytes_per_row"]["float32"] / 2
    assert all(0.9 <= got[f"k={k}"]["recall_rescored"] <= 1.0 for k in compact.KS)
    assert got[f"k={compact.KS[0]}"]["recall_rescored"] >= got[f"k={compact.KS[0]}"]["recall_int8_alone"]
    assert 0 < got["max_int8_score_error"] < 0.05


CONVERSATION = {
    "sample_id": "conv-test",
    "conversation": {
        "speaker_a": "Ann", "speaker_b": "Bo",
        "session_1_date_time": "1:56 pm on 8 May, 2023",
        "session_1": [
            {"speaker": "Ann", "dia_id": "D1:1", "text": "I adopted a greyhound called Pixel yesterday."},
            {"speaker": "Bo", "dia_id": "D1:2", "text": "Lovely! I am training for the Bergen marathon."},
            {"speaker": "Ann", "dia_id": "D1:3", "text": "Good luck with the running."},
        ],
        "session_2_date_time": "10:00 am on 20 June, 2023",
        "session_2": [
            {"speaker": "Bo", "dia_id": "D2:1", "text": "I finished the marathon in four hours."},
            {"speaker": "Ann", "dia_id": "D2:2", "text": "Pixel learned to fetch a frisbee."},
        ],
    },
    "qa": [
        {"question": "Which dog did Ann adopt yesterday?", "answer": "a greyhound", "evidence": ["D1:1"], "category": 4},
        {"question": "Which marathon did Bo train for and finish?", "answer": "Bergen",
         "evidence": ["D1:2; D2:1"], "category": 1},
        {"question": "What did Ann's cat learn?", "adversarial_answer": "fetch", "evidence": ["D2:2"],
         "category": 5},
        {"question": "Unanswerable", "answer": "-", "evidence": ["D9:9"], "category": 4},  # unknown turn: dropped
    ],
}


async def test_quality_benchmark_on_one_conversation(tmp_path):
    env = {"OLLAMA_EMBED_MODEL": quality.MINILM_NAME, "OLLAMA_COOLDOWN": "0", "MUNINN_GRAPH_LIMIT": "0"}
    async with FakeOllama(models=[quality.MINILM_NAME], dim=384) as fake:
        results = await quality.evaluate([CONVERSATION], fake.url, env, quality.MODES, 10,
                                         {"+1d": 1.0, "none": None})
    floors = results.pop("touch_floor")  # question-turn cosines, for choosing the touch floor
    assert floors["evidence"]["n"] == 3 and floors["other"]["n"] == 2 * 5 - 3  # 2 questions x 5 turns
    shares = [v["other"] for v in floors["share_above"].values()]
    assert shares == sorted(shares, reverse=True)  # a higher floor lets fewer through
    assert set(results) == {"+1d", "none"}
    assert set(results["+1d"]) == {"bm25", "cosine", "fts", "vector", "hybrid"}
    for mode in ("bm25", "fts"):
        found = results["+1d"][mode]
        assert found["overall"]["n"] == 2 and found["adversarial"]["n"] == 1 and found["single-hop"]["n"] == 1
        assert {k: v for k, v in found["single-hop"].items() if k != "r10_floor"} == {
            "r5": 1.0, "r10": 1.0, "all10": 1.0, "mrr": 1.0, "n": 1}
        assert found["multi-hop"]["r10"] == 1.0  # the malformed "D1:2; D2:1" evidence counts as two turns
    # asked the day after the last session (20 June): the evidence of 8 May is 43 days old
    age = results["+1d"]["fts"]["age"]
    assert age["15-60d"]["n"] == 2 and age["<=14d"]["n"] == 1 and age[">60d"]["n"] == 0
    assert results["none"]["fts"]["age"][">60d"]["n"] == 3
    assert results["+1d"]["hybrid"]["cosine"]["evidence"]["n"] >= 1  # recalled memories carry their cosine
    for protocol in results.values():
        for mode in protocol.values():
            for group in (mode[g] for g in quality.GROUPS if mode[g]):  # categories with no question are empty
                assert 0.0 <= group["r5"] <= group["r10"] <= 1.0 and 0.0 <= group["mrr"] <= 1.0
    # the engine's modes also say what the relevance floor leaves (never more than without it)
    assert 0.0 <= results["+1d"]["hybrid"]["overall"]["r10_floor"] <= results["+1d"]["hybrid"]["overall"]["r10"]


def test_the_reference_quality_run_has_the_layout_a_run_writes():
    """bench/reference/quality.json is compared with by hand (bench/README.md): it must stay readable
    as what `python -m bench.quality` writes today; a changed layout means a new reference run."""
    reference = json.loads(quality.REFERENCE.read_text())
    assert set(reference) == {"settings", "touch", "conversations", "results", "beam", "beam_chats", "seconds"}
    assert reference["settings"] == {} and reference["touch"] is True  # the defaults, as the bot asks
    results = reference["results"]
    assert set(results) == {*quality.PROTOCOLS, *quality.WORLDS, "touch_floor"}  # every protocol and world
    for name in (*quality.PROTOCOLS, *quality.WORLDS):  # a shared world has no plain cosine baseline
        assert set(results[name]) == set(quality.MODES) - ({"cosine"} if name in quality.WORLDS else set())
        for mode, scores in results[name].items():
            for group in quality.GROUPS:
                extra = {"r10_floor"} if mode in quality.ENGINE_MODES else set()
                assert set(scores[group]) == {"r5", "r10", "all10", "mrr", "n"} | extra
    hybrid, bm25 = results["+1d"]["hybrid"]["overall"], results["+1d"]["bm25"]["overall"]
    assert hybrid["n"] == bm25["n"] == 383 and hybrid["r10"] > bm25["r10"]  # the LoCoMo dev split, categories 1-4
    assert reference["beam_chats"] == 10 and set(reference["beam"]) == {*quality.PROTOCOLS, "touch_floor"}
    for mode in reference["beam"]["+1d"].values():  # BEAM's dev chats: every ability, abstention, updates
        assert mode["overall"]["n"] > 150 and "knowledge_update" in mode and "update_order" in mode
        assert set(mode["abstention"]) == {"abstention", "foreign"}


def test_scores_are_the_share_of_evidence_found():
    assert quality.score(["a", "x", "y", "z", "w", "b"], {"a", "b"}) == pytest.approx(
        {"r5": 0.5, "r10": 1.0, "all10": 1.0, "mrr": 1.0})
    assert quality.score(["x", "a"], {"a", "b"})["mrr"] == 0.5
    assert quality.score([], {"a"}) == {"r5": 0.0, "r10": 0.0, "all10": 0.0, "mrr": 0.0}


async def test_shared_world_protocol_asks_in_a_busy_room_and_checks_scope(tmp_path):
    other = json.loads(json.dumps(CONVERSATION).replace("Ann", "Cy").replace("Bo", "Di").replace(
        "conv-test", "conv-other"))
    env = {"OLLAMA_EMBED_MODEL": quality.MINILM_NAME, "OLLAMA_COOLDOWN": "0", "MUNINN_GRAPH_LIMIT": "0"}
    async with FakeOllama(models=[quality.MINILM_NAME], dim=384) as fake:
        results = await quality.evaluate([CONVERSATION, other], fake.url, env, ("bm25", "fts"), 10, {"+1d": 1.0},
                                         worlds=quality.WORLDS)
    assert set(results) >= {"+1d", *quality.WORLDS}
    for world in quality.WORLDS:
        assert results[world]["fts"]["overall"]["n"] == 4  # two conversations x two questions
    assert results["shared-dm"]["fts"]["room_share_top10"] == 0.0  # a DM never shows room memories
    # in the room, the other conversation's marathon lines compete: "room" ids reach the top 10
    assert results["shared-room"]["bm25"]["room_share_top10"] > 0
    assert results["shared-room"]["fts"]["room_share_top10"] > 0


def test_shared_world_scope_rule_refuses_what_the_asker_may_not_see():
    dm, room = shared_world.viewer_for(1, "dm"), shared_world.viewer_for(1, "room")

    def memory(scope: str, owner: int | None, channel: int | None, key: str) -> records.Memory:
        return records.Memory(id=1, text="x", scope=scope, owner_id=owner, channel_id=channel,
                            guild_id=shared_world.GUILD_ID, vis_key=key, importance=0.5, stability=1.0,
                            access_count=0, last_accessed=None, created_at=0.0, updated_at=0.0, archived_at=None,
                            archive_reason=None)

    own = memory("personal", 1, None, f"p:1:{shared_world.GUILD_ID}")
    others = memory("personal", 2, None, f"p:2:{shared_world.GUILD_ID}")
    my_room = memory("room", None, shared_world.room_of(1), f"r:{shared_world.room_of(1)}")
    their_room = memory("room", None, shared_world.room_of(2), f"r:{shared_world.room_of(2)}")
    assert shared_world.may_see(own, dm) and shared_world.may_see(own, room)
    assert shared_world.may_see(my_room, room) and not shared_world.may_see(my_room, dm)
    assert not shared_world.may_see(others, dm) and not shared_world.may_see(their_room, room)
    shared_world.check_scope([own, my_room], room, "q")
    with pytest.raises(shared_world.ScopeLeak):
        shared_world.check_scope([own, others], dm, "q")


def write_beam_chat(folder, number: int) -> None:
    """A tiny chat in BEAM's layout: two batches with time anchors, probing questions of three kinds."""
    chat = folder / str(number)
    (chat / "probing_questions").mkdir(parents=True)
    long_reply = "Here is the plan.\n\n" + "\n\n".join(f"Step {i}: " + "write tests " * 40 for i in range(12))
    batches = [
        {"batch_number": 1, "time_anchor": None, "turns": [[
            {"role": "user", "id": 0, "time_anchor": "March-15-2024", "content": "My garden planner uses Django. ->-> 1,1"},
            {"role": "assistant", "id": 1, "content": long_reply}]]},
        {"batch_number": 2, "time_anchor": None, "turns": [[
            {"role": "user", "id": 2, "time_anchor": "April-05-2024", "content": "The API answers in 400ms."},
            {"role": "assistant", "id": 3, "content": "Good to know."},
            {"role": "user", "id": 4, "content": "After caching, the API answers in 250ms."}]]}]
    probing = {
        "information_extraction": [{"question": "Which framework does my garden planner use?", "source_chat_ids": [0]}],
        "knowledge_update": [{"question": "How fast does the API answer?",
                              "source_chat_ids": {"original_info": [2], "updated_info": [4]}}],
        "abstention": [{"question": "Which database did my garden planner pick?", "source_chat_ids": None}]}
    (chat / "chat.json").write_text(json.dumps(batches))
    (chat / "probing_questions" / "probing_questions.json").write_text(json.dumps(probing))


def test_beam_chats_are_imported_with_their_dates_in_parts_a_memory_may_hold(tmp_path):
    write_beam_chat(tmp_path / "100K", 1)
    assert beam.folder(str(tmp_path)) == tmp_path / "100K"  # the 100K folder inside is looked into
    corpus = quality.Corpus.beam(beam.folder(str(tmp_path)))
    stored = corpus.records["beam-1"]
    assert stored[0]["text"] == "User: My garden planner uses Django."  # BEAM's plan marker left out
    parts = [r for r in stored if r["external_id"].startswith("beam-1:1#")]
    assert len(parts) > 1 and all(len(r["text"]) <= records.MAX_TEXT_CHARS for r in parts)
    assert {tuple(r["source_message_ids"]) for r in parts} == {("beam-1:1",)}  # the parts of one message
    assert stored[0]["created_at"] == beam.anchor_time("March-15-2024")
    assert stored[-1]["created_at"] == beam.anchor_time("April-05-2024") + 4  # the anchor + the message's index
    assert [q["category"] for q in corpus.asks] == ["information_extraction", "knowledge_update"]
    update = corpus.asks[1]
    assert update["original"] == {"beam-1:2"} and update["updated"] == {"beam-1:4"}
    assert [q["category"] for q in corpus.absent] == ["abstention"]
    assert quality.turns(["beam-1:1#0", "beam-1:1#3", "beam-1:0"]) == ["beam-1:1", "beam-1:0"]


def test_update_order_and_abstention_count_what_they_say():
    rows = [{"ranked": ["u", "o"], "original": ["o"], "updated": ["u"]},
            {"ranked": ["o", "x", "u"], "original": ["o"], "updated": ["u"]},
            {"ranked": ["o"], "original": ["o"], "updated": ["u"]}]  # the update not found: not counted
    assert quality.update_order(rows) == {"updated_first": 0.5, "both_found": 2, "questions": 3}
    absent = [{"injected": 0}, {"injected": 5}, {"injected": 0}, {"injected": 3}]
    assert quality.abstention(absent) == {"none_injected": 0.5, "mean_injected": 2.0, "n": 4}


async def test_quality_benchmark_on_a_beam_chat_with_foreign_questions(tmp_path):
    write_beam_chat(tmp_path, 1)
    corpus = quality.Corpus.beam(tmp_path)
    corpus.foreign(quality.Corpus([CONVERSATION]), 2)
    env = {"OLLAMA_EMBED_MODEL": quality.MINILM_NAME, "OLLAMA_COOLDOWN": "0", "MUNINN_GRAPH_LIMIT": "0",
           "MUNINN_INJECT_MIN_COSINE": "0.99"}
    async with FakeOllama(models=[quality.MINILM_NAME], dim=384) as fake:
        results = await quality.evaluate_corpus(corpus, fake.url, env, quality.MODES, 10, {"+1d": 1.0})
    found = results["+1d"]
    assert set(found["hybrid"]) >= {"overall", "information_extraction", "knowledge_update", "update_order",
                                     "abstention"}
    assert found["hybrid"]["overall"]["n"] == 2 and found["hybrid"]["update_order"]["questions"] == 1
    assert found["hybrid"]["abstention"]["foreign"]["n"] == 2 and found["hybrid"]["abstention"]["abstention"]["n"] == 1
    # at a floor no memory reaches, nothing is injected, and R@10 past the floor is 0
    assert found["hybrid"]["abstention"]["foreign"]["none_injected"] == 1.0
    assert found["hybrid"]["overall"]["r10_floor"] == 0.0 < found["hybrid"]["overall"]["r10"]
    assert found["cosine"]["abstention"]["foreign"]["none_injected"] == 0.0  # a baseline always injects
