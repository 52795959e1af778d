"""Time-bucketed sliding windows of request outcomes, for one slice on one pool.

A window keeps time-ordered buckets of ``window_s / BUCKETS`` seconds and their running
total, so recording and reading are O(1) amortised. Pure: ``now`` is passed in.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from policies.economics import Tally

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
    stepped: int = 0
    tokens: int = 0
    steps: int = 0
    tok_sq: int = 0
    step_sq: int = 0
    tok_step: int = 0

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
        self.stepped -= other.stepped
        self.tokens -= other.tokens
        self.steps -= other.steps
        self.tok_sq -= other.tok_sq
        self.step_sq -= other.step_sq
        self.tok_step -= other.tok_step

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
        self.stepped += other.stepped
        self.tokens += other.tokens
        self.steps += other.steps
        self.tok_sq += other.tok_sq
        self.step_sq += other.step_sq
        self.tok_step += other.tok_step

    def tally(self) -> Tally:
        """Tokens-per-step evidence, for the economic guardrail."""
        return Tally(
            self.stepped, self.tokens, self.steps, self.tok_sq, self.step_sq, self.tok_step
        )

    @property
    def tokens_per_step(self) -> float | None:
        return self.tokens / self.steps if self.steps else None

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

    def oldest(self, now: float) -> float | None:
        """Start of the oldest bucket still in the window; None when the window is empty."""
        self._expire(now)
        return self._buckets[0][0] if self._buckets else None

    def buckets(self, now: float) -> list[tuple[float, Counts]]:
        """The buckets still in the window, oldest first."""
        self._expire(now)
        return list(self._buckets)

    def drain(self) -> list[tuple[float, Counts]]:
        """Every bucket with its start, emptied (handed to a shared store)."""
        out = list(self._buckets)
        self._buckets.clear()
        self._total = Counts()
        self.since_start = Counts()
        return out


FIELDS = tuple(f for f in Counts.__dataclass_fields__)


def spans(buckets: Iterable[tuple[float, Counts]], targets: Iterable[int]) -> tuple[Tally, ...]:
    """Tallies over the newest buckets holding at least each target of measured requests,
    then over all of them: newest first and growing (bucket-granular)."""
    ordered = sorted(buckets, key=lambda b: b[0], reverse=True)
    wanted = sorted(set(targets))
    out: list[Tally] = []
    total = Counts()
    for _, counts in ordered:
        total.add(counts)
        while wanted and total.stepped >= wanted[0]:
            wanted.pop(0)
            out.append(total.tally())
    if total.stepped and (not out or out[-1].n != total.stepped):
        out.append(total.tally())
    return tuple(out)


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
