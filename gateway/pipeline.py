"""The path of one request, steps in order; see README, "Life of a request". Nothing on
this path happens in middleware. Steps 1-5 are calls made here, one after another. Steps 6-8
of a stream run as the client reads it, inside the relay's generator. Step 7 (feedback) runs
through callbacks of the ``Measurement`` each answer gets: its ``finish`` records the
outcome through the checks into ``Feedback.record`` (an answer too large to check inline is
checked in a task of its own, and recorded when that ends), and its ``on_reported`` and
``on_response_id`` hooks tell the pool's metric reports and the Responses pins.
``_measurement`` is the one place those callbacks are chosen.

Every API takes the same path: chat and text completions, Anthropic's Messages and
OpenAI's Responses are parsed, classified and decided alike and fail over alike. What
differs is its ``Api``'s (``gateway/apis/``): the model that parses its body, the dialect
that reads its answers and says how ``Relay`` passes its stream on (chunk by chunk, or
event by event as it came), whether a whole answer may be assembled from a stream (else a
non-streaming request always goes upstream whole, its answer passing through), and
whether its answers are stored upstream.

A non-streaming client gets one whole answer from ``Pools.complete``, the one way to it:
passed through as the pool answered, or asked for as a stream and relayed into one body
(``_assembler``: the pools call it for each try, so a break part way is retried there, as
a body's is). ``_boundary`` is the one place where a failure becomes the client's answer,
once nothing more will be tried: an upstream's 4xx passed on, anything else an
``ApiError``. Past a stream's first byte the relay ends it with a final error event
instead.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import itertools
import os
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import orjson
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from backends.errors import BackendError, UpstreamRejected
from backends.placement import Affinity
from backends.pool import Assemble, Attempt, Completed, Opened, PoolSpec
from backends.retries import BreakBudget
from gateway import schema
from gateway.apis import Api
from gateway.classify import classify
from gateway.errors import (
    JSON,
    ApiError,
    UpstreamErrorEvent,
    from_backend,
    rejected,
    response_not_found,
    unknown_model,
)
from gateway.forward.affinity import affinity_of, prices, unplaced
from gateway.forward.headers import decision_headers
from gateway.forward.moving import keep_or_move
from gateway.forward.passthrough import one_answer, passes_through, stream_options
from gateway.forward.relay import Relay
from gateway.forward.respond import SSEResponse, cancelled_on_disconnect, cut_event
from gateway.forward.shadow import short_probe
from gateway.identity import remembered
from gateway.measure.acceptance import Fold, Labels, Status
from gateway.measure.answer import Measurement
from gateway.measure.tracing import Trace
from gateway.measure.validity import Expectation, expect
from gateway.services import Services
from gateway.state.pins import pinned_endpoint
from policies.decide import decide
from policies.decision import Decision
from policies.features import Features

T = TypeVar("T", Opened, Completed)
A = TypeVar("A")
_ASSUMED_OUTPUT = 512  # tokens charged to the shadow budget when max_tokens is unset
_SSE = "text/event-stream"
_SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
# request headers that go upstream with the request: Anthropic's API version and betas
_FORWARDED = ("anthropic-version", "anthropic-beta")
_STORED_ID = "request_id"  # vLLM's and SGLang's: the id a stored Responses answer is kept under


@dataclass(frozen=True, slots=True, kw_only=True)
class Ask:
    """One request after steps 1-4: what was asked (of ``api``), of whom, and what the policy
    decided; ``deadline`` (event-loop time) ends every try of it (``Pools.deadline``).

    ``pinned`` is the one place where a request's state overrides the policy's choice of
    pool: the base URL of the endpoint that must serve it (the one that stored the response
    a Responses request continues, ``previous_response_id``, as ``gateway/state/pins.py``
    remembers it), tried there and nowhere else (``Pools._plan``); None for every other
    request. The decision's reason then says so (``pinned: response ... on ...``).
    ``forwarded``: the client's headers that go upstream. ``affinity``: what places the
    request on the endpoint of a pool that holds its prompt's prefix (``_affinity``); None
    for a pinned request, or with ``SPECLANE_PREFIX_AFFINITY`` off."""

    api: Api
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
    affinity: Affinity | None = None


async def complete(services: Services, request: Request, api: Api) -> Response | SSEResponse:
    """Serve one request of a model API, under its trace: the trace of a streamed answer
    ends with the stream."""
    started = services.clock()
    request_id = _request_id(request.headers.get("x-request-id"))
    trace = services.telemetry.tracing.begin(request.headers, api.operation)
    try:
        asked = await _boundary(
            services, request_id, None, _ask(services, request, api, started, request_id, trace)
        )
        if isinstance(asked, Ask):  # steps 1-4 done; 5-8 within the boundary, knowing them
            answer = await _boundary(services, request_id, asked, _answer(services, request, asked))
        else:
            answer = asked
    except ApiError as exc:
        trace.end(exc.status, exc)
        raise
    except BaseException as exc:
        trace.end(499 if isinstance(exc, asyncio.CancelledError) else 500, exc)
        raise
    if not isinstance(answer, SSEResponse):
        trace.end(answer.status_code)
    return answer


async def _ask(
    services: Services,
    request: Request,
    api: Api,
    started: float,
    request_id: str,
    trace: Trace,
) -> Ask | Response:
    """Steps 1-4: what is asked, and of whom; or the answer when that is already known (a
    stored response the gateway cannot place)."""
    schema.json_only(request.headers.get("content-type", ""))
    body = await _read_body(request, services.settings.max_body_bytes)  # 1 request in
    with trace.step("parse"):
        parsed, payload = schema.parse(body, api.model)  # 2 parse + validate
    if api.stores:  # the engine names the stored answer: an id a client picks may be another's
        payload.pop(_STORED_ID, None)
    path: str = request.scope["path"]
    policy = services.policy.current
    with trace.step("classify"):  # 3
        caller = remembered(request.scope) or services.identity.caller(request.headers)
        defaults = services.defaults.under(policy.file.defaults)
        features = classify(parsed, path, request.headers, request_id, defaults, caller)
        if features.api != api.name:  # an API registered beside the built-in ones
            features = dataclasses.replace(features, api=api.name)
    with trace.step("decide"):
        decision = decide(
            features,
            policy,
            services.flags.values,
            services.stats.guards,
            started,
            services.stats.splits,
        )
    trace.decided(features, decision)
    if services.request_log is not None:  # for speclane replay --log, when asked
        services.request_log.add(services.wall(), path, payload, request.headers, features.tenant)
    if not decision.rungs:
        raise unknown_model(parsed.model, policy.ladders)
    pinned: str | None = None
    if api.stores and payload.get("previous_response_id") is not None:
        found = await _pinned(services, features.tenant, payload)
        if isinstance(found, Response):
            found.headers["x-request-id"] = request_id
            return found
        pinned, holder, why = found
        # no mirror either: no other endpoint holds the response it continues (a 404)
        decision = dataclasses.replace(
            decision, pool=holder, rungs=(holder,), reason=why, shadow_to=None, shadow_tokens=None
        )
    affinity = None if pinned is not None else await _affinity(services, features, decision)
    if affinity is not None:
        decision = _moving(services, features, decision, affinity)
    return Ask(
        api=api,
        parsed=parsed,
        payload=payload,
        features=features,
        decision=decision,
        pinned=pinned,
        affinity=affinity,
        path=path,
        request_id=request_id,
        started=started,
        decided=services.clock(),
        trace=trace,
        expect=None if api.events else expect(payload),
        deadline=services.pools.deadline(decision.rungs),
        forwarded={k: v for k in _FORWARDED if (v := request.headers.get(k)) is not None},
    )


async def _answer(services: Services, request: Request, ask: Ask) -> Response | SSEResponse:
    """Steps 5-8, by how the client and the pool take the answer: a stream relayed as it
    comes, or one whole answer, passed through or assembled from a stream."""
    if ask.parsed.stream:
        return await _streamed(services, request, ask)
    pool = services.policy.current.pools[ask.decision.pool]
    whole = ask.api.assemble is None or passes_through(
        ask.decision.pool, pool, services.reports, ask.payload, services.engines
    )
    return await _whole(services, request, ask, assembled=not whole)


async def _affinity(services: Services, features: Features, decision: Decision) -> Affinity | None:
    """Which endpoints hold how much of the request's prompt, as the prefix map knows, and
    the prices that weigh their load against re-prefilling it elsewhere."""
    if not services.settings.prefix_affinity:
        return None
    epsilon = services.settings.prefix_load_epsilon
    short = unplaced(features, epsilon)
    if short is not None:  # under one block: placed by its opening alone, nothing looked up
        return short
    held, opened = await services.prefixes.held(features.prompt.chain, features.prompt.opening)
    per_turn = services.feedback.conversations.tokens_per_turn(decision.slice)
    costs = prices(services.stats.views, per_turn, decision.slice, services.wall())
    return affinity_of(features, held, opened, epsilon, costs)


def _moving(
    services: Services, features: Features, decision: Decision, affinity: Affinity
) -> Decision:
    """The decision, kept where the request's conversation is cached when moving it to its
    slice's rung costs more than it saves (``gateway/forward/moving.py``)."""
    conversations = services.feedback.conversations
    views, now = services.stats.views, services.wall()
    conversations.saw(decision.slice, features.prompt.opening, features.prompt.turn, now)
    moved, how, held_on = keep_or_move(
        decision, features, affinity, services.pools, views, conversations, now, services.load.kept
    )
    if how is not None:
        services.telemetry.moved(held_on, decision.pool, how)
    return moved


async def _pinned(
    services: Services, tenant: str, payload: dict[str, Any]
) -> tuple[str, str, str] | Response:
    """Where a Responses request that continues a stored response must go (the endpoint that
    stored it, whatever its slice's rung), its pool, and why; vLLM's own 404 when the
    gateway does not know that response as ``tenant``'s, or its endpoint has left the
    pools."""
    previous = payload["previous_response_id"]
    where = await pinned_endpoint(services.pins, tenant, payload)
    endpoint = services.pools.endpoint(where) if where is not None else None
    if endpoint is None:
        return response_not_found(str(previous))
    return endpoint.url, endpoint.pool, f"pinned: response {previous} on {endpoint.url}"


async def _streamed(services: Services, request: Request, ask: Ask) -> Response | SSEResponse:
    """Steps 5-8 for a streaming client: relayed as it comes."""
    send = functools.partial(
        services.pools.open, opening=ask.api.opening, pinned=ask.pinned, affinity=ask.affinity
    )
    async with cancelled_on_disconnect(request.receive) as disconnect:
        opened = await _forward(services, ask, send, _streaming(ask), _SSE)  # 5 forward
    if disconnect.gone:
        raise _client_closed()
    headers = _decision_headers(services, ask, opened.spec.name, opened.attempts)
    relay = _relay(services, ask, opened)
    shape = ask.api.shape
    return SSEResponse(
        relay.sse(), headers | _SSE_HEADERS, lambda: relay.finished, cut_event(shape)
    )


async def _whole(services: Services, request: Request, ask: Ask, *, assembled: bool) -> Response:
    """Steps 5-8 for a non-streaming client: one whole answer from ``Pools.complete``, which
    tries it again while the request's break budget allows if it breaks part way (nothing
    of it has reached the client). ``assembled``: asked for as a stream, relayed into one
    body (``_assembler``: each try measured as it comes); else asked for whole and passed
    through untouched, its usage and vLLM metrics the measurement, the same as a stream's,
    read in its API's dialect."""
    budget = _break_budget(services, ask)
    payload, accept, assemble = ask.payload, JSON, None
    if assembled:
        payload, accept, assemble = _streaming(ask), _SSE, _assembler(services, ask)
    complete = functools.partial(
        services.pools.complete,
        budget=budget,
        assemble=assemble,
        pinned=ask.pinned,
        affinity=ask.affinity,
    )
    done: Completed | None = None
    async with cancelled_on_disconnect(request.receive):
        try:
            done = await _forward(services, ask, complete, payload, accept)  # 5 forward
        finally:
            _count_breaks(services, ask, budget)
    if done is None:
        raise _client_closed()
    if not assembled:
        labels = _labels(ask, done, chunks=False)
        capture = _mirror(services, ask, labels)
        measurement = _measurement(services, ask, labels, done.spec, capture)
        ask.api.dialect.whole(measurement, done.answer)
        measurement.finish(Status.OK)
    headers = _decision_headers(services, ask, done.spec.name, done.attempts)
    return Response(done.body, headers=headers, media_type=JSON)


def _assembler(services: Services, ask: Ask) -> Assemble:
    """How ``Pools.complete`` folds each stream it opens into one answer: relayed and
    measured (steps 6 and 7) like a streamed answer; only the first try starts a shadow
    mirror."""
    tries = itertools.count()

    async def assemble(opened: Opened) -> dict[str, Any]:
        relay = _relay(services, ask, opened, retry=next(tries) > 0)
        return await relay.collect(chat=ask.api.assemble == "chat")

    return assemble


def _streaming(ask: Ask) -> dict[str, Any]:
    """The body that asks upstream for a stream: a chunk stream's usage is asked for
    always (the relay drops it when the client did not ask)."""
    if ask.api.events:
        return ask.payload
    return ask.payload | {"stream": True, "stream_options": stream_options(ask.payload)}


def _relay(services: Services, ask: Ask, opened: Opened, *, retry: bool = False) -> Relay:
    """Steps 6 (measure), 7 (feedback) and 8 (respond) over one stream, in its API's
    dialect; a retry starts no second shadow mirror."""
    pool = services.policy.current.pools[opened.spec.name]
    labels = _labels(ask, opened, one_answer(ask.payload) and pool.chunk_acceptance)
    capture = None if retry else _mirror(services, ask, labels)
    return Relay(
        opened,
        _measurement(services, ask, labels, opened.spec, capture),
        ask.api.dialect,
        clock=services.clock,
        shape=ask.api.shape,
        include_usage=ask.parsed.include_usage,
        own_asked=services.engines.of(opened.spec.engine).asked_by(ask.payload),
    )


def _measurement(
    services: Services,
    ask: Ask,
    labels: Labels,
    spec: PoolSpec,
    capture: asyncio.Future[str] | None,
) -> Measurement:
    """Steps 6 and 7 for one answer of ``spec``'s pool, streamed or whole, from now (its
    first event, or the whole answer): in flight until it finishes, its prompt prefilled
    by now (a whole answer's, later); checked, recorded, told to the trace (which a
    streamed answer's measurement ends), and to the canary. Only completions answers say
    whether the pool reports its speculation per request, and only Responses answers are
    stored upstream."""
    services.telemetry.opened(spec.name, shadow=False)
    computed = ask.affinity.uncached(labels.endpoint) if ask.affinity is not None else None
    services.feedback.prefilled(
        labels.endpoint, ask.features.prompt_tokens, services.clock(), ask.request_id, computed
    )
    reports = spec.speculative and one_answer(ask.payload) and not ask.api.events
    stored = None
    if ask.api.stores:  # the endpoint that stored the answer, for what continues it
        tenant = ask.features.tenant  # only this tenant may name it later
        stored = functools.partial(services.pins.keep, tenant, endpoint=labels.endpoint)
    return Measurement(
        Fold(labels, ask.started, ask.decided),
        services.clock,
        services.checks,
        expect=ask.expect,
        trace=ask.trace,
        ends_trace=ask.parsed.stream,
        capture=capture,
        on_reported=functools.partial(services.reports.saw, spec.name) if reports else None,
        on_response_id=stored,
        engine=services.engines.of(spec.engine),
    )


def _break_budget(services: Services, ask: Ask) -> BreakBudget:
    settings = services.settings
    return BreakBudget(settings.break_retries, ask.started + settings.break_retry_window_s)


def _count_breaks(services: Services, ask: Ask, budget: BreakBudget) -> None:
    for _ in range(budget.spent):
        services.telemetry.failover(ask.decision.pool, "retried_after_break")
    if budget.ran_out:
        services.telemetry.failover(ask.decision.pool, "exhausted_after_break")


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
        parent=ask.decision.parent,
        candidates=ask.decision.candidates,
    )


async def _boundary(
    services: Services, request_id: str, ask: Ask | None, steps: Awaitable[A]
) -> A | Response:
    """The one boundary of the request path, around ``steps`` (of ``ask``, once there is
    one): a typed failure that nothing more will be tried for becomes the client's answer
    here, and only here. An upstream's 4xx (at once, or reported late by the stream an
    answer was assembled from) is passed on (``rejected``), in the shape of the API asked;
    any other failure becomes an ``ApiError`` (``from_backend``), one that ended a decided
    request (``Pools`` gave up on it) counted as ``exhausted``. The gateway's own error
    answers carry the request id too, like every other answer, and the decision's headers
    once there is one."""
    try:
        return await steps
    except UpstreamRejected as exc:
        assert ask is not None, "only a forwarded request has an upstream's answer"
        pool = exc.pool or ask.decision.pool
        services.telemetry.rejected(pool, exc.status)
        return rejected(exc, _decision_headers(services, ask, pool), ask.api.shape)
    except (BackendError, UpstreamErrorEvent) as exc:
        error = from_backend(exc)
        error.headers = {"x-request-id": request_id}
        if ask is not None:
            if isinstance(exc, BackendError):
                services.telemetry.failover(ask.decision.pool, "exhausted", "none")
            error.headers = _decision_headers(services, ask, ask.decision.pool)
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
) -> T:
    """Step 5 through ``Pools.open`` or ``Pools.complete``, by the request's deadline:
    failover, and a whole answer's retries after breaks, happen inside; what they end with
    when nothing served is for ``_boundary`` to answer."""
    body = orjson.dumps(payload)
    forward = {
        "content-type": JSON,
        "accept": accept,
        "x-request-id": ask.request_id,
        **ask.forwarded,
    }
    with ask.trace.step("forward"):
        ask.trace.inject(forward)
        rungs, engine_body = ask.decision.rungs, _per_engine(services, body, payload)
        result = await send(rungs, ask.path, engine_body, forward, ask.deadline)
    if result.placed is not None:
        services.telemetry.placed(result.spec.name, result.placed)
    prompt = ask.features.prompt
    if ask.affinity is not None and prompt.chain:  # where it went, for the turns that follow
        services.prefixes.keep(prompt.chain, prompt.opening, result.endpoint.url)
    for attempt in result.attempts:
        services.telemetry.upstream_failure(attempt.pool)
    if result.attempts or result.spec.name != ask.decision.pool:
        services.telemetry.failover(ask.decision.pool, "served", result.spec.name)
    return result


def _per_engine(
    services: Services, body: bytes, payload: dict[str, Any]
) -> Callable[[PoolSpec], bytes]:
    """The upstream body for a pool: a stream to a speculative pool carries the fields its
    engine needs to say its per-request figures (``Engine.asks``), fields other engines
    may refuse."""
    asked: dict[str, bytes] = {}

    def for_pool(spec: PoolSpec) -> bytes:
        engine = services.engines.of(spec.engine)
        if not engine.asks or not spec.speculative or not payload.get("stream"):
            return body
        if engine.name not in asked:
            asked[engine.name] = orjson.dumps(payload | dict(engine.asks))
        return asked[engine.name]

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
    greedy = greedy and not ask.api.events
    capture = asyncio.get_running_loop().create_future() if greedy else None
    cost = features.prompt_tokens + (short or features.max_tokens or _ASSUMED_OUTPUT)
    payload = ask.payload if short is None else short_probe(ask.payload, ask.api.limit, short)
    prompt = features.prompt_tokens
    # a mirror is streamed: its chunks count where its pool's do, whatever the answer was
    pool = services.policy.current.pools.get(target)
    chunks = pool is not None and pool.chunk_acceptance and one_answer(ask.payload)
    mirrored = dataclasses.replace(labels, chunk_signal=chunks)
    if services.shadow.mirror(
        target, ask.api, payload, mirrored, cost, capture, prompt, ask.affinity
    ):
        return capture
    return None
