"""Gauges read when /metrics is scraped, never on the request path: each speculative pool's
acceptance from its own counters, each pool's price, what each endpoint's prefix cache kept
of what it was sent, every flag's state (the kill switch among them), and every slice's
guardrail state and the guardrail's estimate of what its output tokens cost on each rung.
Read at each scrape, they are what the gateway holds at that moment: from its start, after
each change of a flag (by ops, by another replica through the shared store, or by a policy
reload), and without the slices of a rule the policy no longer has.

Slice labels go through the same cap as the request counters (``slicecap.py``); slices
folded into ``other`` appear only in the per-rule counts.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from gateway.measure.slicecap import SliceLabels
from gateway.measure.views import Views
from policies.compiled import CompiledPolicy
from policies.flags import FlagValue

FLAG_STATES = ("on", "limited", "off")


@dataclass(frozen=True, slots=True)
class PoolReading:
    """A speculative pool's acceptance from its own counters (``gateway/measure/scrape.py``):
    ``rate`` over the recent window (or, before any difference, the ``lifetime`` totals),
    ``fed_at`` the wall time drafts last came in."""

    rate: float
    fed_at: float | None
    basis: str = "window"


class PoolAcceptance(Collector):
    def __init__(self, readings: dict[str, PoolReading]) -> None:
        self._readings = readings

    def collect(self) -> Iterator[GaugeMetricFamily]:
        rate = GaugeMetricFamily(
            "speclane_pool_draft_acceptance_rate",
            "accepted / drafted tokens of a speculative pool from its scraped counters, over "
            "the recent window; absent when the pool drafted nothing in it",
            labels=["pool", "basis"],
        )
        fed = GaugeMetricFamily(
            "speclane_pool_counters_fed_timestamp_seconds",
            "when a speculative pool's scraped counters last showed new draft tokens",
            labels=["pool"],
        )
        for pool, reading in sorted(self._readings.items()):
            rate.add_metric([pool, reading.basis], reading.rate)
            if reading.fed_at is not None:
                fed.add_metric([pool], reading.fed_at)
        yield rate
        yield fed


class LoopTasks(Collector):
    """Tasks alive in the event loop of the process that answers the scrape: a number that
    grows without bound under steady load is a leak."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        try:
            count = len(asyncio.all_tasks())
        except RuntimeError:  # scraped outside a running loop
            return
        yield GaugeMetricFamily(
            "speclane_event_loop_tasks", "asyncio tasks alive in this process", value=count
        )


class Prices(Collector):
    """Each pool's ``cost_per_hour`` from the running policy (absent when it has none)."""

    def __init__(self, policy: Callable[[], CompiledPolicy]) -> None:
        self._policy = policy

    def collect(self) -> Iterator[GaugeMetricFamily]:
        price = GaugeMetricFamily(
            "speclane_pool_cost_per_hour",
            "a pool endpoint's cost_per_hour from the policy; times "
            "speclane_serving_seconds_total / speclane_output_tokens_total / 3600 it is the "
            "cost per output token",
            labels=["pool"],
        )
        for name, pool in sorted(self._policy().pools.items()):
            if pool.cost_per_hour is not None:
                price.add_metric([name], pool.cost_per_hour)
        yield price


class CacheKept(Collector):
    """Per endpoint whose answers said it, the share of what the prefix map believed it held
    that its prefix cache still held (``LoadMeter.kept``): well under 1, the engine evicts
    conversations between their turns, and the price of moving one counts it."""

    def __init__(
        self,
        policy: Callable[[], CompiledPolicy],
        kept: Callable[[], Mapping[str, tuple[float, int]]],
    ) -> None:
        self._policy = policy
        self._kept = kept

    def collect(self) -> Iterator[GaugeMetricFamily]:
        share = GaugeMetricFamily(
            "speclane_endpoint_cache_kept_ratio",
            "of the prompt tokens the prefix map believed an endpoint's cache held, the share "
            "its answers found cached (a moving mean); absent until an answer says",
            labels=["pool", "endpoint"],
        )
        pool_of = {
            url.rstrip("/"): name
            for name, pool in self._policy().pools.items()
            for url in pool.endpoints
        }
        for url, (kept, _) in sorted(self._kept().items()):
            if url in pool_of:
                share.add_metric([pool_of[url], url], kept)
        yield share


class FlagStates(Collector):
    """Every flag's state (``gateway/state/flagstore.py``, ``FlagStore.known``): ``on`` for
    every request, ``limited`` to a rollout under 100% or to some tenants, or ``off``."""

    def __init__(self, known: Callable[[], Mapping[str, tuple[FlagValue, str]]]) -> None:
        self._known = known

    def collect(self) -> Iterator[GaugeMetricFamily]:
        state = GaugeMetricFamily(
            "speclane_flag_state",
            "1 for a flag's state: on (every request), limited (a rollout under 100% or some "
            "tenants) or off; flag speculation is the kill switch, off when speculation is "
            "disabled for all traffic",
            labels=["flag", "state", "source"],
        )
        rollout = GaugeMetricFamily(
            "speclane_flag_rollout_percent",
            "the percentage of routing keys a flag is set for (100 when it has no rollout), "
            "whatever its state",
            labels=["flag"],
        )
        for name, (value, source) in sorted(self._known().items()):
            now = flag_state(value)
            for each in FLAG_STATES:
                state.add_metric([name, each, source], 1.0 if each == now else 0.0)
            rollout.add_metric([name], 100.0 if value.rollout is None else value.rollout)
        yield state
        yield rollout


def flag_state(value: FlagValue) -> str:
    """``on``, ``limited`` or ``off``: how much traffic a flag's value admits."""
    if not value.enabled or value.rollout == 0 or value.allow == frozenset():
        return "off"
    partial = value.rollout is not None and value.rollout < 100
    return "limited" if partial or value.allow is not None or value.deny else "on"


class GuardrailStates(Collector):
    """Every slice's guardrail state, and the guardrail's cost estimates per rung."""

    def __init__(self, views: Views, slices: SliceLabels, wall: Callable[[], float]) -> None:
        self._views = views
        self._slices = slices
        self._wall = wall

    def collect(self) -> Iterator[GaugeMetricFamily]:
        offset = GaugeMetricFamily(
            "speclane_guardrail_offset",
            "rungs a slice has fallen below its rule's start rung (0: on its start rung)",
            labels=["rule", "slice"],
        )
        phase = GaugeMetricFamily(
            "speclane_guardrail_phase",
            "1 for a slice's guardrail phase (on, fallen_back, probing) and the pool it is "
            "served on",
            labels=["rule", "slice", "phase", "pool"],
        )
        count = GaugeMetricFamily(
            "speclane_guardrail_slices",
            "slices kept, by rule and guardrail phase (folded slices included)",
            labels=["rule", "phase"],
        )
        estimate = GaugeMetricFamily(
            "speclane_guardrail_seconds_per_token",
            "the guardrail's estimate of endpoint-seconds per output token of a slice on "
            "each rung at the current load (times cost_per_hour / 3600: cost per token)",
            labels=["rule", "slice", "pool"],
        )
        now = self._wall()
        counts: Counter[tuple[str, str]] = Counter()
        for served in self._views.every():
            if served.pool is None:  # its rule (or model) is gone from the policy: no series
                continue
            key, rule, state = served.slice, served.rule, served.state
            counts[rule, state.phase.value] += 1
            if not self._slices.labelled(key):
                continue
            offset.add_metric([rule, key], state.offset)
            phase.add_metric([rule, key, state.phase.value, served.pool or ""], 1)
            for rung, seconds in self._views.seconds_per_token(key, now).items():
                estimate.add_metric([rule, key, rung], seconds)
        for (rule, name), n in sorted(counts.items()):
            count.add_metric([rule, name], n)
        yield from (offset, phase, count, estimate)
