"""The path of one request, steps in order. Each step is one call; see README, "Life of a
request". Nothing on this path happens in middleware or callbacks.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from backends.errors import BackendError, UpstreamRejected
from backends.pool import Opened
from gateway import schema
from gateway.acceptance import Fold, Labels
from gateway.classify import classify
from gateway.errors import JSON, ApiError, from_backend, rejected
from gateway.respond import SSEResponse, cancelled_on_disconnect
from gateway.services import Services
from gateway.streaming import Relay
from policies.decide import decide
from policies.decision import Decision
from policies.features import Features

_ASSUMED_OUTPUT = 512  # tokens charged to the shadow budget when max_tokens is unset
_SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}


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
    headers = _decision_headers(services, decision, request_id)
    opened = await _open(services, decision, path, payload, request_id)  # 5 forward
    if isinstance(opened, Response):
        return opened
    headers["x-speclane-pool"] = opened.spec.name
    labels = Labels(
        model=parsed.model,
        rule=decision.rule,
        slice=decision.slice,
        pool=opened.spec.name,
        k=opened.spec.k,
        endpoint=opened.endpoint.url,
        probe=decision.probe,
        tenant=features.tenant,
        epoch=decision.epoch,
        chunk_signal=policy.pools[opened.spec.name].chunk_acceptance,
    )
    capture = _mirror(services, decision, features, payload, path, labels)
    relay = Relay(  # 6 measure, 7 feedback (on_done), 8 respond
        opened,
        Fold(labels, started),
        include_usage=parsed.include_usage,
        clock=services.clock,
        on_done=services.record,
        capture=capture,
    )
    if parsed.stream:
        return SSEResponse(relay.sse(), headers | _SSE_HEADERS, lambda: relay.finished)
    async with cancelled_on_disconnect(request.receive) as disconnect:
        answer = await relay.collect(chat=kind == "chat")
    if disconnect.gone:
        raise ApiError(499, "the client closed the connection", code="client_closed")
    return Response(orjson.dumps(answer), headers=headers, media_type=JSON)


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


async def _open(
    services: Services,
    decision: Decision,
    path: str,
    payload: dict[str, Any],
    request_id: str,
) -> Opened | Response:
    upstream_payload = payload | {"stream": True, "stream_options": {"include_usage": True}}
    body = orjson.dumps(upstream_payload)
    forward = {"content-type": JSON, "x-request-id": request_id}
    with services.telemetry.tracer.start_as_current_span("forward"):
        try:
            opened = await services.pools.open(decision.rungs, path, body, forward)
        except UpstreamRejected as exc:
            return rejected(exc)
        except BackendError as exc:
            services.telemetry.failover(decision.pool, "exhausted")
            raise from_backend(exc) from None
    services.telemetry.opened(opened.spec.name, shadow=False)
    if opened.attempts:
        services.telemetry.failover(decision.pool, "served", len(opened.attempts))
    return opened


def _decision_headers(services: Services, decision: Decision, request_id: str) -> dict[str, str]:
    if not services.settings.decision_headers:
        return {"x-request-id": request_id}
    return {
        "x-request-id": request_id,
        "x-speclane-rule": decision.rule,
        "x-speclane-slice": _ascii(decision.slice),
        "x-speclane-reason": _ascii(decision.reason),
    }


def _ascii(value: str) -> str:
    return value.encode("ascii", "replace").decode()


def _mirror(
    services: Services,
    decision: Decision,
    features: Features,
    payload: dict[str, Any],
    path: str,
    labels: Labels,
) -> asyncio.Future[str] | None:
    """Start the decision's shadow mirror, if any; a future for the canary when greedy."""
    if decision.shadow_to is None:
        return None
    greedy = features.temperature == 0 and features.n == 1
    capture = asyncio.get_running_loop().create_future() if greedy else None
    cost = features.prompt_tokens + (features.max_tokens or _ASSUMED_OUTPUT)
    if services.shadow.mirror(decision.shadow_to, path, payload, labels, cost, capture):
        return capture
    return None
