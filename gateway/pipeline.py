"""The path of one request, steps in order. Each step is one call; see README, "Life of a
request". Nothing on this path happens in middleware or callbacks.

Every API takes the same path: chat and text completions, Anthropic's Messages and
OpenAI's Responses are parsed, classified and decided alike and fail over alike. They part
at steps 6 and 8: a completions stream is relayed by ``Relay`` (which may assemble it into
a whole answer), a Messages or Responses stream event by event as it came
(``gateway/forward/events.py``), and a non-streaming Messages or Responses request always
goes upstream whole, its answer passing through.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import os
import re
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from backends.errors import AnswerTimeout, BackendError, StreamBroken, UpstreamRejected
from backends.pool import Attempt, Completed, Opened, PoolSpec
from backends.retries import BreakBudget
from gateway import schema
from gateway.classify import classify
from gateway.endpoints import APIS
from gateway.errors import (
    JSON,
    ApiError,
    UpstreamErrorEvent,
    broke,
    from_backend,
    rejected,
    response_not_found,
    shape_of,
)
from gateway.forward.events import RELAYED, EventRelay
from gateway.forward.headers import decision_headers
from gateway.forward.passthrough import one_answer, passes_through, stream_options
from gateway.forward.relay import Relay
from gateway.forward.respond import SSEResponse, cancelled_on_disconnect, cut_event
from gateway.forward.shadow import short_probe
from gateway.identity import remembered
from gateway.measure.acceptance import Fold, Labels, Status
from gateway.measure.answer import Dialect, EventDialect, Measurement
from gateway.measure.completions import COMPLETIONS
from gateway.measure.tracing import Trace
from gateway.measure.validity import Expectation, expect
from gateway.services import Services
from gateway.state.pins import pinned_endpoint
from policies.decide import decide
from policies.decision import Decision
from policies.features import Features

T = TypeVar("T", Opened, Completed)
_ASSUMED_OUTPUT = 512  # tokens charged to the shadow budget when max_tokens is unset
_SSE = "text/event-stream"
_SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
# GenAI conventions' operation names
_OPERATION = {
    "chat": "chat",
    "completion": "text_completion",
    "messages": "chat",
    "responses": "chat",
}
# the APIs relayed event by event (``gateway/forward/events.py``), and how they read
_EVENTS: dict[str, EventDialect] = {
    api.kind: RELAYED[api.path.value] for api in APIS if api.path.value in RELAYED
}
# request headers that go upstream with the request: Anthropic's API version and betas
_FORWARDED = ("anthropic-version", "anthropic-beta")


@dataclass(frozen=True, slots=True, kw_only=True)
class Ask:
    """One request after steps 1-4: what was asked, of whom, and what the policy decided;
    ``deadline`` (event-loop time) ends every try of it (``Pools.deadline``).

    ``pinned`` is the one place where a request's state overrides the policy's choice of
    pool: the base URL of the endpoint that must serve it (the one that stored the response
    a Responses request continues, ``previous_response_id``, as ``gateway/state/pins.py``
    remembers it), tried there and nowhere else (``Pools._plan``); None for every other
    request. The decision's reason then says so (``pinned: response ... on ...``).
    ``forwarded``: the client's headers that go upstream."""

    kind: schema.Kind
    parsed: schema.AnyRequest
    payload: dict[str, Any]
    features: Features
    decision: Decision
    path: str
    request_id: str
    started: float
    decided: float
    trace: Trace
    expect: Expectation | None
    deadline: float
    forwarded: Mapping[str, str]
    pinned: str | None = None


async def complete(
    services: Services, request: Request, kind: schema.Kind
) -> Response | SSEResponse:
    """Serve one request of a model API (``kind``), under its trace: the trace of a
    streamed answer ends with the stream."""
    started = services.clock()
    request_id = _request_id(request.headers.get("x-request-id"))
    trace = services.telemetry.tracing.begin(request.headers, _OPERATION[kind])
    try:
        with _boundary(request_id):
            answer = await _serve(services, request, kind, started, request_id, trace)
    except ApiError as exc:
        trace.end(exc.status, exc)
        raise
    except BaseException as exc:
        trace.end(499 if isinstance(exc, asyncio.CancelledError) else 500, exc)
        raise
    if not isinstance(answer, SSEResponse):
        trace.end(answer.status_code)
    return answer


async def _serve(
    services: Services,
    request: Request,
    kind: schema.Kind,
    started: float,
    request_id: str,
    trace: Trace,
) -> Response | SSEResponse:
    body = await _read_body(request, services.settings.max_body_bytes)  # 1 request in
    with trace.step("parse"):
        parsed, payload = schema.parse(body, kind)  # 2 parse + validate
    path: str = request.scope["path"]
    with trace.step("classify"):  # 3
        caller = remembered(request.scope) or services.identity.caller(request.headers)
        features = classify(parsed, path, request.headers, request_id, services.defaults, caller)
    policy = services.policy.current
    with trace.step("decide"):
        decision = decide(features, policy, services.flags.values, services.stats.guards, started)
    trace.decided(features, decision)
    if services.request_log is not None:  # for speclane replay --log, when asked
        services.request_log.add(services.wall(), path, payload, request.headers, features.tenant)
    if not decision.rungs:
        raise ApiError(
            status=404,
            message=f"The model `{parsed.model}` does not exist.",
            param="model",
            code="model_not_found",
        )
    pinned: str | None = None
    if kind == "responses" and payload.get("previous_response_id") is not None:
        found = await _pinned(services, payload)
        if isinstance(found, Response):
            found.headers["x-request-id"] = request_id
            return found
        pinned, holder, why = found
        decision = dataclasses.replace(decision, pool=holder, rungs=(holder,), reason=why)
    ask = Ask(
        kind=kind,
        parsed=parsed,
        payload=payload,
        features=features,
        decision=decision,
        pinned=pinned,
        path=path,
        request_id=request_id,
        started=started,
        decided=services.clock(),
        trace=trace,
        expect=None if kind in _EVENTS else expect(payload),
        deadline=services.pools.deadline(decision.rungs),
        forwarded={k: v for k in _FORWARDED if (v := request.headers.get(k)) is not None},
    )
    if kind in _EVENTS:
        if parsed.stream:
            return await _events(services, request, ask, _EVENTS[kind])
        return await _whole(services, request, ask)
    pool = policy.pools[decision.pool]
    if not parsed.stream and passes_through(decision.pool, pool, services.reports, payload):
        return await _whole(services, request, ask)
    return await _streamed(services, request, ask)


async def _pinned(services: Services, payload: dict[str, Any]) -> tuple[str, str, str] | Response:
    """Where a Responses request that continues a stored response must go (the endpoint that
    stored it, whatever its slice's rung), its pool, and why; vLLM's own 404 when the
    gateway does not know where that response is, or its endpoint has left the pools."""
    previous = payload["previous_response_id"]
    where = await pinned_endpoint(services.pins, payload)
    endpoint = services.pools.endpoint(where) if where is not None else None
    if endpoint is None:
        return response_not_found(str(previous))
    return endpoint.url, endpoint.pool, f"pinned: response {previous} on {endpoint.url}"


async def _events(
    services: Services, request: Request, ask: Ask, dialect: EventDialect
) -> Response | SSEResponse:
    """Steps 5-8 for a stream relayed event by event (``gateway/forward/events.py``)."""
    send = functools.partial(services.pools.open, events=True, pinned=ask.pinned)
    async with cancelled_on_disconnect(request.receive) as disconnect:
        opened = await _forward(services, ask, send, ask.payload, _SSE)  # 5 forward
    if disconnect.gone:
        raise _client_closed()
    if isinstance(opened, Response):
        return opened
    headers = _decision_headers(services, ask, opened.spec.name, opened.attempts)
    pool = services.policy.current.pools[opened.spec.name]
    labels = _labels(ask, opened, one_answer(ask.payload) and pool.chunk_acceptance)
    measurement = _measurement(services, ask, labels, opened.spec, _mirror(services, ask, labels))
    shape = shape_of(ask.path)
    relay = EventRelay(opened, measurement, dialect, clock=services.clock, shape=shape)
    return SSEResponse(
        relay.sse(), headers | _SSE_HEADERS, lambda: relay.finished, cut_event(shape)
    )


async def _streamed(services: Services, request: Request, ask: Ask) -> Response | SSEResponse:
    """Steps 5-8 through an upstream stream: relayed as it comes, or assembled."""
    streamed = ask.payload | {"stream": True, "stream_options": stream_options(ask.payload)}
    send = functools.partial(services.pools.open, pinned=ask.pinned)
    async with cancelled_on_disconnect(request.receive) as disconnect:
        opened = await _forward(services, ask, send, streamed, _SSE)  # 5 forward
        if not ask.parsed.stream and not isinstance(opened, Response):
            try:
                answer, opened = await _collected(services, ask, opened, streamed)
            except UpstreamRejected as exc:  # a client error the stream reported late
                services.telemetry.rejected(exc.pool, exc.status)
                opened = rejected(exc, _decision_headers(services, ask, exc.pool))
    if disconnect.gone:
        raise _client_closed()
    if isinstance(opened, Response):
        return opened
    headers = _decision_headers(services, ask, opened.spec.name, opened.attempts)
    if not ask.parsed.stream:
        return Response(orjson.dumps(answer), headers=headers, media_type=JSON)
    relay = _relay(services, ask, opened)
    return SSEResponse(relay.sse(), headers | _SSE_HEADERS, lambda: relay.finished)


def _relay(services: Services, ask: Ask, opened: Opened, *, retry: bool = False) -> Relay:
    """Steps 6 (measure), 7 (feedback) and 8 (respond) over one stream; a retry starts no
    second shadow mirror."""
    pool = services.policy.current.pools[opened.spec.name]
    labels = _labels(ask, opened, one_answer(ask.payload) and pool.chunk_acceptance)
    capture = None if retry else _mirror(services, ask, labels)
    return Relay(
        opened,
        _measurement(services, ask, labels, opened.spec, capture),
        include_usage=ask.parsed.include_usage,
        clock=services.clock,
        include_sglext=ask.payload.get("return_spec_tokens_details") is True,
    )


def _measurement(
    services: Services,
    ask: Ask,
    labels: Labels,
    spec: PoolSpec,
    capture: asyncio.Future[str] | None,
) -> Measurement:
    """Steps 6 and 7 for one answer of ``spec``'s pool, streamed or whole: checked, recorded,
    told to the trace (which a streamed answer's measurement ends), and to the canary. Only
    completions answers say whether the pool reports per-request metrics, and only
    Responses answers are stored upstream."""
    reports = spec.speculative and one_answer(ask.payload) and ask.kind not in _EVENTS
    stored = None
    if ask.kind == "responses":  # the endpoint that stored the answer, for what continues it
        stored = functools.partial(_stored, services.pins.keep, labels.endpoint)
    return Measurement(
        Fold(labels, ask.started, ask.decided),
        services.clock,
        services.checks,
        expect=ask.expect,
        trace=ask.trace,
        ends_trace=ask.parsed.stream,
        capture=capture,
        on_metrics=functools.partial(services.reports.saw, spec.name) if reports else None,
        on_response_id=stored,
    )


def _stored(hook: Callable[[str, str], None], endpoint: str, response_id: str) -> None:
    hook(response_id, endpoint)


async def _collected(
    services: Services, ask: Ask, opened: Opened, streamed: dict[str, Any]
) -> tuple[dict[str, Any], Opened]:
    """One JSON body from the stream. Nothing has reached the client yet, so a stream that
    breaks is tried again, on endpoints and rungs whose answers have not broken first,
    while the request's break budget allows."""
    budget = _break_budget(services, ask)
    try:
        return await _collected_within(services, ask, opened, streamed, budget)
    finally:
        _count_breaks(services, ask, budget)


async def _collected_within(
    services: Services, ask: Ask, opened: Opened, streamed: dict[str, Any], budget: BreakBudget
) -> tuple[dict[str, Any], Opened]:
    chat = ask.kind == "chat"
    broken: list[Attempt] = []
    retry = False
    while True:
        try:
            answer = await _relay(services, ask, opened, retry=retry).collect(chat=chat)
        except StreamBroken as exc:
            if isinstance(exc, AnswerTimeout):
                raise  # the request's time is up: no retry could finish
            broken.append(Attempt(opened.spec.name, opened.endpoint.url, str(exc)))
            if not budget.spend(opened.endpoint.url, services.clock()):
                raise broke(len(broken)) from None
        else:
            opened.attempts = (*broken, *opened.attempts)
            return answer, opened
        avoid = budget.avoid(services.pools.urls(ask.decision.rungs))
        again = functools.partial(services.pools.open, avoid=avoid, pinned=ask.pinned)
        retried = await _forward(services, ask, again, streamed, _SSE)
        if isinstance(retried, Response):
            raise broke(len(broken))
        opened, retry = retried, True


def _break_budget(services: Services, ask: Ask) -> BreakBudget:
    settings = services.settings
    return BreakBudget(settings.break_retries, ask.started + settings.break_retry_window_s)


def _count_breaks(services: Services, ask: Ask, budget: BreakBudget) -> None:
    for _ in range(budget.spent):
        services.telemetry.failover(ask.decision.pool, "retried_after_break")
    if len(budget.broke) > budget.spent:
        services.telemetry.failover(ask.decision.pool, "exhausted_after_break")


async def _whole(services: Services, request: Request, ask: Ask) -> Response:
    """Steps 5-8 for a pool that takes non-streaming requests non-streaming: the answer
    passes through untouched; its usage and vLLM metrics are the measurement, the same as a
    stream's. The answers of Messages and Responses requests are read in their own
    dialect."""
    done: Completed | Response | None = None
    async with cancelled_on_disconnect(request.receive):
        budget = _break_budget(services, ask)
        complete = functools.partial(services.pools.complete, budget=budget, pinned=ask.pinned)
        try:
            done = await _forward(services, ask, complete, ask.payload, JSON)
        finally:
            _count_breaks(services, ask, budget)
    if done is None:
        raise _client_closed()
    if isinstance(done, Response):
        return done
    labels = _labels(ask, done, chunks=False)
    dialect: Dialect = _EVENTS.get(ask.kind, COMPLETIONS)
    measurement = _measurement(services, ask, labels, done.spec, _mirror(services, ask, labels))
    dialect.whole(measurement, done.answer)
    measurement.finish(Status.OK)
    headers = _decision_headers(services, ask, done.spec.name, done.attempts)
    return Response(done.body, headers=headers, media_type=JSON)


def _labels(ask: Ask, served: Opened | Completed, chunks: bool) -> Labels:
    return Labels(
        model=ask.parsed.model,
        rule=ask.decision.rule,
        slice=ask.decision.slice,
        pool=served.spec.name,
        k=served.spec.k,
        endpoint=served.endpoint.url,
        engine=served.spec.engine,
        probe=ask.decision.probe,
        tenant=ask.features.tenant,
        epoch=ask.decision.epoch,
        chunk_signal=chunks,
        arm=ask.decision.arm,
        request_id=ask.request_id,
        route=ask.path,
    )


@contextmanager
def _boundary(request_id: str) -> Iterator[None]:
    """The one boundary of the request path: a typed failure that nothing more will be tried
    for becomes the client's ``ApiError`` here, and the gateway's own error answers carry the
    request id too, like every other answer."""
    try:
        yield
    except (BackendError, UpstreamErrorEvent) as exc:
        error = from_backend(exc)
        error.headers = {"x-request-id": request_id}
        raise error from None
    except ApiError as exc:
        exc.headers = {"x-request-id": request_id, **(exc.headers or {})}
        raise


def _request_id(given: str | None) -> str:
    """The client's ``x-request-id`` when it is a short token, else a new one: it is echoed
    and sent upstream, so it must not carry anything else."""
    if given is not None and _REQUEST_ID.fullmatch(given):
        return given
    return os.urandom(12).hex()


def _client_closed() -> ApiError:
    return ApiError(status=499, message="the client closed the connection", code="client_closed")


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length") or ""
    if declared.isascii() and declared.isdigit() and (len(declared) > 18 or int(declared) > limit):
        raise _too_large(limit)
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise _too_large(limit)
            chunks.append(chunk)
    except ClientDisconnect:  # hung up mid-body: nothing to answer, nothing to log
        raise _client_closed() from None
    return b"".join(chunks)


def _too_large(limit: int) -> ApiError:
    return ApiError(
        status=413, message=f"the body is larger than {limit} bytes", code="request_too_large"
    )


Body = bytes | Callable[[PoolSpec], bytes]
Send = Callable[[Sequence[str], str, Body, Mapping[str, str], float], Awaitable[T]]


async def _forward(
    services: Services, ask: Ask, send: Send[T], payload: dict[str, Any], accept: str
) -> T | Response:
    """Step 5 through ``Pools.open`` or ``Pools.complete``, by the request's deadline:
    failover happens inside; a 4xx comes back as the client's answer, exhausted rungs as a
    502, 503 or 504 (a 429 when every upstream asked to wait)."""
    body = orjson.dumps(payload)
    forward = {
        "content-type": JSON,
        "accept": accept,
        "x-request-id": ask.request_id,
        **ask.forwarded,
    }
    with ask.trace.step("forward"):
        ask.trace.inject(forward)
        try:
            rungs, engine_body = ask.decision.rungs, _per_engine(body, payload)
            result = await send(rungs, ask.path, engine_body, forward, ask.deadline)
        except UpstreamRejected as exc:
            services.telemetry.rejected(exc.pool or ask.decision.pool, exc.status)
            headers = _decision_headers(services, ask, exc.pool or ask.decision.pool)
            return rejected(exc, headers, shape_of(ask.path))
        except BackendError as exc:
            services.telemetry.failover(ask.decision.pool, "exhausted", "none")
            error = from_backend(exc)
            error.headers = _decision_headers(services, ask, ask.decision.pool)
            raise error from None
    services.telemetry.opened(result.spec.name, shadow=False)
    # a stream's first event comes once its prompt is prefilled; a whole answer's, later
    services.feedback.prefilled(result.endpoint.url, ask.features.prompt_tokens, services.clock())
    for attempt in result.attempts:
        services.telemetry.upstream_failure(attempt.pool)
    if result.attempts or result.spec.name != ask.decision.pool:
        services.telemetry.failover(ask.decision.pool, "served", result.spec.name)
    return result


def _per_engine(body: bytes, payload: dict[str, Any]) -> Callable[[PoolSpec], bytes]:
    """The upstream body for a pool: SGLang streams its per-request speculative counts only
    when asked (``return_spec_tokens_details``), a field other engines may refuse."""
    asked: list[bytes] = []

    def for_pool(spec: PoolSpec) -> bytes:
        if spec.engine != "sglang" or not spec.speculative or not payload.get("stream"):
            return body
        if not asked:
            asked.append(orjson.dumps(payload | {"return_spec_tokens_details": True}))
        return asked[0]

    return for_pool


def _decision_headers(
    services: Services, ask: Ask, pool: str, attempts: Sequence[Attempt] = ()
) -> dict[str, str]:
    decision = ask.decision if services.settings.decision_headers else None
    return decision_headers(ask.request_id, decision, pool, attempts)


def _mirror(services: Services, ask: Ask, labels: Labels) -> asyncio.Future[str] | None:
    """Start the decision's shadow mirror, if any; a future for the canary when greedy (the
    canary compares chat and completions answers)."""
    target = ask.decision.shadow_to
    if target is None:
        return None
    features, short = ask.features, ask.decision.shadow_tokens
    greedy = features.temperature == 0 and features.n == 1 and short is None
    greedy = greedy and ask.kind not in _EVENTS
    capture = asyncio.get_running_loop().create_future() if greedy else None
    cost = features.prompt_tokens + (short or features.max_tokens or _ASSUMED_OUTPUT)
    payload = ask.payload if short is None else short_probe(ask.payload, ask.path, short)
    prompt = features.prompt_tokens
    # a mirror is streamed: its chunks count where its pool's do, whatever the answer was
    pool = services.policy.current.pools.get(target)
    chunks = pool is not None and pool.chunk_acceptance and one_answer(ask.payload)
    mirrored = dataclasses.replace(labels, chunk_signal=chunks)
    if services.shadow.mirror(target, ask.path, payload, mirrored, cost, capture, prompt):
        return capture
    return None
