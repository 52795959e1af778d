"""Traces: one request's story. A server span per request (``chat MODEL``, the GenAI
semantic conventions' name), parent of one span per pipeline step (parse, classify,
decide, forward, relay); W3C trace context taken from the client's ``traceparent`` and
``tracestate`` and sent upstream from the forward span, so vLLM's own ``llm_request`` span
(with ``--otlp-traces-endpoint``) joins the same trace.

Attributes: the GenAI conventions' ``gen_ai.operation.name``, ``gen_ai.request.model``,
``gen_ai.request.temperature``, ``gen_ai.request.top_p``, ``gen_ai.request.max_tokens``,
``gen_ai.usage.input_tokens``, ``gen_ai.usage.output_tokens`` and
``gen_ai.response.finish_reasons``, plus speclane's rule, slice, pool, rung, arm, signal,
acceptance and tokens per step. A client's error (a 4xx) names its code in ``error.type``
and records no exception: a bad request is not a fault, and a stack trace per bad request
would flood the traces.

Hand-rolled on the OpenTelemetry API rather than the maintained ASGI instrumentation, which
cost hundreds of microseconds per streamed request even with a no-op tracer when the two
were measured side by side; the upstream client is speclane's own. Without an exporter ``begin``
hands out a shared do-nothing trace, which still relays a client's ``traceparent`` upstream
unchanged, so the client's trace reaches vLLM even when speclane exports nothing.

Explained for operators, with its numbers, in docs/observability.md ("Traces").
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, MutableMapping
from contextlib import AbstractContextManager
from typing import Protocol

from opentelemetry import context as otel_context
from opentelemetry import trace as otel_trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from gateway.errors import ApiError
from gateway.measure.acceptance import Outcome, Status
from policies.decision import Decision
from policies.features import Features

_NULL = contextlib.nullcontext()
_W3C = TraceContextTextMapPropagator()
_HEADERS = ("traceparent", "tracestate")


class Trace(Protocol):
    """What the pipeline tells about one request."""

    def step(self, name: str) -> AbstractContextManager[object]: ...

    def decided(self, features: Features, decision: Decision) -> None: ...

    def inject(self, headers: MutableMapping[str, str]) -> None: ...

    def relaying(self) -> None: ...

    def finished(self, outcome: Outcome) -> None: ...

    def end(self, status: int, error: BaseException | None = None) -> None: ...


class _Quiet:
    """The trace when nothing exports spans: every call does nothing, except that a
    client's trace context is passed upstream as it came."""

    __slots__ = ("_context",)

    def __init__(self, context: tuple[tuple[str, str], ...] = ()) -> None:
        self._context = context

    def step(self, name: str) -> AbstractContextManager[object]:
        return _NULL

    def decided(self, features: Features, decision: Decision) -> None:
        pass

    def inject(self, headers: MutableMapping[str, str]) -> None:
        headers.update(self._context)

    def relaying(self) -> None:
        pass

    def finished(self, outcome: Outcome) -> None:
        pass

    def end(self, status: int, error: BaseException | None = None) -> None:
        pass


QUIET = _Quiet()


class _Spanned:
    """One request's spans when they are exported."""

    __slots__ = ("_context", "_current", "_ended", "_operation", "_relay", "_span", "_tracer")

    def __init__(
        self, tracer: otel_trace.Tracer, parent: otel_context.Context, operation: str
    ) -> None:
        self._tracer = tracer
        self._operation = operation
        self._span = tracer.start_span(
            operation,
            context=parent,
            kind=otel_trace.SpanKind.SERVER,
            attributes={"gen_ai.operation.name": operation},
        )
        self._context = otel_trace.set_span_in_context(self._span)
        self._current: otel_context.Context | None = None
        self._relay: otel_trace.Span | None = None
        self._ended = False

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[object]:
        kind = otel_trace.SpanKind.CLIENT if name == "forward" else otel_trace.SpanKind.INTERNAL
        span = self._tracer.start_span(name, context=self._context, kind=kind)
        self._current = otel_trace.set_span_in_context(span)
        try:
            yield span
        except BaseException as exc:
            _failed(span, exc)
            raise
        finally:
            self._current = None
            span.end()

    def decided(self, features: Features, decision: Decision) -> None:
        self._span.update_name(f"{self._operation} {features.model}")
        attributes: dict[str, str | int | float | bool] = {
            "gen_ai.request.model": features.model,
            "gen_ai.request.temperature": features.temperature,
            "gen_ai.request.top_p": features.top_p,
            "speclane.rule": decision.rule,
            "speclane.slice": decision.slice,
            "speclane.decision.pool": decision.pool,
            "speclane.rung": decision.rung,
            "speclane.reason": decision.reason,
            "speclane.probe": decision.probe,
        }
        if features.max_tokens is not None:
            attributes["gen_ai.request.max_tokens"] = features.max_tokens
        if decision.arm:
            attributes["speclane.arm"] = decision.arm
        if decision.shadow_to:
            attributes["speclane.shadow_to"] = decision.shadow_to
        self._span.set_attributes(attributes)

    def inject(self, headers: MutableMapping[str, str]) -> None:
        _W3C.inject(headers, context=self._current or self._context)

    def relaying(self) -> None:
        if self._relay is None:
            self._relay = self._tracer.start_span("relay", context=self._context)

    def finished(self, outcome: Outcome) -> None:
        attributes: dict[str, str | int | float | bool | list[str]] = {
            "gen_ai.usage.input_tokens": outcome.prompt_tokens,
            "gen_ai.usage.output_tokens": outcome.completion_tokens,
            "speclane.pool": outcome.labels.pool,
            "speclane.signal": outcome.signal.value,
            "speclane.status": outcome.status.value,
        }
        if outcome.finish_reason:
            attributes["gen_ai.response.finish_reasons"] = [outcome.finish_reason]
        if outcome.acceptance_rate is not None:
            attributes["speclane.draft_acceptance_rate"] = outcome.acceptance_rate
        if outcome.tokens_per_step is not None:
            attributes["speclane.tokens_per_step"] = outcome.tokens_per_step
        if outcome.error:
            attributes["error.type"] = "upstream_stream_broken"
        self._span.set_attributes(attributes)
        if self._relay is not None:
            if outcome.status is Status.ERROR:
                self._relay.set_status(otel_trace.Status(otel_trace.StatusCode.ERROR))
            self._relay.end()
            self._relay = None

    def end(self, status: int, error: BaseException | None = None) -> None:
        if self._ended:
            return
        self._ended = True
        self._span.set_attribute("http.response.status_code", status)
        if error is not None:
            _failed(self._span, error)
        elif status >= 500:
            self._span.set_status(otel_trace.Status(otel_trace.StatusCode.ERROR))
        if self._relay is not None:
            self._relay.end()
        self._span.end()


def _failed(span: otel_trace.Span, exc: BaseException) -> None:
    """A client's error names its code; anything else is recorded with its exception."""
    if isinstance(exc, ApiError) and exc.status < 500:
        span.set_attribute("error.type", exc.code or exc.type)
        return
    if isinstance(exc, ApiError):
        span.set_attribute("error.type", exc.code or exc.type)
    elif isinstance(exc, Exception):
        span.record_exception(exc)
        span.set_attribute("error.type", type(exc).__qualname__)
    else:  # cancelled: the client went away
        span.set_attribute("error.type", "cancelled")
        return
    span.set_status(otel_trace.Status(otel_trace.StatusCode.ERROR, str(exc)))


class Tracing:
    """Hands out one ``Trace`` per request."""

    __slots__ = ("_tracer",)

    def __init__(self, tracer: otel_trace.Tracer | None) -> None:
        self._tracer = tracer

    @property
    def exported(self) -> bool:
        return self._tracer is not None

    def begin(self, headers: Mapping[str, str], operation: str) -> Trace:
        """A request's trace, under the client's trace context when it sent one."""
        if self._tracer is None:
            parent = headers.get("traceparent")
            if parent is None:
                return QUIET
            state = headers.get("tracestate")
            relayed = (("traceparent", parent),) + ((("tracestate", state),) if state else ())
            return _Quiet(relayed)
        carrier = {h: v for h in _HEADERS if (v := headers.get(h)) is not None}
        return _Spanned(self._tracer, _W3C.extract(carrier), operation)

    def span(self, name: str) -> AbstractContextManager[object]:
        """A span outside any request (a policy reload, say); nothing when unexported."""
        if self._tracer is None:
            return _NULL
        return self._tracer.start_as_current_span(name)
