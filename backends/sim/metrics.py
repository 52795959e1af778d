"""The simulated server's ``/metrics``: vLLM-named Prometheus series read from the engine.

A custom collector on a registry the app owns reads ``EngineCounters`` and the scheduler's
queue lengths at scrape time, so the request path never touches prometheus-client. Series
carry ``engine="0"`` and ``model_name`` like vLLM's. Must not use the global registry.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from backends.sim.engine import Scheduler

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_LABELS = ["engine", "model_name"]


class EngineCollector(Collector):
    """Exposes one scheduler's counters; spec-decode series only for a speculative engine."""

    def __init__(self, scheduler: Scheduler, model_name: str, *, report_spec: bool) -> None:
        self._scheduler = scheduler
        self._values = ["0", model_name]
        self._report_spec = report_spec

    def _counter(self, name: str, doc: str, value: float) -> CounterMetricFamily:
        family = CounterMetricFamily(name, doc, labels=_LABELS)
        family.add_metric(self._values, value)
        return family

    def _gauge(self, name: str, doc: str, value: float) -> GaugeMetricFamily:
        family = GaugeMetricFamily(name, doc, labels=_LABELS)
        family.add_metric(self._values, value)
        return family

    def _spec(self) -> Iterator[Metric]:
        c = self._scheduler.counters
        # vllm-neuron exposes the series but never counts a draft token.
        shown = 1 if self._report_spec else 0
        yield self._counter(
            "vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", c.num_drafts * shown
        )
        yield self._counter(
            "vllm:spec_decode_num_draft_tokens",
            "Number of draft tokens.",
            c.num_draft_tokens * shown,
        )
        yield self._counter(
            "vllm:spec_decode_num_accepted_tokens",
            "Number of accepted tokens.",
            c.num_accepted_tokens * shown,
        )
        per_pos = CounterMetricFamily(
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            "Accepted tokens per draft position.",
            labels=[*_LABELS, "position"],
        )
        for pos, value in enumerate(c.accepted_per_pos):
            per_pos.add_metric([*self._values, str(pos)], value * shown)
        yield per_pos

    def collect(self) -> Iterator[Metric]:
        s = self._scheduler
        if s.speculative:
            yield from self._spec()
        yield self._gauge(
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            s.num_running,
        )
        yield self._gauge(
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed.",
            s.num_waiting,
        )
        yield self._counter(
            "vllm:prompt_tokens", "Number of prefill tokens processed.", s.counters.prompt_tokens
        )
        yield self._counter(
            "vllm:generation_tokens",
            "Number of generation tokens processed.",
            s.counters.generation_tokens,
        )


def build_registry(
    scheduler: Scheduler, model_name: str, *, report_spec: bool
) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(EngineCollector(scheduler, model_name, report_spec=report_spec))
    return registry


def exposition(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)


class Families(Collector):
    """Whatever families ``make`` builds at scrape time (another engine's page)."""

    def __init__(self, make: Callable[[], list[Metric]]) -> None:
        self._make = make

    def collect(self) -> Iterator[Metric]:
        yield from self._make()


def registry_of(make: Callable[[], list[Metric]]) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(Families(make))
    return registry
