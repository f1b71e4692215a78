"""Score fusion of the keyword and vector paths, and the relevance floor for prompts, through the
real engine and a fake Ollama whose vectors the tests choose, on both storage backends."""
from __future__ import annotations

import math

import pytest

from bot.memory.engine import Engine
from bot.memory.recall import fusion, ranking
from bot.memory.recall.retrieval import Candidate
from bot.memory.records import NewMemory
from bot.memory.scope import Viewer

pytestmark = pytest.mark.usefixtures("backend")

DIM = 768
ALICE = Viewer(user_id=1, dm=True)
QUESTION = "which pastry does Ada bake on sundays"
PARAPHRASE = "Bo: my weekend treat is a cinnamon bun I make myself"      # no word of the question
WORDY = "Ada: which pastry shop on sundays? I never bake, Ada said"      # most of its words, another meaning
OTHERS = ["Bo: the train to Bergen was late again", "Bo: I repainted the fence green",
          "Cy: my cat sleeps on the keyboard"]


def unit(*weights: float) -> list[float]:
    """A unit vector with these first components (the rest 0)."""
    n = math.sqrt(sum(w * w for w in weights))
    return [w / n for w in weights] + [0.0] * (DIM - len(weights))


def choose_vectors(fake) -> None:
    """The question and the paraphrase point the same way; the wordy line and the others elsewhere."""
    fake.vectors[QUESTION] = unit(1.0)
    fake.vectors[PARAPHRASE] = unit(0.9, 0.3)
    fake.vectors[WORDY] = unit(0.1, 0.0, 1.0)
    for i, text in enumerate(OTHERS):
        fake.vectors[text] = unit(0.05, 0.0, 0.0, *([0.0] * i), 1.0)


async def remember_all(engine: Engine) -> dict[str, int]:
    ids = {}
    for text in (PARAPHRASE, WORDY, *OTHERS):
        ids[text] = await engine.remember(NewMemory(text, "personal", owner_id=1))
    return ids


async def test_a_paraphrase_near_in_meaning_beats_a_keyword_match_far_from_it(fake_ollama, make_settings):
    choose_vectors(fake_ollama)
    async with Engine(make_settings(fake_ollama.url)) as engine:
        assert engine.settings.fusion == "scores"
        ids = await remember_all(engine)
        result = await engine.recall(QUESTION, ALICE, touch=False)
    assert result.mode == "hybrid"
    assert result.ids[0] == ids[PARAPHRASE]  # found by meaning alone, first
    wordy = next(r.candidate for r in result.memories if r.memory.id == ids[WORDY])
    assert wordy.fts_rank == 1 and wordy.cosine == pytest.approx(0.1, abs=1e-3)  # measured before fusion


async def test_rank_fusion_is_still_there_and_trusts_the_keyword_match(fake_ollama, make_settings):
    choose_vectors(fake_ollama)
    async with Engine(make_settings(fake_ollama.url, MUNINN_FUSION="ranks")) as engine:
        ids = await remember_all(engine)
        result = await engine.recall(QUESTION, ALICE, touch=False)
    assert result.ids[0] == ids[WORDY]  # RRF sees the keyword rank 1, not how far it is in meaning


async def test_keywords_lead_when_their_best_hits_agree_in_meaning(fake_ollama, make_settings):
    choose_vectors(fake_ollama)
    fake_ollama.vectors[WORDY] = unit(0.95, 0.0, 0.2)  # the keyword match is also the nearest
    async with Engine(make_settings(fake_ollama.url)) as engine:
        ids = await remember_all(engine)
        result = await engine.recall(QUESTION, ALICE, touch=False)
    assert result.ids[:2] == [ids[WORDY], ids[PARAPHRASE]]


async def test_with_the_vector_share_at_one_keywords_only_bring_candidates(fake_ollama, make_settings):
    choose_vectors(fake_ollama)
    fake_ollama.vectors[WORDY] = unit(0.6, 0.0, 1.0)
    async with Engine(make_settings(fake_ollama.url, MUNINN_FUSION_VECTOR_SHARE="1")) as engine:
        ids = await remember_all(engine)
        result = await engine.recall(QUESTION, ALICE, touch=False)
    cosines = [r.candidate.cosine for r in result.memories]
    assert result.ids[0] == ids[PARAPHRASE] and cosines == sorted(cosines, reverse=True)


# -- the fusion's arithmetic ---------------------------------------------------

def hit(memory_id: int, *, fts_rank: int | None = None, bm25: float | None = None, cosine: float | None = None,
        vector_rank: int | None = None) -> Candidate:
    distance = None if cosine is None or vector_rank is None else math.sqrt(max(0.0, 2 - 2 * cosine))
    return Candidate(memory_id, fts_rank=fts_rank, fts_score=bm25, vector_rank=vector_rank, distance=distance,
                     similarity=None if vector_rank is not None else cosine)


def test_keyword_scores_follow_the_keyword_lists_order_on_bm25s_scale():
    # the names re-rank put hit 2 (a lower bm25) first: its score is the best one, the order kept
    pool = [hit(2, fts_rank=1, bm25=-2.0), hit(1, fts_rank=2, bm25=-4.0), hit(3, fts_rank=3, bm25=-1.0)]
    assert fusion.keyword_scores(pool) == {2: 1.0, 1: 0.5, 3: 0.25}
    assert fusion.keyword_scores([hit(4, vector_rank=1, cosine=0.5)]) == {}


def test_agreement_is_the_keyword_hits_cosine_over_the_best_cosines():
    agree = [hit(1, fts_rank=1, bm25=-3.0, cosine=0.8), hit(2, vector_rank=1, cosine=0.8)]
    assert fusion.agreement(agree) == pytest.approx(1.0)
    apart = [hit(1, fts_rank=1, bm25=-3.0, cosine=0.2), hit(2, vector_rank=1, cosine=0.8)]
    assert fusion.agreement(apart, top=1) == pytest.approx(0.25)
    assert fusion.agreement([hit(1, fts_rank=1, bm25=-3.0)]) == 1.0  # no cosine known: no judgement


def test_score_fusion_mutes_keywords_in_a_question_where_they_disagree():
    pool_fts = [hit(1, fts_rank=1, bm25=-5.0, cosine=0.1)]
    pool_vec = [hit(2, vector_rank=1, cosine=0.7), hit(3, vector_rank=2, cosine=0.3)]
    muted = fusion.fuse_scores(pool_fts, pool_vec, share=0.5, limit=10)
    assert muted[0].memory_id == 2
    plain = fusion.fuse_scores(pool_fts, pool_vec, share=0.5, limit=10, sharpness=0)
    assert plain[0].memory_id == 1 and plain[0].fused == pytest.approx(0.5)  # keyword 1.0, meaning 0
    assert muted[0].fused == pytest.approx(0.5)  # the nearest: meaning 1.0, no keyword
    keyword_hit = next(c for c in muted if c.memory_id == 1)
    assert keyword_hit.fused == pytest.approx(0.5 * (0.1 / ((0.1 + 0.7 + 0.3) / 3)) ** fusion.AGREEMENT)


# -- the relevance floor -------------------------------------------------------

def test_the_floor_is_the_setting_else_the_models_measured_floor_else_none():
    assert ranking.inject_floor("all-minilm:latest", None) == ranking.TOUCH_FLOORS["all-minilm"]
    assert ranking.inject_floor("nomic-embed-text", None) is None
    assert ranking.inject_floor("nomic-embed-text", 0.4) == 0.4
    assert ranking.inject_floor("all-minilm", -1.0) is None  # off


async def test_a_question_about_something_never_discussed_gets_no_memories(fake_ollama, make_settings):
    choose_vectors(fake_ollama)
    fake_ollama.vectors["what is the capital of Peru"] = unit(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0)
    async with Engine(make_settings(fake_ollama.url, MUNINN_INJECT_MIN_COSINE="0.5")) as engine:
        ids = await remember_all(engine)
        unrelated = await engine.recall("what is the capital of Peru", ALICE, touch=False)
        related = await engine.recall(QUESTION, ALICE, touch=False)
    assert unrelated.floor == 0.5 and unrelated.memories  # recall still answers `muninn recall` and /memory search
    assert unrelated.relevant() == []
    # one memory above the floor: the whole list goes, in order (the wordy line at 0.1 too)
    assert [r.memory.id for r in related.relevant()] == related.ids and ids[WORDY] in related.ids


async def test_without_a_measured_floor_or_a_vector_every_memory_may_go(fake_ollama, make_settings):
    choose_vectors(fake_ollama)
    async with Engine(make_settings(fake_ollama.url)) as engine:  # nomic-embed-text: no measured floor
        await remember_all(engine)
        result = await engine.recall("what is the capital of Peru", ALICE, touch=False)
    assert result.floor is None and result.relevant() == result.memories
    async with Engine(make_settings("", MUNINN_INJECT_MIN_COSINE="0.9")) as keyword_only:
        result = await keyword_only.recall(QUESTION, ALICE, touch=False)
    assert result.mode == "fts-only" and result.floor is None and result.memories
    assert result.relevant() == result.memories  # no cosine to judge by: keyword recall as before


async def test_the_measured_floor_applies_to_its_model(make_settings):
    from tests.fakes.ollama import FakeOllama
    async with FakeOllama(models=["all-minilm"], dim=DIM) as fake:
        choose_vectors(fake)
        fake.vectors["what is the capital of Peru"] = unit(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0)
        async with Engine(make_settings(fake.url, OLLAMA_EMBED_MODEL="all-minilm")) as engine:
            await remember_all(engine)
            result = await engine.recall("what is the capital of Peru", ALICE, touch=False)
    assert result.floor == ranking.TOUCH_FLOORS["all-minilm"] and result.memories and result.relevant() == []


def test_rank_trust_mutes_the_keyword_ranks_of_a_question_where_keywords_disagree(monkeypatch):
    from bot.settings import load_settings
    settings = load_settings({})
    def pools():
        # the best keyword hit is far in meaning; the nearest memory is no keyword hit at all
        fts = [hit(1, fts_rank=1, bm25=-5.0, cosine=0.55), hit(3, fts_rank=2, bm25=-4.0, cosine=0.3)]
        vec = [hit(2, vector_rank=1, cosine=0.65), hit(4, vector_rank=2, cosine=0.6), hit(1, vector_rank=3, cosine=0.55)]
        return fts, vec
    assert fusion.RANK_TRUST == 0  # the default: the rank share is not muted (cross-validated)
    plain = fusion.fuse(*pools(), settings)
    monkeypatch.setattr(fusion, "RANK_TRUST", 1.0)
    muted = fusion.fuse(*pools(), settings)
    by_plain, by_muted = ({c.memory_id: c.fused for c in ranked} for ranked in (plain, muted))
    # the keyword ranks count less, so the nearest memory (found by meaning only) gains on the keyword hit
    assert by_muted[2] > by_plain[2] and by_muted[1] <= by_plain[1]
    assert [c.memory_id for c in plain][0] == 1 and [c.memory_id for c in muted][0] == 2


def test_keyword_lead_can_require_the_winner_to_agree_in_meaning(monkeypatch):
    near = Candidate(1, vector_rank=1, similarity=0.8, fused=0.5)
    far_winner = Candidate(2, fts_rank=1, fts_score=-6.0, similarity=0.3, fused=0.4)
    runner_up = Candidate(3, fts_rank=2, fts_score=-5.0, similarity=0.5, fused=0.3)
    ranked = [near, far_winner, runner_up]
    assert ranking.keyword_winner_first(ranked, 1.1)[0] is far_winner  # the default: the lead is unconditional
    monkeypatch.setattr(ranking, "LEAD_AGREEMENT", 0.8)
    assert ranking.keyword_winner_first(ranked, 1.1) == ranked  # 0.3 < 0.8 x 0.8: no lead
    far_winner.similarity = 0.7
    assert ranking.keyword_winner_first(ranked, 1.1)[0] is far_winner  # near enough in meaning
