"""Ebbinghaus forgetting: retention R = exp(-Δt / S).

Δt is the time in days since the memory was last recalled (or created, if never),
S its stability in days. A new memory starts at S = base × (1 + 2 × importance), so
an important memory fades three times slower; each recall multiplies S by the growth
factor (spaced repetition: recalled memories fade ever more slowly) and resets Δt.
Retention decides what maintenance archives; in ranking it only breaks near-ties
(bot/memory/recall/ranking.py).
"""
from __future__ import annotations

import math

SECONDS_PER_DAY = 86400.0
MAX_STABILITY_DAYS = 3650.0


def initial_stability(importance: float, base_days: float) -> float:
    """A new memory's stability in days: `base_days` x (1 + 2 x importance)."""
    return base_days * (1.0 + 2.0 * importance)


def retention(now: float, last_seen: float, stability: float) -> float:
    """R in [0, 1]; whatever a damaged row holds (a zero or NaN stability, an infinite time),
    never an exception: such a memory counts as faded (`muninn doctor` finds and fixes it)."""
    elapsed_days = max(0.0, now - last_seen) / SECONDS_PER_DAY
    if not (stability > 0.0 and math.isfinite(stability) and math.isfinite(elapsed_days)):
        return 0.0
    return math.exp(-elapsed_days / stability)
