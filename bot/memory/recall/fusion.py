"""How recall's two paths become one list: score fusion of BM25 and cosine, or rank fusion (RRF).

Reciprocal Rank Fusion (retrieval.fuse) sees only ranks: the first keyword hit counts the
same whether it matched every word of the question or one common word, the first vector
hit the same whether its cosine is high or low. Weights chosen where keywords are strong
then hurt wherever meaning matters more than words: the fused list fell below the vector
path alone. Score fusion weighs how good each path's evidence is, question by question:

    fused   = (1 - RANK_SHARE) x scores + RANK_SHARE x rrf / the best rrf
    scores  = (1 - share) x trust x keyword + share x meaning
    keyword = bm25 / the best bm25 among the question's keyword hits, in their order (0: a non-hit)
    meaning = (cosine - lowest) / (highest - lowest) over the candidates       (0 without a vector)
    trust   = (mean cosine of the best keyword hits / mean of the best cosines) ^ AGREEMENT, in 0..1

Every candidate of either path is scored on both: keyword hits get their cosine from the
vector index (the search's cache: no extra query). BM25 has no upper bound, so it is scaled
to the question's best hit (no match, its floor, is 0); cosines are spread over the
candidates' range. `trust` is the paths' agreement: when the best keyword hits are far from
the question in meaning (the question's words are common in the conversation, or the
answer paraphrases), the keyword path counts for less in this question; when they are among
the nearest, fully. A share of the old rank fusion (retrieval.fuse, MUNINN_RRF_*) stays in:
where the scores are close, the top ranks of each path still order them (it kept LoCoMo,
where keywords are strong, at its level while BEAM gained). That share is not muted by
`trust` (RANK_TRUST 0): muting it too lifted BEAM's instruction-following questions (their
evidence is the best cosine and no keyword hit) but cost LoCoMo more than BEAM gained, and
cross-validation kept it off in every fold. `share`
(MUNINN_FUSION_VECTOR_SHARE), AGREEMENT and RANK_SHARE were chosen by cross-validation over
the LoCoMo and BEAM development conversations (bench/fusion_cv.py, bench/README.md): with
each conversation left out in turn, the setting best on the others was the same in nearly
every fold.
"""
from __future__ import annotations

from collections.abc import Sequence

from bot.memory.recall.retrieval import Candidate, rank
from bot.memory.recall.retrieval import fuse as fuse_ranks
from bot.settings import Settings

SCORES = "scores"
RANKS = "ranks"
AGREEMENT = 4.0    # how sharply disagreement mutes the keyword path (0 = never)
AGREEMENT_TOP = 3  # the best keyword hits and the best cosines compared
RANK_SHARE = 0.3   # the share of the (relative) RRF score in the fused one (0 = scores alone)
RANK_TRUST = 0.0   # how far `trust` mutes the keyword ranks in that share too (0 = not at all, 1 = as the scores)


def agreement(pool: Sequence[Candidate], top: int | None = None) -> float:
    """How well the keyword path's best hits agree in meaning: their mean cosine over the mean
    of the best cosines among the candidates, 0..1 (1 when either side is unknown); `top` hits
    and cosines compared (AGREEMENT_TOP when not given)."""
    top = AGREEMENT_TOP if top is None else top
    hits = sorted((c for c in pool if c.fts_rank is not None), key=lambda c: c.fts_rank or 0)[:top]
    said = [cos for c in hits if (cos := c.cosine) is not None]
    near = sorted((cos for c in pool if (cos := c.cosine) is not None), reverse=True)[:top]
    if not said or not near or sum(near) <= 0:
        return 1.0
    return max(0.0, min(1.0, (sum(said) / len(said)) / (sum(near) / len(near))))


def keyword_scores(pool: Sequence[Candidate]) -> dict[int, float]:
    """Each keyword hit's score, 0..1: the hits' BM25 scores relative to the best one, handed
    out best first in the keyword list's order (the names re-rank of subqueries.py may have
    moved a hit past one with a higher BM25: the order is kept, the scale is BM25's)."""
    hits = sorted((c for c in pool if c.fts_rank is not None), key=lambda c: c.fts_rank or 0)
    # bm25 is negative, lower is better
    scores = sorted((-(c.fts_score or 0.0) for c in hits), reverse=True)
    best = scores[0] if scores else 0.0
    if best <= 0:
        return {c.memory_id: 1.0 for c in hits}
    return {c.memory_id: max(0.0, score / best) for c, score in zip(hits, scores, strict=True)}


def fuse_scores(fts_hits: Sequence[Candidate], vector_hits: Sequence[Candidate], *, share: float,
                limit: int, sharpness: float | None = None) -> list[Candidate]:
    """Score fusion (the module doc), best first. A keyword hit's cosine is its `similarity`
    when it was measured; a candidate without any cosine gets no meaning score."""
    merged: dict[int, Candidate] = {}
    for hit in fts_hits:
        merged[hit.memory_id] = Candidate(hit.memory_id, fts_rank=hit.fts_rank, fts_score=hit.fts_score,
                                          similarity=hit.similarity)
    for hit in vector_hits:
        cand = merged.setdefault(hit.memory_id, Candidate(hit.memory_id))
        cand.vector_rank, cand.distance = hit.vector_rank, hit.distance
    pool = list(merged.values())
    keyword = keyword_scores(pool)
    known = [cos for c in pool if (cos := c.cosine) is not None]
    low, high = (min(known), max(known)) if known else (0.0, 0.0)
    sharpness = AGREEMENT if sharpness is None else sharpness
    trust = agreement(pool) ** sharpness if sharpness else 1.0
    for cand in pool:
        cos = cand.cosine
        meaning = 0.0 if cos is None else ((cos - low) / (high - low) if high > low else 1.0)
        cand.fused = (1.0 - share) * trust * keyword.get(cand.memory_id, 0.0) + share * meaning
    return rank(pool)[:limit]


def fuse(fts_hits: list[Candidate], vector_hits: list[Candidate], settings: Settings) -> list[Candidate]:
    """The two paths' candidates as one list, by the fusion the settings name (MUNINN_FUSION)."""
    limit = len(fts_hits) + len(vector_hits)
    if settings.fusion == RANKS:
        return fuse_ranks(fts_hits, vector_hits, k=settings.rrf_k, limit=limit,
                          weight_fts=settings.rrf_weight_fts, weight_vector=settings.rrf_weight_vec)
    scored = fuse_scores(fts_hits, vector_hits, share=settings.fusion_vector_share, limit=limit)
    if RANK_SHARE <= 0:
        return scored
    muted = (agreement(scored) ** AGREEMENT) ** RANK_TRUST if AGREEMENT and RANK_TRUST else 1.0
    return blend(scored, RANK_SHARE, k=settings.rrf_k, weight_fts=settings.rrf_weight_fts * muted,
                 weight_vector=settings.rrf_weight_vec)


def blend(scored: list[Candidate], rank_share: float, *, k: float, weight_fts: float,
          weight_vector: float) -> list[Candidate]:
    """Score fusion with `rank_share` of each candidate's RRF score (retrieval.fuse's formula,
    relative to the best one's) mixed in: the top ranks of each path keep a say when the scores
    are close."""
    rrf = [(weight_fts / (k + c.fts_rank) if c.fts_rank is not None else 0.0)
           + (weight_vector / (k + c.vector_rank) if c.vector_rank is not None else 0.0) for c in scored]
    top = max(rrf, default=0.0)
    for cand, by_rank in zip(scored, rrf, strict=True):
        cand.fused = (1.0 - rank_share) * cand.fused + rank_share * (by_rank / top if top > 0 else 0.0)
    return rank(scored)


def keywords_count(settings: Settings) -> bool:
    """Whether the keyword path has any weight in the fusion (without it the keyword lead is off too)."""
    if settings.fusion == RANKS:
        return settings.rrf_weight_fts > 0
    return settings.fusion_vector_share < 1.0
