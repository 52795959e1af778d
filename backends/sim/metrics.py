"""The simulated server's ``/metrics``: vLLM-named Prometheus series read from the engine.

A custom collector on a registry the app owns reads ``EngineCounters``, the KV cache's
statistics and the scheduler's queue lengths at scrape time, so the request path never
touches prometheus-client. Series carry ``engine="0"`` and ``model_name`` like vLLM's, with
vLLM 0.32's names, types and help texts: besides the speculative counters and the token
counters, ``vllm:kv_cache_usage_perc`` (share of KV blocks held by running requests),
``vllm:prefix_cache_queries`` and ``vllm:prefix_cache_hits`` (in tokens, counted when a
request is admitted), ``vllm:num_preemptions``, ``vllm:prompt_tokens_cached``,
``vllm:prompt_tokens_by_source`` (``local_compute``, ``local_cache_hit``,
``external_kv_transfer``) and ``vllm:num_requests_waiting_by_reason`` (every waiting request
waits for ``capacity``: seats, budget or KV blocks). Must not use the global registry.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
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

    def _labelled(
        self, family: CounterMetricFamily | GaugeMetricFamily, values: dict[str, float]
    ) -> CounterMetricFamily | GaugeMetricFamily:
        for key, value in values.items():
            family.add_metric([*self._values, key], value)
        return family

    def _cache(self) -> Iterator[Metric]:
        s = self._scheduler
        kv, c = s.kv, s.counters
        queries = hits = preemptions = 0
        if kv is not None:
            queries, hits, preemptions = kv.stats.queries, kv.stats.hits, kv.stats.preemptions
        yield self._gauge(
            "vllm:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.",
            kv.usage if kv is not None else 0.0,
        )
        yield self._counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            queries,
        )
        yield self._counter(
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            hits,
        )
        yield self._counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine.", preemptions
        )
        yield self._counter(
            "vllm:prompt_tokens_cached",
            "Number of cached prompt tokens (local + external).",
            c.cached_prompt_tokens,
        )
        by_source = CounterMetricFamily(
            "vllm:prompt_tokens_by_source",
            "Number of prompt tokens by source.",
            labels=[*_LABELS, "source"],
        )
        yield self._labelled(
            by_source,
            {
                "local_compute": c.prompt_tokens - c.cached_prompt_tokens,
                "local_cache_hit": c.cached_prompt_tokens,
                "external_kv_transfer": 0,
            },
        )

    def collect(self) -> Iterator[Metric]:
        s = self._scheduler
        if s.speculative:
            yield from self._spec()
        yield from self._cache()
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
        by_reason = GaugeMetricFamily(
            "vllm:num_requests_waiting_by_reason",
            "Number of waiting requests by reason. Reason labels: 'capacity' = waiting for "
            "scheduling capacity; 'deferred' = deferred by transient constraints (LoRA budget, "
            "KV transfer, blocked status). Sum of all reasons equals vllm:num_requests_waiting.",
            labels=[*_LABELS, "reason"],
        )
        yield self._labelled(by_reason, {"capacity": s.num_waiting, "deferred": 0})
        yield self._counter(
            "vllm:prompt_tokens", "Number of prefill tokens processed.", s.counters.prompt_tokens
        )
        yield self._counter(
            "vllm:generation_tokens",
            "Number of generation tokens processed.",
            s.counters.generation_tokens,
        )
        steps = HistogramMetricFamily(
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            labels=_LABELS,
        )
        tokens = s.counters.prompt_tokens + s.counters.generation_tokens
        steps.add_metric(self._values, [("+Inf", float(s.counters.steps))], float(tokens))
        yield steps


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
