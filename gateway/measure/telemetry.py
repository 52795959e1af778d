"""Telemetry: Prometheus metrics behind /metrics, and the request traces (``tracing.py``).

Built once per app by ``Telemetry.build``; nothing here is global, except the switch
prometheus-client keeps per process for several workers (``share_between_processes``).
Metrics live in a registry owned by the app and are recorded through prometheus-client
children cached per label set: about 1 us a record, where the OpenTelemetry SDK's
instruments cost about 10 us (bench/RESULTS.md, "Gateway overhead"), and there are several
records per request. Metrics are not sent over OTLP: to ship them elsewhere, point an
OpenTelemetry Collector's Prometheus receiver at /metrics. Traces go out over OTLP/HTTP
when an endpoint is set.

Per-request records are plain numbers until ``push`` moves them into prometheus-client,
once a second and before every scrape (``tally.py``).

Labels are bounded: model, rule, pool and slice (capped, ``slicecap.py``), never tenant or
user. Ratios are exported as the counters whose rates divide into the right figure (token-
weighted acceptance = accepted / drafted tokens; tokens per step = decode tokens / decode
steps), never as per-request rates to be averaged. Shadow mirrors count in the token
counters (they measure the pool) but not in the latency histograms or validity, which are
what clients saw.

Explained for operators, with its numbers, in docs/observability.md ("Metrics").
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Generic, TypeVar

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, values
from prometheus_client.gc_collector import GCCollector
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from gateway.measure.acceptance import Outcome
from gateway.measure.collectors import (
    CacheKept,
    FlagStates,
    GuardrailStates,
    LoopTasks,
    PoolAcceptance,
    PoolReading,
    Prices,
)
from gateway.measure.slicecap import SliceLabels
from gateway.measure.tally import Counts, Levels, Observations
from gateway.measure.tracing import Tracing
from gateway.measure.views import Views
from policies.compiled import CompiledPolicy
from policies.flags import FlagValue
from policies.guardrail import Transition

__all__ = ["PoolReading", "Telemetry"]

SECONDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
PHASES = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 120)
TPOT = (0.002, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.2, 0.5, 1)
RATIO = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0)
M = TypeVar("M", Counter, Gauge, Histogram)


class _Children(Generic[M]):
    """A labelled metric's children, cached by their label values."""

    __slots__ = ("_cache", "_metric")

    def __init__(self, metric: M) -> None:
        self._metric: M = metric
        self._cache: dict[tuple[object, ...], M] = {}

    def __call__(self, *values: object) -> M:
        child = self._cache.get(values)
        if child is None:
            child = self._cache[values] = self._metric.labels(*_text(values))
        return child

    def prune(self, keep: Callable[[tuple[object, ...]], bool]) -> None:
        """Remove every series whose labels ``keep`` refuses."""
        for labels in [v for v in self._cache if not keep(v)]:
            del self._cache[labels]
            self._metric.remove(*_text(labels))


def _members(group: _Latency | _Slices) -> list[Any]:
    """The metrics of a group, one per field."""
    return [getattr(group, f.name) for f in fields(group)]


def _text(values: tuple[object, ...]) -> list[str]:
    return ["true" if v is True else "false" if v is False else str(v) for v in values]


@dataclass(slots=True)
class _Slices:
    """Per (rule, slice, pool): the counters whose ratios are the slice's figures."""

    output: Counts
    decode_tokens: Counts
    decode_steps: Counts
    drafted: Counts
    accepted: Counts
    serving: Counts


@dataclass(slots=True)
class _Latency:
    """Client-facing latency histograms by (model, rule, pool)."""

    duration: Observations
    ttft: Observations
    tpot: Observations
    phase: Observations
    acceptance: Observations


@dataclass(slots=True)
class _Counters:
    """Counters recorded as they happen, by their labels."""

    structured: _Children[Counter]
    failovers: _Children[Counter]
    upstream_failures: _Children[Counter]
    rejections: _Children[Counter]
    transitions: _Children[Counter]
    reloads: _Children[Counter]
    shadow: _Children[Counter]
    errors: _Children[Counter]
    pin_writes_dropped: _Children[Counter]
    placements: _Children[Counter]
    prompt_tokens: _Children[Counter]
    moves: _Children[Counter]
    cached_tokens: _Children[Counter]


# The metrics, by where they live: (name, help) or (name, help, labels or buckets, ...).
_REQUESTS = (
    "speclane_requests",
    "requests finished, by outcome; endpoint is the route they came in on (the rule of the "
    "engine's other routes is passthrough, of calls to a stored response pinned)",
    ["model", "rule", "pool", "status", "signal", "shadow", "endpoint"],
)
_BY_SLICE = ["rule", "slice", "pool"]
_SLICES = {  # _Slices: per (rule, slice, pool)
    "output": ("speclane_output_tokens", "completion tokens served, by slice"),
    "decode_tokens": (
        "speclane_decode_tokens",
        "tokens after the first, of requests whose engine steps are known; over "
        "speclane_decode_steps_total it is tokens per step (mean acceptance length where every "
        "step drafts)",
    ),
    "decode_steps": ("speclane_decode_steps", "engine steps after the first token"),
    "drafted": ("speclane_draft_tokens", "draft tokens proposed, where visible"),
    "accepted": (
        "speclane_accepted_draft_tokens",
        "draft tokens accepted; over speclane_draft_tokens_total it is the token-weighted draft "
        "acceptance rate",
    ),
    "serving": (
        "speclane_serving_seconds",
        "endpoint-seconds spent on requests: each request's time upstream over the mean "
        "requests in flight on its endpoint meanwhile (its share of the server); over "
        "speclane_output_tokens_total, times speclane_pool_cost_per_hour / 3600, it is the cost "
        "per output token",
    ),
}
_LATENCY: dict[str, tuple[str, str, tuple[float, ...], tuple[str, ...]]] = {
    # _Latency: histograms by (model, rule, pool, *extra)
    "duration": (
        "speclane_request_duration_seconds",
        "end-to-end time of a request at the gateway, to its last byte",
        SECONDS,
        (),
    ),
    "ttft": ("speclane_ttft_seconds", "time to first token, at the gateway", SECONDS, ()),
    "tpot": ("speclane_tpot_seconds", "time per output token after the first", TPOT, ()),
    "phase": (
        "speclane_request_phase_seconds",
        "where a request's time went: admission (at the gateway, until it went upstream), "
        "upstream_wait (from then to the first token: connecting, failed tries, the engine's "
        "queue and prefill), queue (the engine's own queue time, where vLLM reports it; part "
        "of upstream_wait), decode (first to last token)",
        PHASES,
        ("phase",),
    ),
    "acceptance": (
        "speclane_draft_acceptance_rate",
        "accepted / drafted tokens per request on speculative pools (per-request spread; the "
        "token-weighted figure is speclane_accepted_draft_tokens_total / "
        "speclane_draft_tokens_total)",
        RATIO,
        (),
    ),
}
_COUNTERS: dict[str, tuple[str, str, list[str]]] = {  # _Counters
    "structured": (
        "speclane_structured_outputs",
        "structured answers (json_object, json_schema) and tool calls checked against what the "
        "request asked for, by result",
        ["model", "rule", "pool", "kind", "result"],
    ),
    "failovers": (
        "speclane_failovers",
        "requests the decision sent to a pool that another endpoint or pool (served_by) "
        "served, retries of answers that broke before reaching the client "
        "(retried_after_break, one per retry), requests whose break retries ran out "
        "(exhausted_after_break), or that none could serve (exhausted)",
        ["pool", "result", "served_by"],
    ),
    "upstream_failures": (
        "speclane_upstream_failures",
        "tries that failed before their first event, by the pool tried",
        ["pool"],
    ),
    "rejections": (
        "speclane_upstream_rejections",
        "client errors (4xx) an upstream answered, passed on to the client",
        ["pool", "status"],
    ),
    "transitions": (
        "speclane_guardrail_transitions",
        "guardrail transitions",
        ["rule", "from", "to"],
    ),
    "reloads": ("speclane_policy_reloads", "policy reloads, by result", ["result"]),
    "shadow": ("speclane_shadow_mirrors", "shadow mirrors, by result", ["pool", "result"]),
    "placements": (
        "speclane_placements",
        "requests placed first on an endpoint of their pool by their prompt's prefix, by how: "
        "cache (it holds the conversation), cache_loaded (it holds the conversation and is over "
        "the load bound, but re-prefilling elsewhere would cost more), spread (a new "
        "conversation, by rendezvous hashing), bound (the endpoint that holds it was over the "
        "load bound), least_loaded",
        ["pool", "how"],
    ),
    "moves": (
        "speclane_conversation_moves",
        "conversations cached on one pool whose slice is served on another: moved (the decode "
        "saving over their turns left pays for re-prefilling their context), kept (it does "
        "not), unpriced (no price known yet: they followed the rung)",
        ["from_pool", "to_pool", "result"],
    ),
    "prompt_tokens": (
        "speclane_prompt_tokens",
        "prompt tokens of answers that said how many of them the engine's prefix cache held, by "
        "the pool and endpoint that served them",
        ["pool", "endpoint"],
    ),
    "cached_tokens": (
        "speclane_cached_prompt_tokens",
        "prompt tokens the engine's prefix cache held (usage's cached_tokens, Messages' "
        "cache_read_input_tokens); over speclane_prompt_tokens_total it is the cache-hit ratio",
        ["pool", "endpoint"],
    ),
    "errors": (
        "speclane_request_errors",
        "OpenAI-route requests (/v1/) answered with an error before any upstream answered",
        ["status", "code"],
    ),
    "pin_writes_dropped": (
        "speclane_response_pin_writes_dropped",
        "writes of a stored response's pin that never reached Redis (other replicas cannot "
        "place that id), by reason: queue_full or redis_error",
        ["reason"],
    ),
}
_RELAYED_RULES = frozenset({"passthrough", "pinned"})  # the rules of relayed calls
_SYNC_ERRORS = ("speclane_state_sync_errors", "failed syncs with the shared store")
_IN_FLIGHT = ("speclane_requests_in_flight", "streams open to upstreams", ["pool", "shadow"])
_DEGRADED = (
    "speclane_state_degraded",
    "1 while the shared store is unreachable and state is local only (in any worker)",
)


@dataclass(slots=True)
class Telemetry:
    tracing: Tracing
    registry: CollectorRegistry
    slice_label: SliceLabels
    _requests: Counts
    _latency: _Latency
    _slices: _Slices
    _counters: _Counters
    _sync_errors: Counter
    _in_flight: Levels
    _degraded: Gauge
    _tracers: TracerProvider | None
    exposition: CollectorRegistry  # what /metrics serves
    pool_acceptance: dict[str, PoolReading] = field(default_factory=dict)

    @classmethod
    def build(
        cls,
        otlp_endpoint: str | None = None,
        tracers: TracerProvider | None = None,
        *,
        shared: Path | None = None,
        max_slices: int = 200,
    ) -> Telemetry:
        """``tracers``, when given, is the provider spans go to (a test's in-memory one).
        ``shared``: the directory where the workers of one ``speclane serve --workers N``
        keep their metrics (after ``share_between_processes``); /metrics then sums them."""
        if shared is not None and not getattr(values.ValueClass, "_multiprocess", False):
            raise RuntimeError("metrics shared between workers need share_between_processes()")
        registry = CollectorRegistry(auto_describe=True)
        if tracers is None and otlp_endpoint:
            tracers = _otlp_tracer(otlp_endpoint)
        tracing = Tracing(tracers.get_tracer("speclane") if tracers else None)

        def counts(name: str, doc: str, labels: list[str]) -> Counts:
            return Counts(Counter(name, doc, labels, registry=registry))

        def histogram(
            name: str, doc: str, buckets: tuple[float, ...], extra: tuple[str, ...]
        ) -> Observations:
            labels = ["model", "rule", "pool", *extra]
            metric = Histogram(name, doc, labels, registry=registry, buckets=buckets)
            return Observations(metric, buckets)

        in_flight = Gauge(*_IN_FLIGHT, registry=registry, multiprocess_mode="livesum")
        telemetry = cls(
            tracing=tracing,
            registry=registry,
            slice_label=SliceLabels(max_slices),
            _requests=counts(*_REQUESTS),
            _latency=_Latency(**{f: histogram(*spec) for f, spec in _LATENCY.items()}),
            _slices=_Slices(**{f: counts(*spec, _BY_SLICE) for f, spec in _SLICES.items()}),
            _counters=_Counters(
                **{
                    f: _Children(Counter(name, doc, labels, registry=registry))
                    for f, (name, doc, labels) in _COUNTERS.items()
                }
            ),
            _sync_errors=Counter(*_SYNC_ERRORS, registry=registry),
            _in_flight=Levels(in_flight),
            _degraded=Gauge(*_DEGRADED, registry=registry, multiprocess_mode="livemax"),
            _tracers=tracers,
            exposition=registry,
        )
        if shared is not None:
            telemetry.exposition = CollectorRegistry()
            MultiProcessCollector(telemetry.exposition, path=str(shared))  # type: ignore[no-untyped-call]
        # read at each scrape, from the process that answers it: every worker scrapes the same
        # pools; process and GC figures are that worker's
        telemetry._collect(PoolAcceptance(telemetry.pool_acceptance))
        process = (
            ProcessCollector(registry=registry),
            GCCollector(registry=registry),
            PlatformCollector(registry=registry),
            LoopTasks(),
        )
        registry.register(process[-1])
        if telemetry.exposition is not registry:
            for collector in process:
                telemetry.exposition.register(collector)
        return telemetry

    def _collect(self, collector: Collector) -> None:
        self.registry.register(collector)
        if self.exposition is not self.registry:
            self.exposition.register(collector)

    def watch(
        self,
        views: Views,
        policy: Callable[[], CompiledPolicy],
        wall: Callable[[], float],
        flags: Callable[[], Mapping[str, tuple[FlagValue, str]]] = dict,
        kept: Callable[[], Mapping[str, tuple[float, int]]] = dict,
    ) -> None:
        """Read the guardrail's states and estimates, the pools' prices, what the endpoints'
        caches kept and the flags' states at each scrape (guardrail states and flags are
        shared between workers and replicas through the store; the rest is this worker's)."""
        self._collect(GuardrailStates(views, self.slice_label, wall))
        self._collect(Prices(policy))
        self._collect(CacheKept(policy, kept))
        self._collect(FlagStates(flags))

    def policy_changed(self, rules: frozenset[str]) -> None:
        """A new policy whose rules are ``rules``: every series of a rule it no longer has
        goes (requests, latency, slice counters, checks, transitions); the engine's other
        routes (rule ``passthrough``) and stored-response calls (``pinned``) stay. The
        guardrail's gauges leave those rules' slices out at the next scrape by themselves
        (``collectors.GuardrailStates``)."""
        kept = rules | _RELAYED_RULES

        def keep_at(index: int) -> Callable[[tuple[object, ...]], bool]:
            return lambda values: values[index] in kept

        self._requests.prune(keep_at(1))
        for histogram in _members(self._latency):
            histogram.prune(keep_at(1))
        for counts in _members(self._slices):
            counts.prune(keep_at(0))
        self._counters.structured.prune(keep_at(1))
        self._counters.transitions.prune(keep_at(0))

    def opened(self, pool: str, shadow: bool) -> None:
        self._in_flight.add((pool, shadow), 1.0)

    def observe(self, outcome: Outcome) -> None:
        """One finished stream; every opened stream ends here exactly once."""
        labels = outcome.labels
        self._in_flight.add((labels.pool, labels.shadow), -1.0)
        status, signal = outcome.status.value, outcome.signal.value
        self._requests.add(
            (labels.model, labels.rule, labels.pool, status, signal, labels.shadow, labels.route)
        )
        self._count_tokens(outcome)
        if outcome.cached_tokens is not None and outcome.prompt_tokens > 0:
            where_cached = (labels.pool, labels.endpoint)
            self._counters.prompt_tokens(*where_cached).inc(outcome.prompt_tokens)
            cached = min(outcome.cached_tokens, outcome.prompt_tokens)
            self._counters.cached_tokens(*where_cached).inc(cached)
        if labels.shadow:
            return
        where = (labels.model, labels.rule, labels.pool)
        latency = self._latency
        latency.duration.add(where, outcome.duration_s)
        if outcome.ttft_s is not None:
            latency.ttft.add(where, outcome.ttft_s)
        if outcome.tpot_s is not None:
            latency.tpot.add(where, outcome.tpot_s)
        self._phases(where, outcome)
        rate = outcome.acceptance_rate
        if rate is not None:
            latency.acceptance.add(where, rate)
        for kind, result in outcome.checks:
            self._counters.structured(*where, kind, result).inc()

    def _phases(self, where: tuple[str, str, str], outcome: Outcome) -> None:
        add = self._latency.phase.add
        if outcome.admission_s is not None:
            add((*where, "admission"), outcome.admission_s)
        wait = outcome.upstream_wait_s
        if wait is not None:
            add((*where, "upstream_wait"), wait)
        if outcome.queue_s is not None:
            add((*where, "queue"), outcome.queue_s)
        if outcome.decode_s is not None:
            add((*where, "decode"), outcome.decode_s)

    def _count_tokens(self, outcome: Outcome) -> None:
        labels = outcome.labels
        at = (labels.rule, self.slice_label(labels.slice), labels.pool)
        counters = self._slices
        tokens = outcome.completion_tokens
        if tokens:
            counters.output.add(at, tokens)
        if outcome.steps and tokens > 1:
            counters.decode_tokens.add(at, tokens - 1)
            counters.decode_steps.add(at, outcome.steps)
        if outcome.drafted:
            counters.drafted.add(at, outcome.drafted)
            counters.accepted.add(at, outcome.accepted)
        serving = outcome.serving_s
        if serving is not None:
            counters.serving.add(at, serving)

    def push(self) -> None:
        """Move the per-request records into prometheus-client (before every scrape)."""
        slices, latency = self._slices, self._latency
        for batched in (
            self._requests,
            self._in_flight,
            slices.output,
            slices.decode_tokens,
            slices.decode_steps,
            slices.drafted,
            slices.accepted,
            slices.serving,
            latency.duration,
            latency.ttft,
            latency.tpot,
            latency.phase,
            latency.acceptance,
        ):
            batched.push()

    async def run(self, interval_s: float = 1.0) -> None:
        """The lifespan's task: push once a second, so several workers' sums stay fresh."""
        try:
            while True:
                await asyncio.sleep(interval_s)
                self.push()
        finally:
            self.push()

    def relayed(self, model: str, rule: str, pool: str, status: str, route: str) -> None:
        """One request to one of the engine's other routes, or to a stored response."""
        self._requests.add((model, rule, pool, status, "none", False, route))

    def failover(self, pool: str, result: str, served_by: str = "") -> None:
        """One request that left ``pool``, the pool its decision named."""
        self._counters.failovers(pool, result, served_by).inc()

    def moved(self, held_on: str, rung: str, result: str) -> None:
        self._counters.moves(held_on, rung, result).inc()

    def placed(self, pool: str, how: str) -> None:
        self._counters.placements(pool, how).inc()

    def upstream_failure(self, pool: str) -> None:
        self._counters.upstream_failures(pool).inc()

    def rejected(self, pool: str, status: int) -> None:
        self._counters.rejections(pool, status).inc()

    def transition(self, t: Transition) -> None:
        if t.before == t.after:  # a split or merge by application: no rung changed
            return
        self._counters.transitions(t.slice.split(" / ", 1)[0], t.before.phase, t.after.phase).inc()

    def reload(self, result: str) -> None:
        self._counters.reloads(result).inc()

    def mirror(self, pool: str, result: str) -> None:
        self._counters.shadow(pool, result).inc()

    def error(self, status: int, code: str) -> None:
        self._counters.errors(status, code).inc()

    def pin_writes_dropped(self, reason: str, n: int) -> None:
        self._counters.pin_writes_dropped(reason).inc(n)

    def sync_error(self) -> None:
        self._sync_errors.inc()

    def set_degraded(self, degraded: bool) -> None:
        self._degraded.set(1.0 if degraded else 0.0)

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


def share_between_processes() -> None:
    """Switch this process's prometheus-client to its multiprocess mode: every value lives in
    a file under ``PROMETHEUS_MULTIPROC_DIR``, where /metrics of any worker sums them.
    prometheus-client keeps that choice in a module global read when a metric is made, so
    this runs once in each worker, before its ``Telemetry`` is built."""
    values.ValueClass = values.MultiProcessValue()  # type: ignore[no-untyped-call]
