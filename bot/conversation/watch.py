"""What the pipeline tells an observer (the bot's metrics, bot/metrics.py) as it works.

The pipeline holds one `Watch`; this base class hears nothing, so the pipeline never checks
whether anyone listens. An observer overrides what it counts; each call is quick and never
raises into the pipeline's work."""
from __future__ import annotations

from bot.memory.recall.retrieval import RecallResult

SKIP_REASONS = ("rate", "queue")  # over the person's fair share; the channel's queue was full


class Watch:
    """An observer of the pipeline that hears nothing (the default); bot/metrics.py's `Metrics` counts."""

    def recalled(self, result: RecallResult) -> None:
        """A recall for a prompt finished (its mode, vector status and timings are in `result`)."""

    def skipped(self, reason: str) -> None:
        """A message that asked for an answer was recorded without one, for `reason` (SKIP_REASONS)."""

    def answered(self, ok: bool, seconds: float) -> None:
        """A message was answered, `seconds` after it arrived; `ok` False when the answer was the
        "cannot think right now" fallback."""
