"""Telemetry: OpenTelemetry traces and metrics, and the Prometheus registry behind /metrics.

Built once per app by ``Telemetry.build``; nothing here is global. Without an OTLP endpoint
the tracer is OpenTelemetry's no-op tracer, so spans cost next to nothing; metrics always
go to a Prometheus registry owned by the app (and to OTLP too when an endpoint is set).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from opentelemetry import trace
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.metrics import Counter, Histogram, Observation, UpDownCounter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from prometheus_client import CollectorRegistry

from gateway.acceptance import Outcome

SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
TPOT = (0.002, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.2, 0.5, 1)
RATIO = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)


@dataclass(slots=True)
class Telemetry:
    tracer: trace.Tracer
    registry: CollectorRegistry
    requests: Counter
    ttft: Histogram
    tpot: Histogram
    acceptance: Histogram
    failovers: Counter
    transitions: Counter
    reloads: Counter
    shadow: Counter
    state_errors: Counter
    errors: Counter
    in_flight: UpDownCounter
    _meters: MeterProvider
    _tracers: TracerProvider | None
    degraded: bool = False
    pool_acceptance: dict[str, float] = field(default_factory=dict)

    @classmethod
    def build(cls, otlp_endpoint: str | None = None) -> Telemetry:
        registry = CollectorRegistry(auto_describe=True)
        resource = Resource.create({"service.name": "speclane"})
        readers: list[MetricReader] = [PrometheusMetricReader(registry=registry)]
        tracers: TracerProvider | None = None
        if otlp_endpoint:
            readers.append(_otlp_metrics(otlp_endpoint))
            tracers = _otlp_tracer(otlp_endpoint, resource)
        meters = MeterProvider(metric_readers=readers, resource=resource)
        meter = meters.get_meter("speclane")
        tracer = tracers.get_tracer("speclane") if tracers else trace.NoOpTracer()
        telemetry = cls(
            tracer=tracer,
            registry=registry,
            requests=meter.create_counter(
                "speclane_requests", description="requests finished, by outcome"
            ),
            ttft=meter.create_histogram(
                "speclane_ttft_seconds",
                unit="s",
                description="time to first token, at the gateway",
                explicit_bucket_boundaries_advisory=SECONDS,
            ),
            tpot=meter.create_histogram(
                "speclane_tpot_seconds",
                unit="s",
                description="time per output token after the first",
                explicit_bucket_boundaries_advisory=TPOT,
            ),
            acceptance=meter.create_histogram(
                "speclane_draft_acceptance_rate",
                description="accepted / drafted tokens per request on speculative pools",
                explicit_bucket_boundaries_advisory=RATIO,
            ),
            failovers=meter.create_counter(
                "speclane_failovers", description="upstream tries that failed before one served"
            ),
            transitions=meter.create_counter(
                "speclane_guardrail_transitions", description="guardrail transitions, by phase"
            ),
            reloads=meter.create_counter(
                "speclane_policy_reloads", description="policy reloads, by result"
            ),
            shadow=meter.create_counter(
                "speclane_shadow_mirrors", description="shadow mirrors, by result"
            ),
            state_errors=meter.create_counter(
                "speclane_state_sync_errors", description="failed syncs with the shared store"
            ),
            errors=meter.create_counter(
                "speclane_request_errors",
                description="requests answered with an error before any upstream answered",
            ),
            in_flight=meter.create_up_down_counter(
                "speclane_requests_in_flight", description="requests being served"
            ),
            _meters=meters,
            _tracers=tracers,
        )
        meter.create_observable_gauge(
            "speclane_state_degraded",
            callbacks=[lambda options: [Observation(1 if telemetry.degraded else 0)]],
            description="1 while the shared store is unreachable and state is local only",
        )
        meter.create_observable_gauge(
            "speclane_pool_draft_acceptance_rate",
            callbacks=[
                lambda options: [
                    Observation(rate, {"pool": pool})
                    for pool, rate in telemetry.pool_acceptance.items()
                ]
            ],
            description="accepted / drafted tokens of a speculative pool over the last scrape",
        )
        return telemetry

    def opened(self, pool: str, shadow: bool) -> None:
        self.in_flight.add(1, {"pool": pool, "shadow": shadow})

    def observe(self, outcome: Outcome) -> None:
        """One finished stream; every opened stream ends here exactly once."""
        labels = outcome.labels
        self.in_flight.add(-1, {"pool": labels.pool, "shadow": labels.shadow})
        attributes = {
            "model": labels.model,
            "rule": labels.rule,
            "pool": labels.pool,
            "status": outcome.status.value,
            "signal": outcome.signal.value,
            "shadow": labels.shadow,
        }
        self.requests.add(1, attributes)
        where = {"model": labels.model, "rule": labels.rule, "pool": labels.pool}
        if outcome.ttft_s is not None:
            self.ttft.record(outcome.ttft_s, where)
        if outcome.tpot_s is not None:
            self.tpot.record(outcome.tpot_s, where)
        rate = outcome.acceptance_rate
        if rate is not None:
            self.acceptance.record(rate, where)

    def shutdown(self) -> None:
        self._meters.shutdown()
        if self._tracers is not None:
            self._tracers.shutdown()


def _otlp_metrics(endpoint: str) -> MetricReader:
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

    return PeriodicExportingMetricReader(OTLPMetricExporter(endpoint=f"{endpoint}/v1/metrics"))


def _otlp_tracer(endpoint: str, resource: Resource) -> TracerProvider:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=resource)
    provider.add_span_processor(
        BatchSpanProcessor(OTLPSpanExporter(endpoint=f"{endpoint}/v1/traces"))
    )
    return provider
