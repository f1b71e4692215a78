"""bench.path_share: per-question rules fitted leaving one conversation out, and the patch that checks one."""
from __future__ import annotations

from bench import patches, path_share
from bot.memory.recall import fusion
from bot.memory.recall.retrieval import Candidate


def questions() -> tuple[list[dict], list[list[float]]]:
    """Two data sets, three conversations each; under share index 0 questions with a low `kwcos`
    score 1, under index 1 the others do: the rule 'kwcos under 0.5 -> 0, else 1' is right."""
    qs, scores = [], []
    for dataset in ("a", "b"):
        for conv in range(3):
            for i in range(10):
                low = i % 2 == 0
                sig = {name: 0.0 for name in patches.SIGNALS} | {"kwcos": 0.3 if low else 0.7, "words": 5.0}
                qs.append({"conversation": f"{dataset}{conv}", "dataset": dataset, "category": "c", "signals": sig})
                scores.append([1.0, 0.0] if low else [0.0, 1.0])
    return qs, scores


def test_the_rule_a_signal_tells_is_found_in_every_fold_and_beats_one_share():
    qs, scores = questions()
    cv = path_share.cross_validate([(qs, scores)], ["0.4", "0.6"])
    assert cv["kwcos"]["held_out"] == 1.0 and cv["fixed"]["held_out"] == 0.5
    assert all(rule[1:] == ["0.4", "0.6"] and 0.3 < rule[0] <= 0.7 for rule in cv["kwcos"]["fold_rules"])


def test_rules_are_scored_as_the_mean_over_runs():
    qs, scores = questions()
    flipped = [[b, a] for a, b in scores]
    rule = (0.5, 0, 1)
    assert path_share.joint([(qs, scores)], "kwcos", rule, lambda s: True) == 1.0
    assert path_share.joint([(qs, scores), (qs, flipped)], "kwcos", rule, lambda s: True) == 0.5


def test_install_gives_each_question_the_share_its_signal_picks(monkeypatch):
    monkeypatch.setattr(fusion, "fuse_scores", fusion.fuse_scores)  # undone after the test
    original = fusion.fuse_scores

    def pools(keyword_cosine: float) -> tuple[list[Candidate], list[Candidate]]:
        fts = [Candidate(1, fts_rank=1, fts_score=-5.0, similarity=keyword_cosine),
               Candidate(2, fts_rank=2, fts_score=-4.0, similarity=keyword_cosine)]
        vec = [Candidate(3, vector_rank=1, distance=0.9), Candidate(4, vector_rank=2, distance=1.2)]
        return fts, vec

    def fused(fuse, keyword_cosine: float, share: float) -> dict[int, float]:
        return {c.memory_id: c.fused for c in fuse(*pools(keyword_cosine), share=share, limit=10)}

    patches.install_share("kwcos:0.44:0.3:0.7")
    assert fused(fusion.fuse_scores, 0.2, 0.6) == fused(original, 0.2, 0.3)   # keyword hits far in meaning
    assert fused(fusion.fuse_scores, 0.6, 0.6) == fused(original, 0.6, 0.7)
    assert fused(fusion.fuse_scores, 0.2, 1.0) == fused(original, 0.2, 1.0)   # the vector path alone stays so


def test_spread_pushes_a_memory_of_the_same_sitting_down_and_keeps_the_order_otherwise():

    def at(memory_id: int, when: float, fused: float = 0.0) -> Candidate:
        return Candidate(memory_id, fused=fused, vitals=(when, 1.0, 0.5, when))
    # the order the earlier steps made is the base, not the fused score
    ranked = [at(1, 0.0, fused=0.1), at(2, 0.0, fused=0.9), at(3, 9000.0), at(4, 20000.0), at(5, 50000.0)]
    assert [c.memory_id for c in patches.spread(ranked, 0.0, 3600)] == [1, 2, 3, 4, 5]
    assert [c.memory_id for c in patches.spread(ranked, 2.5, 3600)] == [1, 3, 4, 2, 5]   # pushed past the next two
    assert [c.memory_id for c in patches.spread(ranked, 10.0, 0)] == [1, 3, 4, 5, 2]     # the same moment only
    unknown = Candidate(6)  # no time read: never pushed down
    assert patches.spread([ranked[0], unknown], 10.0, 3600)[1] is unknown


def test_the_spread_patch_is_installed_once_and_its_values_change(monkeypatch):
    from bot.memory.recall import newer
    monkeypatch.setattr(newer, "newer_first", lambda conn, ranked, limit, dated=False, question="": ranked)
    monkeypatch.setattr(patches, "_spread", {})

    def at(memory_id: int, when: float) -> Candidate:
        return Candidate(memory_id, vitals=(when, 1.0, 0.5, when))
    ranked = [at(1, 0.0), at(2, 0.0), at(3, 9000.0)]
    patches.install_spread("0:3600")
    wrapped = newer.newer_first
    assert [c.memory_id for c in newer.newer_first(None, ranked, 3)] == [1, 2, 3]  # penalty 0: as it was
    patches.install_spread("10:3600")  # bench.spread's next grid value
    assert newer.newer_first is wrapped  # wrapped once, not once per value
    assert [c.memory_id for c in newer.newer_first(None, ranked, 3)] == [1, 3, 2]
