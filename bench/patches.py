"""Patches of recall for one bench run: a per-question vector share, and spread over sittings.

Neither is in the product. `install_share` gives every recall of the process the vector share a
bench.path_share rule picks from what the fusion saw (`signals`; `bench.quality --question-share
SIGNAL:T:A:B`); `install_spread` re-orders recall's final list over time (`spread`, bench/spread.py;
`bench.quality --spread PENALTY:WINDOW`). So a candidate is measured with every mode and baseline in
one run.
"""
from __future__ import annotations

from typing import Any

from bot.memory.recall import fusion, newer
from bot.memory.recall.retrieval import Candidate

SIGNALS = ("agree", "cos1", "gap10", "kwcos", "kwn", "peak", "both")


def signals(pool: list[Candidate]) -> dict[str, float]:
    """What the fusion saw for one question, before scoring."""
    cos = sorted((c for c in (x.cosine for x in pool) if c is not None), reverse=True)
    hits = sorted((c for c in pool if c.fts_rank is not None), key=lambda c: c.fts_rank or 0)
    bm = sorted((-(c.fts_score or 0.0) for c in hits), reverse=True)
    said = [c.cosine for c in hits[:3] if c.cosine is not None]
    return {"agree": fusion.agreement(pool), "cos1": cos[0] if cos else 0.0,
            "gap10": cos[0] - cos[min(9, len(cos) - 1)] if cos else 0.0,
            "kwcos": sum(said) / len(said) if said else 0.0, "kwn": float(len(hits)),
            "peak": bm[0] / bm[2] if len(bm) > 2 and bm[2] > 0 else 2.0,
            "both": float(sum(1 for c in hits[:10] if c.vector_rank is not None))}


def install_share(rule: str) -> None:
    """Give every recall of this process a per-question vector share: 'SIGNAL:T:A:B' = share A
    when the signal (SIGNALS, from the fusion's candidates) is under T, else B; a share of 0 or 1
    (one path only: bench.quality's keyword and vector modes) stays as it is. A patch of
    fusion.fuse_scores for measuring (bench.quality --question-share), not in the product."""
    signal, threshold, low, high = rule.split(":")
    if signal not in SIGNALS:
        raise ValueError(f"unknown signal {signal!r}: one of {', '.join(SIGNALS)}")
    original = fusion.fuse_scores

    def fuse_scores(fts_hits: Any, vector_hits: Any, *, share: float, limit: int,
                    sharpness: float | None = None) -> list[Candidate]:
        if 0.0 < share < 1.0:
            seen = signals(original(fts_hits, vector_hits, share=share, limit=limit, sharpness=sharpness))
            share = float(low) if seen[signal] < float(threshold) else float(high)
        return original(fts_hits, vector_hits, share=share, limit=limit, sharpness=sharpness)
    fusion.fuse_scores = fuse_scores  # type: ignore[assignment]


DEPTH = 30


def spread(ranked: list[Candidate], penalty: float, window: float, depth: int = DEPTH) -> list[Candidate]:
    """`ranked` re-ordered as the module doc says: a candidate's value is minus its place, less
    `penalty` places for each memory already placed within `window` seconds of it (the order the
    earlier steps made, keyword lead and newer-first included, is the base; a candidate without a
    known time is never penalised)."""
    head = list(enumerate(ranked[:depth]))
    tail = ranked[depth:]
    placed: list[Candidate] = []
    times: list[float] = []
    while head:
        def value(item: tuple[int, Candidate]) -> float:
            place, c = item
            if c.vitals is None:
                return -place
            t = c.vitals[3]
            return -place - penalty * sum(1 for u in times if abs(u - t) <= window)
        best = max(head, key=value)
        head.remove(best)
        placed.append(best[1])
        if best[1].vitals is not None:
            times.append(best[1].vitals[3])
    return placed + tail


_spread: dict[str, float] = {}  # the penalty and window of the installed patch


def install_spread(spec: str) -> None:
    """'PENALTY:WINDOW' for every recall of this process from now on (0 penalty: no change);
    installed once, a later call changes the values (bench.spread's grid)."""
    penalty, window = (float(x) for x in spec.split(":"))
    if not _spread:
        original = newer.newer_first

        def newer_first(conn: Any, ranked: list[Candidate], limit: int, dated: bool = False,
                        question: str = "") -> list[Candidate]:
            out = original(conn, ranked, limit, dated, question)
            return spread(out, _spread["penalty"], _spread["window"]) if _spread["penalty"] > 0 else out
        newer.newer_first = newer_first  # type: ignore[assignment]
    _spread.update(penalty=penalty, window=window)
