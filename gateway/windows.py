"""Time-bucketed sliding windows of request outcomes, for one slice on one pool.

A window is a ring of ``BUCKETS`` buckets covering ``window_s``; adding is O(1) (at most
one bucket is recycled per add) and summing walks the ring once. Pure: ``now`` is passed in.
"""

from __future__ import annotations

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

    def add(self, other: Counts) -> None:
        self.requests += other.requests
        self.measured += other.measured
        self.drafted += other.drafted
        self.accepted += other.accepted
        self.tpot_sum += other.tpot_sum
        self.tpot_n += other.tpot_n
        self.errors += other.errors

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def tpot(self) -> float | None:
        return self.tpot_sum / self.tpot_n if self.tpot_n else None


class Window:
    """Counts over the last ``window_s`` seconds, in buckets of ``window_s / BUCKETS``, and
    ``since_start``: everything added since the window was made (or last drained)."""

    __slots__ = ("_counts", "_starts", "since_start", "width", "window_s")

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self.width = window_s / BUCKETS
        self._starts = [float("-inf")] * BUCKETS
        self._counts = [Counts() for _ in range(BUCKETS)]
        self.since_start = Counts()

    def add(self, now: float, counts: Counts) -> None:
        self.bucket(now).add(counts)
        self.since_start.add(counts)

    def bucket(self, now: float) -> Counts:
        """The bucket ``now`` falls in, emptied first if it last held an older span."""
        start = now - now % self.width
        i = int(start / self.width) % BUCKETS
        if self._starts[i] != start:
            self._starts[i] = start
            self._counts[i] = Counts()
        return self._counts[i]

    def total(self, now: float) -> Counts:
        oldest = now - self.window_s
        out = Counts()
        for start, counts in zip(self._starts, self._counts, strict=True):
            if start > oldest:
                out.add(counts)
        return out

    def drain(self) -> list[tuple[float, Counts]]:
        """Every non-empty bucket with its start, emptied (handed to a shared store)."""
        self.since_start = Counts()
        out = []
        for i, (start, counts) in enumerate(zip(self._starts, self._counts, strict=True)):
            if counts.requests:
                out.append((start, counts))
                self._counts[i] = Counts()
        return out


def total_since(buckets: dict[float, Counts], oldest: float) -> Counts:
    """Sum of the buckets that start after ``oldest``."""
    out = Counts()
    for start, counts in buckets.items():
        if start > oldest:
            out.add(counts)
    return out
