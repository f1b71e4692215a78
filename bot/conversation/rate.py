"""Fair share of answers: one person cannot make Muninn answer only them.

Each person (a user id, over all channels and DMs together) has a bucket of
MUNINN_RATE_BURST tokens that refills at MUNINN_RATE_PER_MINUTE tokens a minute; every
message Muninn answers takes one. A message that finds its author's bucket empty is not
answered: it costs no call to the model and teaches nothing, it is kept as context like
any message Muninn does not answer, and its author gets a quiet sign that they are going
too fast, at most once every NOTICE_EVERY_S seconds (a flood gets one sign, not one each).

The buckets live in this process: with several bot processes (shards) each counts the
messages it answers. A person whose bucket has filled up again is forgotten, so the
table holds only people who wrote lately.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

NOTICE_EVERY_S = 60.0   # the sign at most once a minute: the unit the rate is set in
SWEEP_EVERY = 512       # takes between two sweeps of the people whose bucket is full again


@dataclass(frozen=True)
class Verdict:
    """Whether a message may be answered, and whether to show its author the sign that it is not."""
    allowed: bool
    notify: bool = False     # refused, and the author has had no sign within NOTICE_EVERY_S


@dataclass
class _Bucket:
    tokens: float
    stamp: float                 # when `tokens` was counted
    noticed: float | None = None  # when the author was last shown the sign


class MemberRate:
    """A token bucket per person: `take(user_id)` for each message Muninn would answer.
    `per_minute` 0 turns the limit off (every message is allowed)."""

    def __init__(self, per_minute: float, burst: int, *, clock: Callable[[], float] = time.monotonic,
                 notice_every: float = NOTICE_EVERY_S) -> None:
        self.per_second = max(0.0, per_minute) / 60.0
        self.burst = max(1, burst)
        self._clock = clock
        self._notice_every = notice_every
        self._buckets: dict[int, _Bucket] = {}
        self._takes = 0

    @property
    def enabled(self) -> bool:
        """Whether there is a limit at all (MUNINN_RATE_PER_MINUTE above 0)."""
        return self.per_second > 0

    def take(self, user_id: int) -> Verdict:
        """Take a token from `user_id`'s bucket if it holds one (allowed), else refuse; a refusal
        says to notify the person when they have not been told within the notice window."""
        if not self.enabled:
            return Verdict(True)
        now = self._clock()
        self._takes += 1
        if self._takes % SWEEP_EVERY == 0:
            self._sweep(now)
        bucket = self._buckets.get(user_id)
        if bucket is None:
            bucket = self._buckets[user_id] = _Bucket(float(self.burst), now)
        else:
            self._refill(bucket, now)
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            return Verdict(True)
        notify = bucket.noticed is None or now - bucket.noticed >= self._notice_every
        if notify:
            bucket.noticed = now
        return Verdict(False, notify)

    def tokens(self, user_id: int) -> float:
        """How many messages `user_id` may send right now without waiting (the burst when unknown)."""
        bucket = self._buckets.get(user_id)
        if bucket is None:
            return float(self.burst)
        self._refill(bucket, self._clock())
        return bucket.tokens

    def __len__(self) -> int:
        """How many people the table holds (those who wrote lately)."""
        return len(self._buckets)

    def _refill(self, bucket: _Bucket, now: float) -> None:
        elapsed = max(0.0, now - bucket.stamp)   # a clock never runs back, but a test's may
        bucket.tokens = min(float(self.burst), bucket.tokens + elapsed * self.per_second)
        bucket.stamp = now

    def _sweep(self, now: float) -> None:
        """Forget the people whose bucket is full again and whose last sign is out of its window:
        they are as if they had never written."""
        for user_id, bucket in list(self._buckets.items()):
            self._refill(bucket, now)
            quiet = bucket.noticed is None or now - bucket.noticed >= self._notice_every
            if bucket.tokens >= self.burst and quiet:
                del self._buckets[user_id]
