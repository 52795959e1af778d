"""Telemetry: Prometheus metrics behind /metrics, and OpenTelemetry traces.

Built once per app by ``Telemetry.build``; nothing here is global. Metrics live in a
registry owned by the app and are recorded through prometheus-client children cached per
label set: about 1 us a record, where the OpenTelemetry SDK's instruments cost about 10 us
(bench/RESULTS.md, "Gateway overhead"), and there are several records per request. To ship
them elsewhere, point an OpenTelemetry Collector's Prometheus receiver at /metrics.

Spans go through the OpenTelemetry API, one per pipeline step. With an OTLP endpoint they
are exported over OTLP/HTTP; without one the tracer hands out one shared do-nothing context,
so an unexported span costs a method call.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from gateway.acceptance import Outcome
from policies.guardrail import Transition

SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
TPOT = (0.002, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.2, 0.5, 1)
RATIO = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)
_NULL = contextlib.nullcontext()
M = TypeVar("M", Counter, Gauge, Histogram)


class Tracer(Protocol):
    def start_as_current_span(self, name: str) -> AbstractContextManager[object]: ...


class _Unexported:
    """The tracer when nothing exports spans."""

    def start_as_current_span(self, name: str) -> AbstractContextManager[object]:
        return _NULL


class _Children(Generic[M]):
    """A labelled metric's children, cached by their label values."""

    __slots__ = ("_cache", "_metric")

    def __init__(self, metric: M) -> None:
        self._metric: M = metric
        self._cache: dict[tuple[object, ...], M] = {}

    def __call__(self, *values: object) -> M:
        child = self._cache.get(values)
        if child is None:
            text = ("true" if v is True else "false" if v is False else str(v) for v in values)
            child = self._cache[values] = self._metric.labels(*text)
        return child


class _PoolAcceptance(Collector):
    def __init__(self, rates: dict[str, float]) -> None:
        self._rates = rates

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            "speclane_pool_draft_acceptance_rate",
            "accepted / drafted tokens of a speculative pool over the last scrape",
            labels=["pool"],
        )
        for pool, rate in sorted(self._rates.items()):
            family.add_metric([pool], rate)
        yield family


@dataclass(slots=True)
class Telemetry:
    tracer: Tracer
    registry: CollectorRegistry
    _requests: _Children[Counter]
    _ttft: _Children[Histogram]
    _tpot: _Children[Histogram]
    _acceptance: _Children[Histogram]
    _failovers: _Children[Counter]
    _transitions: _Children[Counter]
    _reloads: _Children[Counter]
    _shadow: _Children[Counter]
    _errors: _Children[Counter]
    _sync_errors: Counter
    _in_flight: _Children[Gauge]
    _tracers: TracerProvider | None
    degraded: bool = False
    pool_acceptance: dict[str, float] = field(default_factory=dict)

    @classmethod
    def build(cls, otlp_endpoint: str | None = None) -> Telemetry:
        registry = CollectorRegistry(auto_describe=True)
        tracers = _otlp_tracer(otlp_endpoint) if otlp_endpoint else None
        tracer: Tracer = tracers.get_tracer("speclane") if tracers else _Unexported()
        by_pool = ["model", "rule", "pool"]

        def counter(name: str, doc: str, labels: list[str]) -> _Children[Counter]:
            return _Children(Counter(name, doc, labels, registry=registry))

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> _Children[Histogram]:
            return _Children(Histogram(name, doc, by_pool, registry=registry, buckets=buckets))

        telemetry = cls(
            tracer=tracer,
            registry=registry,
            _requests=counter(
                "speclane_requests",
                "requests finished, by outcome",
                [*by_pool, "status", "signal", "shadow"],
            ),
            _ttft=histogram(
                "speclane_ttft_seconds", "time to first token, at the gateway", SECONDS
            ),
            _tpot=histogram("speclane_tpot_seconds", "time per output token after the first", TPOT),
            _acceptance=histogram(
                "speclane_draft_acceptance_rate",
                "accepted / drafted tokens per request on speculative pools",
                RATIO,
            ),
            _failovers=counter(
                "speclane_failovers",
                "upstream tries that failed before one served (or none did)",
                ["pool", "result"],
            ),
            _transitions=counter(
                "speclane_guardrail_transitions", "guardrail transitions", ["rule", "from", "to"]
            ),
            _reloads=counter("speclane_policy_reloads", "policy reloads, by result", ["result"]),
            _shadow=counter(
                "speclane_shadow_mirrors", "shadow mirrors, by result", ["pool", "result"]
            ),
            _errors=counter(
                "speclane_request_errors",
                "requests answered with an error before any upstream answered",
                ["status", "code"],
            ),
            _sync_errors=Counter(
                "speclane_state_sync_errors",
                "failed syncs with the shared store",
                registry=registry,
            ),
            _in_flight=_Children(
                Gauge(
                    "speclane_requests_in_flight",
                    "streams open to upstreams",
                    ["pool", "shadow"],
                    registry=registry,
                )
            ),
            _tracers=tracers,
        )
        degraded = Gauge(
            "speclane_state_degraded",
            "1 while the shared store is unreachable and state is local only",
            registry=registry,
        )
        degraded.set_function(lambda: 1.0 if telemetry.degraded else 0.0)
        registry.register(_PoolAcceptance(telemetry.pool_acceptance))
        return telemetry

    def opened(self, pool: str, shadow: bool) -> None:
        self._in_flight(pool, shadow).inc()

    def observe(self, outcome: Outcome) -> None:
        """One finished stream; every opened stream ends here exactly once."""
        labels = outcome.labels
        self._in_flight(labels.pool, labels.shadow).dec()
        status, signal = outcome.status.value, outcome.signal.value
        self._requests(labels.model, labels.rule, labels.pool, status, signal, labels.shadow).inc()
        where = (labels.model, labels.rule, labels.pool)
        if outcome.ttft_s is not None:
            self._ttft(*where).observe(outcome.ttft_s)
        if outcome.tpot_s is not None:
            self._tpot(*where).observe(outcome.tpot_s)
        rate = outcome.acceptance_rate
        if rate is not None:
            self._acceptance(*where).observe(rate)

    def failover(self, pool: str, result: str, tries: int = 1) -> None:
        self._failovers(pool, result).inc(tries)

    def transition(self, t: Transition) -> None:
        self._transitions(t.slice.split(" / ", 1)[0], t.before.phase, t.after.phase).inc()

    def reload(self, result: str) -> None:
        self._reloads(result).inc()

    def mirror(self, pool: str, result: str) -> None:
        self._shadow(pool, result).inc()

    def error(self, status: int, code: str) -> None:
        self._errors(status, code).inc()

    def sync_error(self) -> None:
        self._sync_errors.inc()

    def shutdown(self) -> None:
        if self._tracers is not None:
            self._tracers.shutdown()


def _otlp_tracer(endpoint: str) -> TracerProvider:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": "speclane"}))
    exporter = OTLPSpanExporter(endpoint=f"{endpoint}/v1/traces")
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider
