"""Hybrid retrieval and every row of the seed's fallback table, through the real client and a fake Ollama,
on both storage backends."""
from __future__ import annotations

import asyncio
import dataclasses
import time

import pytest

from bot.llm.ollama import OllamaUnavailable
from bot.memory.engine import Engine
from bot.memory.recall import retrieval
from bot.memory.recall.retrieval import NEIGHBOUR_FALLOFF, Candidate, fuse, lend_to_neighbours, spread_to_neighbours
from bot.memory.records import NewMemory
from bot.memory.scope import Viewer

pytestmark = pytest.mark.usefixtures("backend")

ROOM = dict(channel_id=10, guild_id=100)
ALICE = Viewer(user_id=1, channel_id=10, guild_id=100)


async def seed_gpu_memories(engine: Engine) -> dict[str, int]:
    ids = {}
    ids["gpu"] = await engine.remember(NewMemory("the GPU server has 4x RTX 3090", "room", owner_id=1, **ROOM))
    ids["dark"] = await engine.remember(NewMemory("Oz prefers dark mode", "room", owner_id=1, **ROOM))
    ids["coffee"] = await engine.remember(NewMemory("the team drinks coffee at ten", "room", owner_id=1, **ROOM))
    return ids


# -- the fallback table --------------------------------------------------------

async def test_ollama_up_with_embeddings_runs_full_hybrid(engine, fake_ollama):
    ids = await seed_gpu_memories(engine)
    result = await engine.recall("What GPU does the server have?", ALICE)
    assert result.mode == "hybrid" and result.vector_status == "ok"
    top = result.memories[0]
    assert top.memory.id == ids["gpu"]
    assert top.candidate.via == "both"
    assert top.candidate.reason()["fts_rank"] == 1 and top.candidate.reason()["vector_rank"] == 1
    s = engine.settings  # RRF of two rank-1 hits, plus what its stored neighbours lend it
    assert top.candidate.fused >= (s.rrf_weight_fts + s.rrf_weight_vec) / (s.rrf_k + 1) - 1e-12
    assert fake_ollama.embed_requests()[-1]["input"] == ["What GPU does the server have?"]


async def test_ollama_up_but_no_embeddings_yet_uses_fts(fake_ollama, make_settings):
    async with Engine(make_settings("")) as offline:  # stored with no Ollama: no vectors exist
        await seed_gpu_memories(offline)
    async with Engine(make_settings(fake_ollama.url)) as engine:
        result = await engine.recall("GPU server", ALICE)
    assert result.mode == "fts-only" and result.vector_status == "no-embeddings"
    assert result.texts[0] == "the GPU server has 4x RTX 3090"


@pytest.mark.parametrize("failure", ["down", "error", "slow", "missing", "wrong_dim", "garbage"])
async def test_ollama_failures_fall_back_to_fts(engine, fake_ollama, failure):
    ids = await seed_gpu_memories(engine)
    expected_status = {"down": "unreachable", "error": "unreachable", "slow": "unreachable",
                       "missing": "model-missing", "wrong_dim": "wrong-size", "garbage": "bad-response"}[failure]
    if failure == "down":
        await fake_ollama.go_down()
    elif failure == "error":
        fake_ollama.mode = "error"
    elif failure == "slow":
        fake_ollama.mode, fake_ollama.delay = "slow", 5.0
    elif failure == "missing":
        fake_ollama.missing = {"nomic-embed-text"}
    elif failure == "wrong_dim":
        fake_ollama.wrong_dim = 384
    else:
        fake_ollama.embed_garbage = True
    started = time.monotonic()
    result = await engine.recall("GPU server", ALICE)
    assert time.monotonic() - started < 3.0  # the embed timeout (1 s in tests) bounds the wait
    assert result.mode == "fts-only" and result.vector_status == expected_status
    assert result.ids[0] == ids["gpu"]


async def test_a_cancelled_recall_stays_cancelled_when_the_embedding_swallows_it(engine, fake_ollama,
                                                                                  monkeypatch):
    """A client library can turn a cancellation into a timeout it then handles (aiohttp's timer racing
    the cancel): the embedding returns "unreachable" instead of raising. The recall that was
    cancelled must still end cancelled, not go on with keywords (a Ctrl-C would be lost)."""
    await seed_gpu_memories(engine)
    fake_ollama.mode, fake_ollama.delay = "slow", 5.0
    embed = engine.ollama.embed
    asked = asyncio.Event()

    async def swallowing(texts):
        asked.set()
        try:
            return await embed(texts)
        except asyncio.CancelledError:
            raise OllamaUnavailable("timed out") from None

    monkeypatch.setattr(engine.ollama, "embed", swallowing)
    recall = asyncio.create_task(engine.recall("GPU server", ALICE))
    await asyncio.wait_for(asked.wait(), 2)
    await asyncio.sleep(0.3)  # the keyword read (milliseconds) is done: the recall waits on the embedding
    recall.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(recall, 2)
    assert recall.cancelled()


async def test_no_keyword_match_returns_vector_only(engine, fake_ollama):
    fake_ollama.synonyms = {"graphics": "gpu", "card": "rtx"}
    ids = await seed_gpu_memories(engine)
    result = await engine.recall("graphics card?", ALICE)
    assert result.mode == "vector-only"
    assert result.ids[0] == ids["gpu"] and result.memories[0].candidate.via == "vector"


async def test_no_ollama_url_is_fts_only_and_never_calls_out(fts_engine):
    ids = await seed_gpu_memories(fts_engine)
    result = await fts_engine.recall("GPU", ALICE)
    assert result.mode == "fts-only" and result.vector_status == "disabled"
    assert result.ids == [ids["gpu"]]


async def test_memory_stored_while_ollama_down_is_backfilled(engine, fake_ollama):
    await fake_ollama.go_down()
    memory_id = await engine.remember(NewMemory("the GPU server has 4x RTX 3090", "room", owner_id=1, **ROOM))
    assert (await engine.get(memory_id)).embedded is False
    assert (await engine.recall("GPU", ALICE)).ids == [memory_id]  # still found by keywords
    await fake_ollama.come_up()
    assert await engine.backfill() == 1
    assert (await engine.get(memory_id)).embedded is True
    result = await engine.recall("GPU", ALICE)
    assert result.mode == "hybrid" and result.memories[0].candidate.via == "both"


async def test_dead_ollama_is_not_asked_again_during_cooldown(fake_ollama, make_settings):
    async with Engine(make_settings(fake_ollama.url, OLLAMA_COOLDOWN="30")) as engine:
        await seed_gpu_memories(engine)
        fake_ollama.mode, fake_ollama.delay = "slow", 5.0
        first = await engine.recall("GPU", ALICE)
        calls = len(fake_ollama.embed_requests())
        started = time.monotonic()
        second = await engine.recall("GPU", ALICE)
        assert time.monotonic() - started < 0.5
        assert len(fake_ollama.embed_requests()) == calls
        assert first.vector_status == second.vector_status == "unreachable"


# -- fusion, graph, touch ------------------------------------------------------

def test_rrf_scores_follow_the_seed_formula():
    fts_hits = [Candidate(1, fts_rank=1, fts_score=-2.0), Candidate(2, fts_rank=2, fts_score=-1.0)]
    vec_hits = [Candidate(2, vector_rank=1, distance=0.1), Candidate(3, vector_rank=10, distance=0.5)]
    fused = fuse(fts_hits, vec_hits, k=60, limit=5)
    scores = {c.memory_id: c.fused for c in fused}
    assert scores[2] == pytest.approx(1 / 62 + 1 / 61)
    assert scores[1] == pytest.approx(1 / 61)
    assert scores[3] == pytest.approx(1 / 70)
    assert [c.memory_id for c in fused] == [2, 1, 3]
    assert [c.memory_id for c in fuse(fts_hits, vec_hits, k=60, limit=2)] == [2, 1]
    weighted = fuse(fts_hits, vec_hits, k=60, limit=5, weight_fts=0.0)
    assert weighted[0].memory_id == 2 and weighted[-1].memory_id == 1


async def test_candidates_are_limit_times_three(engine, fake_ollama, monkeypatch):
    await engine.remember_many([NewMemory(f"note {i} about the deployment pipeline", "room", owner_id=1, **ROOM)
                                for i in range(40)])
    asked = {}

    def spy(name):
        real = getattr(engine.storage, name)

        def wrapped(*args):
            out = real(*args)
            hits = out[0] if name == "keyword_step" else out  # (hits, the index state)
            asked[name] = (args[3] if name == "keyword_step" else args[4], len(hits))
            return out
        monkeypatch.setattr(engine.storage, name, wrapped)
    spy("keyword_step")
    spy("vector_candidates")
    result = await engine.recall("deployment pipeline", ALICE, limit=5)
    assert asked == {"keyword_step": (15, 15), "vector_candidates": (15, 15)}
    assert len(result.memories) == 5


async def test_graph_adds_up_to_three_linked_active_visible_memories(fts_engine):
    engine = fts_engine
    lang = await engine.remember(NewMemory("Project X is written in Rust", "room", owner_id=1, **ROOM))
    linked = await engine.remember_many(
        [NewMemory(f"Project X fact {name}", "room", owner_id=1, **ROOM) for name in ("arm", "ci", "db", "docs")])
    archived = await engine.remember(NewMemory("old deploy notes", "room", owner_id=1, **ROOM))
    secret = await engine.remember(NewMemory("Bob's salary", "personal", owner_id=2, guild_id=100, channel_id=10))

    for other in linked:
        await engine.write(engine.storage.add_link, lang, other, "co_extracted")
    await engine.write(engine.storage.add_link, archived, lang, "semantic", weight=0.99)
    await engine.write(engine.storage.add_link, lang, secret, "semantic", weight=0.99)
    await engine.archive(archived, "test")
    result = await engine.recall("which language uses Rust", ALICE, limit=1)
    assert result.ids[0] == lang
    graph = [r for r in result.memories if r.candidate.via == "link"]
    assert len(graph) == 3
    assert all(r.memory.id in linked for r in graph)
    assert all(r.candidate.link["from"] == lang and r.candidate.link["kind"] == "co_extracted" for r in graph)
    assert archived not in result.ids and secret not in result.ids


async def test_superseded_links_are_not_walked(fts_engine):
    new = await fts_engine.remember(NewMemory("Ana lives in Oslo", "room", owner_id=1, **ROOM))
    old = await fts_engine.remember(NewMemory("the office plant is a cactus", "room", owner_id=1, **ROOM))
    await fts_engine.write(fts_engine.storage.add_link, old, new, "superseded_by")
    assert (await fts_engine.recall("Oslo", ALICE)).ids == [new]


async def test_touch_counts_recalls_and_no_touch_does_not(fts_engine):
    memory_id = await fts_engine.remember(NewMemory("the GPU server has 4x RTX 3090", "room", owner_id=1, **ROOM))
    before = await fts_engine.get(memory_id)
    await fts_engine.recall("GPU", ALICE, touch=False)
    assert (await fts_engine.get(memory_id)).access_count == 0
    moment = time.time() + 3600
    await fts_engine.recall("GPU", ALICE, as_of=moment)
    after = await fts_engine.get(memory_id)
    assert after.access_count == 1 and after.last_accessed == pytest.approx(moment)
    assert after.stability == pytest.approx(before.stability * fts_engine.settings.stability_growth)


async def test_graph_additions_are_touched_too(fts_engine):
    a = await fts_engine.remember(NewMemory("Project X is written in Rust", "room", owner_id=1, **ROOM))
    b = await fts_engine.remember(NewMemory("it deploys to ARM64 boards", "room", owner_id=1, **ROOM))
    await fts_engine.write(fts_engine.storage.add_link, a, b, "co_extracted")
    result = await fts_engine.recall("Rust", ALICE)
    assert result.ids == [a, b]
    assert (await fts_engine.get(b)).access_count == 1


async def test_strong_important_memories_rank_first_for_equal_relevance(fts_engine):
    now = time.time()
    weak = await fts_engine.remember(NewMemory("the server room key is blue", "room", owner_id=1,
                                               importance=0.1, created_at=now - 90 * 86400, **ROOM))
    strong = await fts_engine.remember(NewMemory("the server room key is red", "room", owner_id=1,
                                                 importance=0.9, created_at=now, **ROOM))
    result = await fts_engine.recall("server room key", ALICE, touch=False)
    assert result.ids == [strong, weak]


async def test_as_of_hides_memories_created_later(engine):
    old = await engine.remember(NewMemory("the GPU server has 4x RTX 3090", "room", owner_id=1,
                                          created_at=1_000_000.0, **ROOM))
    await engine.remember(NewMemory("the GPU server now has 8x H100", "room", owner_id=1,
                                    created_at=2_000_000.0, **ROOM))
    result = await engine.recall("GPU server", ALICE, as_of=1_500_000.0, touch=False)
    assert result.ids == [old]


async def test_archived_memories_leave_both_paths(engine):
    ids = await seed_gpu_memories(engine)
    await engine.archive(ids["gpu"], "test")
    result = await engine.recall("What GPU does the server have?", ALICE)
    assert ids["gpu"] not in result.ids
    await engine.restore(ids["gpu"])
    assert (await engine.recall("GPU", ALICE)).ids[0] == ids["gpu"]


@pytest.mark.parametrize("query", [
    "", "   ", "?!", "a" * 4000, "word " * 800, 'he said "AND" NEAR(x, y) * ^ : ( ] {', "🎉🔥💾",
    "<@123> <@&456> @everyone @here", "café naïve Ünïcödé", "東京の天気", "\x00nul\x00", "\u202e\u200b rtl",
    "NOT", "OR OR OR", "-", "col:value", '"""',
])
async def test_hostile_queries_never_raise(engine, query):
    await seed_gpu_memories(engine)
    result = await engine.recall(query, ALICE)
    assert result.mode in ("hybrid", "fts-only", "vector-only")


async def test_diacritics_and_stemming_match(fts_engine):
    memory_id = await fts_engine.remember(NewMemory("Ana loves the café near the stations", "room", owner_id=1, **ROOM))
    assert (await fts_engine.recall("cafe station", ALICE)).ids == [memory_id]


async def test_each_result_says_why(engine):
    await seed_gpu_memories(engine)
    data = (await engine.recall("GPU server", ALICE)).to_dict()
    assert data["mode"] == "hybrid"
    for memory in data["memories"]:
        assert memory["reason"]["via"] in ("fts", "vector", "both", "link")
        assert "fused_score" in memory["reason"] or "link" in memory["reason"]



async def test_neighbours_lend_score_within_key_and_time_window(fts_engine):
    t0 = time.time() - 10_000
    a, b = await fts_engine.remember_many([NewMemory(t, "room", owner_id=1, created_at=t0 + i, **ROOM)
                                           for i, t in enumerate(["Mel: what did you paint?", "Caroline: a sunrise"])])
    # Stored between b and c, visible to Alice, but under another key: not their neighbour.
    mine = await fts_engine.remember(NewMemory("Alice: my own note", "personal", owner_id=1, guild_id=100,
                                               created_at=t0 + 2))
    c = await fts_engine.remember(NewMemory("Caroline: by the lake", "room", owner_id=1, created_at=t0 + 3, **ROOM))
    late = await fts_engine.remember(NewMemory("Zed: hours later", "room", owner_id=1, created_at=t0 + 7200, **ROOM))
    fused = {a: 1.0, b: 0.1, mine: 0.9, c: 0.3, late: 0.4}
    ranked = [Candidate(mid, fts_rank=r, fts_score=-1.0, fused=f) for r, (mid, f) in enumerate(fused.items(), start=1)]
    keys = await fts_engine.read(fts_engine.storage.visible_keys, ALICE)
    out = await fts_engine.write(spread_to_neighbours, ranked, keys, 0.5, reach=1)
    got = {cand.memory_id: cand for cand in out}
    assert got[b].fused == pytest.approx(0.1 + 0.5 * 1.0) and got[b].neighbour_of == a  # the larger loan
    assert got[a].fused == pytest.approx(1.0 + 0.5 * 0.1)
    assert got[c].fused == pytest.approx(0.3 + 0.5 * 0.1)  # nothing from `mine` (other key) or `late` (window)
    assert got[mine].fused == pytest.approx(0.9) and got[late].fused == pytest.approx(0.4)
    assert [cand.memory_id for cand in out] == [a, mine, b, late, c]
    assert got[b].reason()["neighbour_of"] == a and got[b].via == "fts"
    assert await fts_engine.write(spread_to_neighbours, ranked[:1], keys, 0.5) == ranked[:1]  # nothing new surfaces


async def test_the_loan_reaches_two_places_each_side_and_falls_off(fts_engine):
    t0 = time.time() - 10_000
    texts = ["Ann: hello", "Mel: what did you paint?", "Caroline: let me think", "Caroline: a sunrise",
             "Caroline: over the lake", "Mel: lovely"]
    ids = await fts_engine.remember_many([NewMemory(t, "room", owner_id=1, created_at=t0 + i, **ROOM)
                                          for i, t in enumerate(texts)])
    hit = ids[3]  # "a sunrise" matched; everything else is a weak candidate
    def ranked() -> list[Candidate]:  # fresh each time: the spread adds to the candidates it is given
        return [Candidate(mid, fts_rank=r, fts_score=-1.0, fused=1.0 if mid == hit else 0.01)
                for r, mid in enumerate(ids, start=1)]
    keys = await fts_engine.read(fts_engine.storage.visible_keys, ALICE)
    got = {c.memory_id: c for c in await fts_engine.write(spread_to_neighbours, ranked(), keys, 0.5)}
    loan = {mid: round(got[mid].fused - 0.01, 6) for mid in ids if mid != hit}
    falloff = retrieval.NEIGHBOUR_FALLOFF
    assert retrieval.NEIGHBOUR_REACH == 2
    assert loan == {ids[0]: 0.005, ids[1]: round(0.5 * falloff, 6), ids[2]: 0.5, ids[4]: 0.5,
                    ids[5]: round(0.5 * falloff, 6)}  # ids[0] is 3 places from the hit: only its weak neighbour lends
    assert got[ids[1]].neighbour_of == hit and got[ids[0]].neighbour_of == ids[1]
    # the walk steps over neither the time window nor as_of: a later line is never lent to
    assert hit not in {c.neighbour_of for c in await fts_engine.write(
        spread_to_neighbours, ranked(), keys, 0.5, t0 + 3.5) if c.memory_id in ids[4:]}


async def test_the_loan_is_what_a_walk_over_every_stored_memory_gives(fts_engine):
    """The walk starts only from hits with another candidate near them (retrieval.lenders): the
    loans must be those of a walk from every hit over all stored memories, in conversations
    (lines seconds apart, hours between them) under two visible keys and one invisible one,
    with archived lines stepped over, with and without as_of."""
    import random
    rng = random.Random(12)
    t0 = time.time() - 200_000
    where = [dict(scope="room", **ROOM), dict(scope="personal", guild_id=100),
             dict(scope="room", channel_id=11, guild_id=100)]  # Alice does not see room 11
    new = []
    for i in range(160):
        session, place = divmod(i, 16)
        new.append(NewMemory(f"line {i}", owner_id=1, created_at=t0 + session * 9000 + place * rng.uniform(5, 400),
                             **where[rng.choice((0, 0, 1, 2))]))
    ids = await fts_engine.remember_many(new)
    stored = {mid: m for mid, m in zip(ids, new, strict=True)}
    archived = set(rng.sample(ids, 15))
    for mid in archived:
        await fts_engine.archive(mid, "test")
    live = [mid for mid in ids if mid not in archived]
    keys = await fts_engine.read(fts_engine.storage.visible_keys, ALICE)
    key_of = {mid: m.vis_key for mid, m in stored.items()}
    active = {key: sorted(mid for mid in ids if key_of[mid] == key and mid not in archived) for key in set(key_of.values())}

    def expected(chosen: dict[int, float], as_of: float | None) -> dict[int, tuple[float, int | None]]:
        loans: dict[int, tuple[float, int]] = {}
        for hit, fused in chosen.items():
            if key_of[hit] not in keys:
                continue
            line = active[key_of[hit]]
            at = line.index(hit)
            for step in (-1, 1):
                for places in range(1, retrieval.NEIGHBOUR_REACH + 1):
                    if not 0 <= at + step * places < len(line):
                        break
                    other = line[at + step * places]
                    t = stored[other].created_at
                    amount = 0.5 * fused * retrieval.NEIGHBOUR_FALLOFF ** (places - 1)
                    if (other in chosen and abs(t - stored[hit].created_at) <= retrieval.NEIGHBOUR_WINDOW_S
                            and (as_of is None or t <= as_of) and amount > loans.get(other, (0.0, 0))[0]):
                        loans[other] = (amount, hit)
        return {mid: (fused + loans[mid][0], loans[mid][1]) if mid in loans else (fused, None)
                for mid, fused in chosen.items()}

    lent = 0
    for trial in range(8):
        chosen = {mid: rng.uniform(0.01, 1.0) for mid in rng.sample(live, 30)}  # candidates are active
        as_of = None if trial % 2 else t0 + rng.uniform(3, 8) * 9000
        ranked = [Candidate(mid, fts_rank=r, fts_score=-1.0, fused=f) for r, (mid, f) in enumerate(chosen.items(), 1)]
        out = await fts_engine.read(fts_engine.storage.spread_to_neighbours, ranked, keys, 0.5, as_of)
        want = expected(chosen, as_of)
        assert {c.memory_id: (pytest.approx(c.fused), c.neighbour_of) for c in out} == want
        lent += sum(1 for _, lender in want.values() if lender is not None)
        # the final order from the rows the neighbour step read (Candidate.vitals) is the one from reading them again
        now = t0 + 400_000
        given = await fts_engine.read(fts_engine.storage.final_order, [dataclasses.replace(c) for c in out], now)
        read = await fts_engine.read(fts_engine.storage.final_order,
                                     [dataclasses.replace(c, vitals=None) for c in out], now)
        assert [(c.memory_id, c.fused) for c in given] == [(c.memory_id, c.fused) for c in read]
    assert lent > 20  # the trials exercise the walk, not only its shortcut


async def test_a_changed_embedding_model_is_detected_at_start_and_recall_falls_back(fake_ollama, make_settings,
                                                                                     caplog):
    async with Engine(make_settings(fake_ollama.url)) as engine:
        ids = await seed_gpu_memories(engine)
    fake_ollama.models.append("all-minilm")  # same dimension: only the recorded model name tells them apart
    with caplog.at_level("WARNING"):
        async with Engine(make_settings(fake_ollama.url, OLLAMA_EMBED_MODEL="all-minilm")) as engine:
            assert "muninn reindex" in caplog.text and "'nomic-embed-text'" in caplog.text
            result = await engine.recall("GPU server", ALICE)
    assert result.mode == "fts-only" and result.vector_status == "model-mismatch"
    assert result.ids[0] == ids["gpu"]


def test_an_equal_loan_goes_to_the_nearer_hit_whatever_the_row_order():
    # two hits lend memory 5 exactly as much (0.1): the one place away wins, in either row order
    # (SQLite's and PostgreSQL's walks return their rows in different orders)
    def lent(rows: list[tuple[int, int, int]]) -> tuple[int | None, float]:
        by_id = {4: Candidate(4, fused=1.0), 3: Candidate(3, fused=1.0 / NEIGHBOUR_FALLOFF), 5: Candidate(5, fused=0.0)}
        out = {c.memory_id: c for c in lend_to_neighbours(by_id, rows, 0.1)}
        return out[5].neighbour_of, out[5].fused
    rows = [(4, 5, 1), (3, 5, 2)]
    assert lent(rows) == lent(rows[::-1]) == (4, 0.1)


async def test_the_rarest_word_outranks_a_long_memory_repeating_a_commoner_one(fts_engine):
    # BM25 counting every repeat put the lamp list first: eight "lamps" outweighed one "quokka",
    # the rarer word and the one the question is about. Each word counts once per memory.
    await fts_engine.remember_many([NewMemory(f"the team met in the small office on day {i} to plan the week",
                                              "room", owner_id=1, **ROOM) for i in range(36)])
    await fts_engine.remember(NewMemory("Bob sells lamps at the market", "room", owner_id=2, **ROOM))
    lamps = await fts_engine.remember(NewMemory(
        "lamps by the door, lamps on the stairs, lamps in the hall, lamps by the sofa, "
        "lamps on the porch, lamps in the attic, lamps for the desk and lamps outside", "room", owner_id=1, **ROOM))
    quokka = await fts_engine.remember(NewMemory("Oz has a pet quokka", "room", owner_id=1, **ROOM))
    result = await fts_engine.recall("did the quokka break the lamps?", ALICE, touch=False)
    assert result.ids[0] == quokka and lamps in result.ids
