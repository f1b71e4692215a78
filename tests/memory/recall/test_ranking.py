"""Ranking as time passes (bot/memory/recall/ranking.py, bot/memory/recall/dates.py): relevance decides,
time breaks near-ties, a named date lifts memories of that date, and only relevant
recalls are touched. Real engine and database, the fake Ollama for embeddings."""
from __future__ import annotations

import math
from datetime import UTC, datetime

import pytest

from bot.memory.engine import Engine
from bot.memory.recall import ranking, touches
from bot.memory.recall.dates import DateHint, hints
from bot.memory.records import NewMemory
from bot.memory.scope import Viewer
from bot.memory.sql import store

DAY = 86400.0
NOW = datetime(2025, 9, 1, tzinfo=UTC).timestamp()
ME = Viewer(user_id=7, dm=True)

pytestmark = pytest.mark.usefixtures("backend")  # the ranking rules on both storage backends


def mine(text: str, *, days_ago: float, importance: float = 0.5) -> NewMemory:
    return NewMemory(text, "personal", owner_id=7, importance=importance, created_at=NOW - days_ago * DAY)


async def relevant_old_and_irrelevant_recent(engine: Engine) -> tuple[int, int]:
    old = await engine.remember(mine("Pixel the greyhound loves running on the beach", days_ago=200, importance=0.2))
    recent = await engine.remember(mine("bought a Pixel phone case today", days_ago=1, importance=1.0))
    for _ in range(3):  # the recent one was recalled (touched) again and again
        await engine.write(touches.touch_and_load_all, engine.storage, [([recent], [recent], NOW - 3600)],
                           engine.settings.stability_growth)
    return old, recent


@pytest.mark.parametrize("vectors", [False, True], ids=["fts-only", "hybrid"])
async def test_a_relevant_old_memory_beats_an_irrelevant_recent_one(vectors, engine, fts_engine):
    # The seed's keyword score (BM25 x strength x (1 + importance)) put the fresh, important,
    # often-recalled phone case first: its strength was 1.0 against the old memory's 0.3.
    eng = engine if vectors else fts_engine
    old, recent = await relevant_old_and_irrelevant_recent(eng)
    for as_of in (NOW, NOW + 365 * DAY):
        result = await eng.recall("Pixel greyhound beach", ME, as_of=as_of, touch=False)
        assert result.ids[:2] == [old, recent]
        assert result.mode == ("hybrid" if vectors else "fts-only")


async def test_time_breaks_a_tie_between_equally_relevant_memories(fts_engine):
    faded = await fts_engine.remember(mine("the storage unit code is 4417", days_ago=120))
    fresh = await fts_engine.remember(mine("the storage unit code is 9052", days_ago=2))
    assert (await fts_engine.recall("storage unit code", ME, as_of=NOW, touch=False)).ids == [fresh, faded]


def test_the_time_factor_stays_within_the_weight():
    assert ranking.time_factor(ranking.vitality(NOW, NOW, 7.0, 1.0)) == pytest.approx(1 + ranking.TIME_WEIGHT)
    assert ranking.time_factor(ranking.vitality(NOW, NOW - 3000 * DAY, 7.0, 1.0)) == pytest.approx(1.0)
    assert ranking.vitality(NOW, NOW - 7 * DAY, 7.0, 0.0) == pytest.approx(math.exp(-1) / 2)


async def test_a_named_date_lifts_memories_of_that_date(fts_engine):
    july = datetime(2025, 7, 14, 15, tzinfo=UTC).timestamp()
    march = datetime(2025, 3, 2, 15, tzinfo=UTC).timestamp()
    in_march = await fts_engine.remember(NewMemory("went hiking with Tom", "personal", owner_id=7, created_at=march))
    in_july = await fts_engine.remember(NewMemory("went hiking with Ann", "personal", owner_id=7, created_at=july))
    assert (await fts_engine.recall("hiking", ME, as_of=NOW, touch=False)).ids == [in_july, in_march]  # newer wins a tie
    assert (await fts_engine.recall("Where did I go hiking in March?", ME, as_of=NOW, touch=False)).ids[0] == in_march
    assert (await fts_engine.recall("hiking on 2 March, 2025", ME, as_of=NOW, touch=False)).ids[0] == in_march
    assert (await fts_engine.recall("hiking on 14 July", ME, as_of=NOW, touch=False)).ids[0] == in_july


def test_dates_are_read_from_questions():
    assert hints("What did John do on 7 July, 2023?") == [DateHint(7, 7, 2023)]
    assert hints("the week before August 3, 2023") == [DateHint(8, 3, 2023)]
    assert hints("When did Melanie go camping in July?") == [DateHint(7)]
    assert hints("What happened in May 2023?") == [DateHint(5, year=2023)]
    assert hints("since March") == [DateHint(3)]
    assert hints("May I ask what you may march for?") == []  # verbs, not months
    assert hints("nothing here, 45 July") == []


async def test_only_memories_above_the_cosine_floor_are_touched(fake_ollama, make_settings):
    basis = [[1.0 if i == j else 0.0 for i in range(fake_ollama.dim)] for j in range(3)]
    fake_ollama.vectors = {
        "where is my passport": basis[0],
        "the passport is in the top drawer": [0.9, 0.1] + [0.0] * (fake_ollama.dim - 2),  # cosine 0.99
        "my passport photo was awful": [0.2, 0.0, 0.98] + [0.0] * (fake_ollama.dim - 3),   # cosine 0.2
        "tomatoes need more water": basis[1],                                               # cosine 0
    }
    texts = list(fake_ollama.vectors)[1:]
    async with Engine(make_settings(fake_ollama.url, MUNINN_TOUCH_MIN_COSINE="0.3")) as engine:
        ids = [await engine.remember(mine(text, days_ago=3)) for text in texts]
        result = await engine.recall("where is my passport", ME, as_of=NOW, limit=5)
        assert set(result.ids) == set(ids)  # all three were recalled (limit 5, three memories)...
        cosines = {r.memory.id: r.candidate.cosine for r in result.memories}
        assert cosines[ids[0]] == pytest.approx(0.99, abs=0.01) and cosines[ids[2]] == pytest.approx(0.0, abs=1e-6)
        counts = [(await engine.write(store.get, i)).access_count for i in ids]
        assert counts == [1, 0, 0]  # ...but only the relevant one counts as recalled
        assert {r.memory.id: r.candidate.reason()["touched"] for r in result.memories} == {
            ids[0]: True, ids[1]: False, ids[2]: False}  # and each result says so
        quiet = await engine.recall("where is my passport", ME, as_of=NOW, limit=5, touch=False)
        assert all("touched" not in r.candidate.reason() for r in quiet.memories)


def test_the_floor_is_per_model_with_a_relative_rule_for_unmeasured_models():
    assert ranking.touch_floor("all-minilm:latest", None) == ranking.TOUCH_FLOORS["all-minilm"]
    assert ranking.touch_floor("all-minilm", 0.5) == 0.5  # the setting wins
    assert ranking.touch_floor("nomic-embed-text", None) is None
    from bot.memory.recall.retrieval import Candidate
    chosen = [Candidate(1, similarity=0.8), Candidate(2, similarity=0.41), Candidate(3, similarity=0.39)]
    assert ranking.worth_touching(chosen, vector_ran=True, floor=None) == [1, 2]  # >= half the best
    assert ranking.worth_touching(chosen, vector_ran=False, floor=0.7) == [1, 2, 3]  # keyword-only: all hits


def test_a_clear_keyword_winner_leads():
    from bot.memory.recall.retrieval import Candidate
    paraphrase = Candidate(1, vector_rank=1, fused=0.5)
    exact = Candidate(2, fts_rank=1, fts_score=-6.0, fused=0.4)
    runner_up = Candidate(3, fts_rank=2, fts_score=-5.0, fused=0.3)
    ranked = [paraphrase, exact, runner_up]
    assert ranking.keyword_winner_first(ranked, 1.1) == [exact, paraphrase, runner_up]  # 6 / 5 = 1.2 >= 1.1
    assert ranking.keyword_winner_first(ranked, 1.3) == ranked  # not clear enough
    assert ranking.keyword_winner_first(ranked, 0) == ranked  # off
    assert ranking.keyword_winner_first([paraphrase, exact], 1.1) == [paraphrase, exact]  # no runner-up to beat
