"""The path of one request, steps in order. Each step is one call; see README, "Life of a
request". Nothing on this path happens in middleware or callbacks.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson
from starlette.requests import Request
from starlette.responses import Response

from backends.errors import BackendError, UpstreamRejected
from backends.pool import Completed, Opened
from gateway import schema
from gateway.acceptance import Fold, Labels, Status
from gateway.classify import classify
from gateway.errors import JSON, ApiError, from_backend, rejected
from gateway.respond import SSEResponse, cancelled_on_disconnect
from gateway.services import Services
from gateway.shadow import answer_text
from gateway.streaming import Relay
from policies.decide import decide
from policies.decision import Decision
from policies.features import Features

T = TypeVar("T", Opened, Completed)
_ASSUMED_OUTPUT = 512  # tokens charged to the shadow budget when max_tokens is unset
_SSE = "text/event-stream"
_SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


@dataclass(frozen=True, slots=True)
class Ask:
    """One request after steps 1-4: what was asked, of whom, and what the policy decided."""

    kind: schema.Kind
    parsed: schema.AnyRequest
    payload: dict[str, Any]
    features: Features
    decision: Decision
    path: str
    request_id: str
    started: float


async def complete(
    services: Services, request: Request, kind: schema.Kind
) -> Response | SSEResponse:
    """Serve one chat or completions request."""
    started = services.clock()
    tracer = services.telemetry.tracer
    body = await _read_body(request, services.settings.max_body_bytes)  # 1 request in
    with tracer.start_as_current_span("parse"):
        parsed, payload = schema.parse(body, kind)  # 2 parse + validate
    request_id = request.headers.get("x-request-id") or os.urandom(12).hex()
    path: str = request.scope["path"]
    with tracer.start_as_current_span("classify"):
        features = classify(parsed, path, request.headers, request_id, services.defaults)  # 3
    policy = services.policy.current
    with tracer.start_as_current_span("decide"):
        decision = decide(features, policy, services.flags.values, services.stats.guards, started)
    if not decision.rungs:
        raise ApiError(
            404,
            f"The model `{parsed.model}` does not exist.",
            param="model",
            code="model_not_found",
        )
    ask = Ask(kind, parsed, payload, features, decision, path, request_id, started)
    if not parsed.stream and policy.pools[decision.pool].passthrough_non_streaming:
        return await _whole(services, request, ask)
    return await _streamed(services, request, ask)


async def _streamed(services: Services, request: Request, ask: Ask) -> Response | SSEResponse:
    """Steps 5-8 through an upstream stream: relayed as it comes, or assembled."""
    streamed = ask.payload | {"stream": True, "stream_options": {"include_usage": True}}
    opened = await _forward(services, ask, services.pools.open, streamed, _SSE)  # 5 forward
    if isinstance(opened, Response):
        return opened
    headers = _decision_headers(services, ask, opened.spec.name)
    chunks = services.policy.current.pools[opened.spec.name].chunk_acceptance
    labels = _labels(ask, opened.spec.name, opened.spec.k, opened.endpoint.url, chunks)
    capture = _mirror(services, ask, labels)
    relay = Relay(  # 6 measure, 7 feedback (on_done), 8 respond
        opened,
        Fold(labels, ask.started),
        include_usage=ask.parsed.include_usage,
        clock=services.clock,
        on_done=services.record,
        capture=capture,
    )
    if ask.parsed.stream:
        return SSEResponse(relay.sse(), headers | _SSE_HEADERS, lambda: relay.finished)
    async with cancelled_on_disconnect(request.receive) as disconnect:
        answer = await relay.collect(chat=ask.kind == "chat")
    if disconnect.gone:
        raise _client_closed()
    return Response(orjson.dumps(answer), headers=headers, media_type=JSON)


async def _whole(services: Services, request: Request, ask: Ask) -> Response:
    """Steps 5-8 for a pool that takes non-streaming requests non-streaming: the answer
    passes through untouched; its usage and vLLM metrics are the measurement."""
    done: Completed | Response | None = None
    async with cancelled_on_disconnect(request.receive):
        done = await _forward(services, ask, services.pools.complete, ask.payload, JSON)
    if done is None:
        raise _client_closed()
    if isinstance(done, Response):
        return done
    labels = _labels(ask, done.spec.name, done.spec.k, done.endpoint.url, chunks=False)
    capture = _mirror(services, ask, labels)
    fold = Fold(labels, ask.started)
    answer = _json_object(done.body)
    fold.usage(answer.get("usage") or {}, answer.get("metrics"))
    services.record(fold.finish(Status.OK, services.clock()))
    if capture is not None:
        capture.set_result(answer_text(answer))
    headers = _decision_headers(services, ask, done.spec.name)
    return Response(done.body, headers=headers, media_type=JSON)


def _json_object(body: bytes) -> dict[str, Any]:
    try:
        answer = orjson.loads(body)
    except orjson.JSONDecodeError:
        return {}
    return answer if isinstance(answer, dict) else {}


def _labels(ask: Ask, pool: str, k: int | None, endpoint: str, chunks: bool) -> Labels:
    return Labels(
        model=ask.parsed.model,
        rule=ask.decision.rule,
        slice=ask.decision.slice,
        pool=pool,
        k=k,
        endpoint=endpoint,
        probe=ask.decision.probe,
        tenant=ask.features.tenant,
        epoch=ask.decision.epoch,
        chunk_signal=chunks,
    )


def _client_closed() -> ApiError:
    return ApiError(499, "the client closed the connection", code="client_closed")


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise _too_large(limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(limit: int) -> ApiError:
    return ApiError(413, f"the body is larger than {limit} bytes", code="request_too_large")


Send = Callable[[Sequence[str], str, bytes, Mapping[str, str]], Awaitable[T]]


async def _forward(
    services: Services, ask: Ask, send: Send[T], payload: dict[str, Any], accept: str
) -> T | Response:
    """Step 5 through ``Pools.open`` or ``Pools.complete``: failover happens inside; a 4xx
    comes back as the client's answer, exhausted rungs as a 503 or 504."""
    body = orjson.dumps(payload)
    forward = {"content-type": JSON, "accept": accept, "x-request-id": ask.request_id}
    with services.telemetry.tracer.start_as_current_span("forward"):
        try:
            result = await send(ask.decision.rungs, ask.path, body, forward)
        except UpstreamRejected as exc:
            return rejected(exc)
        except BackendError as exc:
            services.telemetry.failover(ask.decision.pool, "exhausted")
            raise from_backend(exc) from None
    services.telemetry.opened(result.spec.name, shadow=False)
    if result.attempts:
        services.telemetry.failover(ask.decision.pool, "served", len(result.attempts))
    return result


def _decision_headers(services: Services, ask: Ask, pool: str) -> dict[str, str]:
    if not services.settings.decision_headers:
        return {"x-request-id": ask.request_id}
    decision = ask.decision
    return {
        "x-request-id": ask.request_id,
        "x-speclane-rule": decision.rule,
        "x-speclane-slice": _ascii(decision.slice),
        "x-speclane-pool": pool,
        "x-speclane-reason": _ascii(decision.reason),
    }


def _ascii(value: str) -> str:
    return value.encode("ascii", "replace").decode()


def _mirror(services: Services, ask: Ask, labels: Labels) -> asyncio.Future[str] | None:
    """Start the decision's shadow mirror, if any; a future for the canary when greedy."""
    target = ask.decision.shadow_to
    if target is None:
        return None
    features = ask.features
    greedy = features.temperature == 0 and features.n == 1
    capture = asyncio.get_running_loop().create_future() if greedy else None
    cost = features.prompt_tokens + (features.max_tokens or _ASSUMED_OUTPUT)
    if services.shadow.mirror(target, ask.path, ask.payload, labels, cost, capture):
        return capture
    return None
