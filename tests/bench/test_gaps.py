"""bench.gaps' attribution of lost evidence to recall steps, and bench.fusion_cv's grid constants."""
from __future__ import annotations

from bench import fusion_cv, gaps
from bot.memory.recall import fusion, retrieval


def test_a_turn_is_lost_at_the_first_step_that_leaves_all_its_parts_below_the_cut():
    # places after fuse, neighbours, time, lead, newer
    assert gaps.lost_at([[3, 28, 28, 28, 28]], 10) == "neighbours"
    assert gaps.lost_at([[12, 9, 9, 9, 9]], 10) == "fusion"
    assert gaps.lost_at([[3, 12, 12, 12, 12], [4, 5, 5, 5, 11]], 10) == "newer"  # its best part counts
    assert gaps.lost_at([[None] * 5], 10) == "not a candidate"
    assert gaps.lost_at([[1, 1, 1, 1, 1]], 10) == "kept"


def row(ranked: list[str], evidence: dict, category: str = "c") -> dict:
    from bench import quality
    return quality.score(ranked, set(evidence)) | {"question": "q", "category": category, "ranked": ranked,
                                                   "evidence": evidence}


def test_diagnose_names_the_step_for_a_group_under_its_better_baseline():
    lost = {"e1": [{"memory": 7, "paths": None, "places": [0, 14, 14, 14, 14]}]}
    hybrid = [row(["x"] * 10, lost)]
    cosine = [row(["e1"], lost)]
    bm25 = [row([], lost)]
    out = gaps.diagnose(hybrid, bm25, cosine, {"c": "group"})["group"]
    assert out["causes"]["r10"] == {"neighbours": 1}
    assert out["causes"]["mrr"] == {"neighbours": 1}
    assert out["questions"][0]["turn"] == "e1" and out["questions"][0]["baseline_place"] == 0


def test_a_grid_setting_starts_from_the_constants_defaults():
    settings = fusion_cv.grid("@fusion.RANK_SHARE=0.5|@retrieval.NEIGHBOUR_REACH=1")
    defaults = fusion_cv.constant_defaults(settings)
    share, reach = fusion.RANK_SHARE, retrieval.NEIGHBOUR_REACH
    try:
        fusion_cv.apply_constants(settings[0], defaults)
        assert fusion.RANK_SHARE == 0.5 and retrieval.NEIGHBOUR_REACH == reach
        fusion_cv.apply_constants(settings[1], defaults)
        assert fusion.RANK_SHARE == share and retrieval.NEIGHBOUR_REACH == 1
    finally:
        fusion_cv.apply_constants({}, defaults)
    assert fusion.RANK_SHARE == share and retrieval.NEIGHBOUR_REACH == reach
