"""Batched records end up exactly as prometheus-client's own records would: the same
exposition for the same values, pushed in several batches."""

from __future__ import annotations

import random

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from gateway.measure.tally import Counts, Levels, Observations

BUCKETS = (0.125, 0.5, 1.0, 5.0)


def test_batched_records_expose_as_direct_ones() -> None:
    direct, batched = CollectorRegistry(), CollectorRegistry()

    def metrics(registry: CollectorRegistry) -> tuple[Counter, Histogram, Gauge]:
        return (
            Counter("c", "c", ["a", "b"], registry=registry),
            Histogram("h", "h", ["a"], registry=registry, buckets=BUCKETS),
            Gauge("g", "g", ["a"], registry=registry),
        )

    counter, histogram, gauge = metrics(direct)
    c, h, g = metrics(batched)
    counts, observations, levels = Counts(c), Observations(h, BUCKETS), Levels(g)
    rng = random.Random(7)
    for i in range(2000):
        a, b = rng.choice("xyz"), rng.random() < 0.5
        # exactly representable values: sums in any order are the same
        value = rng.choice((0.0, 0.5, 1.0, 5.0, 9.0, rng.randrange(64) / 8))
        counter.labels(a, "true" if b else "false").inc(value)
        counts.add((a, b), value)
        histogram.labels(a).observe(value)
        observations.add((a,), value)
        step = 1.0 if b else -1.0
        gauge.labels(a).inc(step)
        levels.add((a,), step)
        if i % 300 == 0:
            for batch in (counts, observations, levels):
                batch.push()
    for batch in (counts, observations, levels):
        batch.push()
    assert exposed(batched) == exposed(direct)


def exposed(registry: CollectorRegistry) -> list[str]:
    """The exposition without the ``_created`` samples (a batched child is made at its first
    push, up to a second after its first record)."""
    return [
        line for line in generate_latest(registry).decode().splitlines() if "_created" not in line
    ]


def test_prune_removes_the_series_and_what_is_pending_for_them():
    registry = CollectorRegistry()
    counts = Counts(Counter("pruned", "doc", ["rule"], registry=registry))
    counts.add(("gone",))
    counts.add(("kept",))
    counts.push()
    counts.add(("gone",))  # recorded before the reload, pushed after it
    counts.prune(lambda labels: labels[0] != "gone")
    counts.push()
    assert registry.get_sample_value("pruned_total", {"rule": "gone"}) is None
    assert registry.get_sample_value("pruned_total", {"rule": "kept"}) == 1.0
