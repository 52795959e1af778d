"""Per-request metric records kept as plain numbers and pushed into prometheus-client in
batches: once a second and before every scrape (``Telemetry.push``).

A prometheus-client record takes a lock and costs about 1 us (several on a busy machine);
a request makes more than a dozen. Here a record is a dict update and, for a histogram, a
bisect (~0.2 us); the push adds each label set's sums once. The values still end up in
prometheus-client's own children, so several workers' files (``--workers``) sum them as
before. Single-threaded: records and pushes happen on the event loop.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from typing import Generic, TypeVar

from prometheus_client import Counter, Gauge, Histogram

Labels = tuple[object, ...]
M = TypeVar("M", Counter, Gauge, Histogram)


def _text(values: Labels) -> list[str]:
    return ["true" if v is True else "false" if v is False else str(v) for v in values]


class _Batched(Generic[M]):
    __slots__ = ("_children", "_metric")

    def __init__(self, metric: M) -> None:
        self._metric: M = metric
        self._children: dict[Labels, M] = {}

    def child(self, values: Labels) -> M:
        found = self._children.get(values)
        if found is None:
            found = self._children[values] = self._metric.labels(*_text(values))
        return found

    def prune(self, keep: Callable[[Labels], bool]) -> None:
        """Remove every series whose labels ``keep`` refuses, and what is pending for them."""
        for values in [v for v in self._children if not keep(v)]:
            del self._children[values]
            self._metric.remove(*_text(values))
        self._keep_unpushed(keep)

    def _keep_unpushed(self, keep: Callable[[Labels], bool]) -> None:
        """Drop the records not yet pushed whose labels ``keep`` refuses."""


class Counts(_Batched[Counter]):
    """A labelled counter's increments since the last push."""

    __slots__ = ("_pending",)

    def __init__(self, metric: Counter) -> None:
        super().__init__(metric)
        self._pending: dict[Labels, float] = {}

    def _keep_unpushed(self, keep: Callable[[Labels], bool]) -> None:
        self._pending = {v: p for v, p in self._pending.items() if keep(v)}

    def add(self, values: Labels, amount: float = 1.0) -> None:
        pending = self._pending
        pending[values] = pending.get(values, 0.0) + amount

    def push(self) -> None:
        pending, self._pending = self._pending, {}
        for values, amount in pending.items():
            self.child(values).inc(amount)


class Observations(_Batched[Histogram]):
    """A labelled histogram's observations since the last push: a count per bucket (as
    prometheus-client stores them, each value in the first bucket whose bound it does not
    pass) and their sum."""

    __slots__ = ("_bounds", "_pending")

    def __init__(self, metric: Histogram, buckets: tuple[float, ...]) -> None:
        super().__init__(metric)
        self._bounds = (*buckets, float("inf"))
        self._pending: dict[Labels, list[float]] = {}

    def _keep_unpushed(self, keep: Callable[[Labels], bool]) -> None:
        self._pending = {v: p for v, p in self._pending.items() if keep(v)}

    def add(self, values: Labels, value: float) -> None:
        entry = self._pending.get(values)
        if entry is None:
            entry = self._pending[values] = [0.0] * (len(self._bounds) + 1)
        entry[bisect_left(self._bounds, value)] += 1
        entry[-1] += value

    def push(self) -> None:
        pending, self._pending = self._pending, {}
        for values, entry in pending.items():
            child = self.child(values)
            for bucket, n in zip(child._buckets, entry, strict=False):
                if n:
                    bucket.inc(n)
            child._sum.inc(entry[-1])


class Levels(_Batched[Gauge]):
    """A labelled gauge's current levels, set at each push."""

    __slots__ = ("_levels",)

    def __init__(self, metric: Gauge) -> None:
        super().__init__(metric)
        self._levels: dict[Labels, float] = {}

    def add(self, values: Labels, amount: float) -> None:
        levels = self._levels
        levels[values] = levels.get(values, 0.0) + amount

    def push(self) -> None:
        for values, level in self._levels.items():
            self.child(values).set(level)
