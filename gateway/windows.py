"""Time-bucketed sliding windows of request outcomes, for one slice on one pool.

A window keeps time-ordered buckets of ``window_s / BUCKETS`` seconds and their running
total, so recording and reading are O(1) amortised. Pure: ``now`` is passed in.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

BUCKETS = 24


@dataclass(slots=True)
class Counts:
    """Sums over a span of outcomes; also the unit a shared store adds up across replicas."""

    requests: int = 0
    measured: int = 0
    drafted: int = 0
    accepted: int = 0
    tpot_sum: float = 0.0
    tpot_n: int = 0
    errors: int = 0
    rate_sum: float = 0.0
    rate_sq: float = 0.0

    def subtract(self, other: Counts) -> None:
        self.requests -= other.requests
        self.measured -= other.measured
        self.drafted -= other.drafted
        self.accepted -= other.accepted
        self.tpot_sum -= other.tpot_sum
        self.tpot_n -= other.tpot_n
        self.errors -= other.errors
        self.rate_sum -= other.rate_sum
        self.rate_sq -= other.rate_sq

    def add(self, other: Counts) -> None:
        self.requests += other.requests
        self.measured += other.measured
        self.drafted += other.drafted
        self.accepted += other.accepted
        self.tpot_sum += other.tpot_sum
        self.tpot_n += other.tpot_n
        self.errors += other.errors
        self.rate_sum += other.rate_sum
        self.rate_sq += other.rate_sq

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def margin(self) -> float | None:
        """Half-width of a 95% confidence interval for the acceptance: 1.96 standard errors
        of the per-request rates (normal approximation; None under 2 requests)."""
        n = self.measured
        if n < 2:
            return None
        mean = self.rate_sum / n
        variance = max(self.rate_sq / n - mean * mean, 0.0) * n / (n - 1)
        return 1.96 * math.sqrt(variance / n)

    @property
    def tpot(self) -> float | None:
        return self.tpot_sum / self.tpot_n if self.tpot_n else None


class Window:
    """Counts over the last ``window_s`` seconds, in buckets of ``window_s / BUCKETS``, and
    ``since_start``: everything added since the window was made (or last drained).

    Buckets sit in time order with a running total; adding and totalling drop the buckets
    that left the window, so both are O(1) amortised.
    """

    __slots__ = ("_buckets", "_total", "since_start", "width", "window_s")

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self.width = window_s / BUCKETS
        self._buckets: deque[tuple[float, Counts]] = deque()
        self._total = Counts()
        self.since_start = Counts()

    def add(self, now: float, counts: Counts) -> None:
        start = now - now % self.width
        buckets = self._buckets
        if buckets and buckets[-1][0] == start:
            buckets[-1][1].add(counts)
        elif not buckets or buckets[-1][0] < start:
            buckets.append((start, _copy(counts)))
        else:  # late: an older bucket (a restored increment)
            self._insert(start, counts)
        self._total.add(counts)
        self.since_start.add(counts)
        self._expire(now)

    def _insert(self, start: float, counts: Counts) -> None:
        for bucket_start, bucket in self._buckets:
            if bucket_start == start:
                bucket.add(counts)
                return
        self._buckets.append((start, _copy(counts)))
        self._buckets = deque(sorted(self._buckets, key=lambda b: b[0]))

    def _expire(self, now: float) -> None:
        oldest = now - self.window_s
        buckets = self._buckets
        while buckets and buckets[0][0] <= oldest:
            _, gone = buckets.popleft()
            self._total.subtract(gone)

    def total(self, now: float) -> Counts:
        self._expire(now)
        return _copy(self._total)

    def drain(self) -> list[tuple[float, Counts]]:
        """Every bucket with its start, emptied (handed to a shared store)."""
        out = list(self._buckets)
        self._buckets.clear()
        self._total = Counts()
        self.since_start = Counts()
        return out


def _copy(counts: Counts) -> Counts:
    out = Counts()
    out.add(counts)
    return out


def total_since(buckets: dict[float, Counts], oldest: float) -> Counts:
    """Sum of the buckets that start after ``oldest``."""
    out = Counts()
    for start, counts in buckets.items():
        if start > oldest:
            out.add(counts)
    return out
