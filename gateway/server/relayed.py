"""What the gateway relays without deciding: the engine's other routes, and the Responses API
calls that name a stored response.

- **Other routes** (``OTHER_ROUTES``, ``GET /v1/models/{id}`` and ``GET /version``) go to
  the model's pools: the model is the JSON body's ``model``, a multipart body's ``model``
  field, or the path's id (a gateway of one model takes a request that names none). They go
  first to the model's passthrough pool (the policy's ``passthrough_pool``, by default the
  ladder's last rung), then to the rest of its ladder from the bottom up, with the failover
  and outlier ejection of every request (``Pools.exchange``). A model no ladder serves gets
  the gateway's 404. ``/version`` names no model: it goes to the first model's pools.
- **The model list** (``GET /v1/models``) asks each model's pools the same way for their
  list and shows the model's card as they list it (vLLM's ``owned_by``, ``root``,
  ``max_model_len``, ``permission``), or a short card of the gateway's own where none does
  within ``LIST_WAIT_S``: a list that probes and clients read is never held by a stalled pool.
- **Stored responses** (``GET``/``DELETE /v1/responses/{id}``,
  ``POST /v1/responses/{id}/cancel``) go to the endpoint that answered the response, as
  ``gateway/state/pins.py`` remembers it, and nowhere else: only that server holds it. Only
  the tenant that stored it may name it: an id the gateway does not know as the caller's
  (another tenant's, or none), or whose endpoint left the pools, gets vLLM's own 404 for an
  unknown id, the same bytes whichever it was; an endpoint that does not answer, the
  gateway's 503.

Each is admitted by the gate (API key, places in flight), read within ``max_body_bytes``,
traced, answered with the upstream's own status, content type and bytes, with
``x-speclane-pool`` and ``x-speclane-reason`` (why it went there), and counted in
``speclane_requests_total`` (rule ``passthrough`` or ``pinned``, ``endpoint`` the route).
No guardrail judges them: they generate nothing to measure. A success that is not a JSON
object (an HTML page from a proxy) is no answer on a route that answers JSON, which is every
one but audio's (text, SRT or VTT there): it fails over as a 5xx does, and when nothing
else answers the client gets the gateway's 502, as on chat. The gateway's own errors are
OpenAI-shaped, Anthropic-shaped on ``/v1/messages/count_tokens``, where an upstream's 4xx
takes Anthropic's shape too.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import orjson
from starlette.requests import Request
from starlette.responses import Response

from backends.errors import BackendError
from backends.pool import Attempt, Exchanged
from gateway.apis import shape_of
from gateway.errors import (
    JSON,
    ApiError,
    anthropic_rejected,
    bad_request,
    from_backend,
    response_not_found,
    unknown_model,
)
from gateway.forward.headers import route_headers
from gateway.forward.respond import cancelled_on_disconnect
from gateway.identity import Caller
from gateway.measure.tracing import Trace
from gateway.pipeline import _client_closed, _read_body, _request_id
from gateway.services import Services
from gateway.state.pins import valid_id

OTHER_ROUTES = {
    "/tokenize": "tokenize",
    "/detokenize": "detokenize",
    "/v1/embeddings": "embeddings",
    "/v1/messages/count_tokens": "count_tokens",
    "/pooling": "pooling",
    "/score": "score",
    "/v1/score": "score",
    "/rerank": "rerank",
    "/v1/rerank": "rerank",
    "/v2/rerank": "rerank",
    "/v1/audio/transcriptions": "transcription",
    "/v1/audio/translations": "translation",
}
MODEL_CARD = "/v1/models/{id}"
MODELS = "/v1/models"
VERSION = "/version"
STORED = "/v1/responses/{id}"
LIST_WAIT_S = 2.0  # an engine lists its models at once; one slower than this is in trouble
_NOT_JSON = {"/v1/audio/transcriptions", "/v1/audio/translations"}  # text, SRT, VTT
_FORWARDED = ("content-type", "accept", "anthropic-version", "anthropic-beta")
_BOUNDARY = re.compile(r'boundary="?([^";]+)"?', re.IGNORECASE)
# a header starts a line: searched from anywhere, a line repeating it costs its length squared
_MODEL_FIELD = re.compile(
    rb'^content-disposition:[^\r\n]*\bname="model"', re.IGNORECASE | re.MULTILINE
)


@dataclass(frozen=True, slots=True)
class Call:
    """Where one relayed request goes, and why."""

    method: str
    target: str  # the upstream path and query
    body: bytes
    rungs: tuple[str, ...]
    why: str
    rule: str
    model: str
    pinned: str | None = None  # the one endpoint that may serve it
    json: bool = True  # the route answers a JSON object: a success that is none is no answer


Prepare = Callable[[Trace, Caller], Awaitable[Call | Response]]
Answer = Callable[[Trace, Caller, str], Awaitable[Response]]  # given the request's id


async def other_route(services: Services, request: Request) -> Response:
    """``POST`` to one of ``OTHER_ROUTES``: to the model's passthrough pool."""
    route: str = request.scope["path"]

    async def prepare(trace: Trace, caller: Caller) -> Call:
        body = await _read_body(request, services.settings.max_body_bytes)
        with trace.step("parse"):
            model = _model_in(body, request.headers.get("content-type", ""))
        call = _passthrough(services, "POST", _target(request), body, route, model)
        return dataclasses.replace(call, json=route not in _NOT_JSON)

    return await _relay(services, request, route, OTHER_ROUTES[route], prepare)


async def model_card(services: Services, request: Request) -> Response:
    """``GET /v1/models/{id}``: to that model's passthrough pool."""
    model: str = request.path_params["model"]

    async def prepare(trace: Trace, caller: Caller) -> Call:
        return _passthrough(services, "GET", _target(request), b"", MODEL_CARD, model)

    return await _relay(services, request, MODEL_CARD, "model", prepare)


async def version(services: Services, request: Request) -> Response:
    """``GET /version``: to the passthrough pool of the first model served."""

    async def prepare(trace: Trace, caller: Caller) -> Call:
        model = min(services.policy.current.ladders)
        return _passthrough(services, "GET", _target(request), b"", VERSION, model)

    return await _relay(services, request, VERSION, "version", prepare)


async def model_list(services: Services, request: Request) -> Response:
    """``GET /v1/models``: every model served, each with its card as its pools list it."""

    async def answer(trace: Trace, caller: Caller, request_id: str) -> Response:
        headers = {"x-request-id": request_id}
        with trace.step("forward"):
            trace.inject(headers)
            ladders = sorted(services.policy.current.ladders.items())
            asked = (
                _card(services, model, ladder.other_routes, headers) for model, ladder in ladders
            )
            cards = await asyncio.gather(*asked)
        listed = orjson.dumps({"object": "list", "data": cards})
        return Response(listed, 200, {"x-request-id": request_id}, media_type=JSON)

    return await _admitted(services, request, MODELS, "models", answer)


async def _card(
    services: Services, model: str, rungs: Sequence[str], headers: dict[str, str]
) -> object:
    """The card of ``model`` in the list of the first of ``rungs`` to answer, or the
    gateway's own short card where that list lacks it or no endpoint answers in time."""
    telemetry = services.telemetry
    asked = services.pools.exchange(rungs, "GET", MODELS, b"", headers, json=True)
    try:
        done = await asyncio.wait_for(asked, LIST_WAIT_S)
    except (BackendError, TimeoutError):
        telemetry.relayed(model, "passthrough", rungs[0], "error", MODELS)
        return _own_card(model)
    reply = done.reply
    ok = reply.status < 400
    telemetry.relayed(model, "passthrough", done.spec.name, "ok" if ok else "error", MODELS)
    found = _listed_card(reply.body, model) if ok else None
    return found if found is not None else _own_card(model)


def _listed_card(body: bytes, model: str) -> object | None:
    """The card of ``model`` in an engine's ``/v1/models`` answer; None where it has none."""
    try:
        listed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    data = listed.get("data") if isinstance(listed, dict) else None
    cards = data if isinstance(data, list) else []
    return next((c for c in cards if isinstance(c, dict) and c.get("id") == model), None)


def _own_card(model: str) -> dict[str, object]:
    """The gateway's card for a model whose pools list none."""
    return {"id": model, "object": "model", "created": int(time.time()), "owned_by": "speclane"}


async def stored_response(services: Services, request: Request) -> Response:
    """``GET``/``DELETE /v1/responses/{id}`` and ``POST /v1/responses/{id}/cancel``: to the
    endpoint that stored the response."""
    response_id: str = request.path_params["response_id"]
    method = "GET" if request.method == "HEAD" else request.method  # a HEAD's answer has no body
    cancel = request.scope["path"].endswith("/cancel")
    route = STORED + ("/cancel" if cancel else "")

    async def prepare(trace: Trace, caller: Caller) -> Call | Response:
        body = await _read_body(request, services.settings.max_body_bytes) if cancel else b""
        found = valid_id(response_id)  # and the caller's: another tenant's is unknown here
        where = await services.pins.where(caller.tenant, response_id) if found else None
        endpoint = services.pools.endpoint(where) if where is not None else None
        if endpoint is None:
            return response_not_found(response_id)
        why = f"pinned: response {response_id} on {endpoint.url}"
        spec = services.pools.specs[endpoint.pool]
        target = _target(request)
        rungs = (endpoint.pool,)
        return Call(method, target, body, rungs, why, "pinned", spec.model, endpoint.url)

    operation = "cancel_response" if cancel else f"{method.lower()}_response"
    return await _relay(services, request, route, operation, prepare)


def _passthrough(
    services: Services, method: str, target: str, body: bytes, route: str, model: str | None
) -> Call:
    ladders = services.policy.current.ladders
    if model is None:
        if len(ladders) != 1:
            raise bad_request("name the model: this gateway serves several", "model")
        model = next(iter(ladders))
    ladder = ladders.get(model)
    if ladder is None:
        raise unknown_model(model, ladders)
    rungs = ladder.other_routes
    why = f"passthrough: {route} of {model} goes to {rungs[0]}"
    return Call(method, target, body, rungs, why, "passthrough", model)


async def _relay(
    services: Services, request: Request, route: str, operation: str, prepare: Prepare
) -> Response:
    """Admit, prepare, forward and answer one relayed request, under its trace."""

    async def answer(trace: Trace, caller: Caller, request_id: str) -> Response:
        prepared = await prepare(trace, caller)
        if isinstance(prepared, Response):  # nowhere to send it: the engine's own answer
            services.telemetry.error(prepared.status_code, "response_not_found")
            prepared.headers["x-request-id"] = request_id
            return prepared
        return await _forward(services, request, trace, route, request_id, prepared)

    return await _admitted(services, request, route, operation, answer)


async def _admitted(
    services: Services, request: Request, route: str, operation: str, answer: Answer
) -> Response:
    """One request of ``route`` through the gate and answered by ``answer``, under its
    trace; a refusal or an ``ApiError`` is answered in the route's shape."""
    request_id = _request_id(request.headers.get("x-request-id"))
    trace = services.telemetry.tracing.begin(request.headers, operation)
    try:
        caller = services.gate.enter(request.headers)
    except ApiError as exc:
        return _failed(services, trace, route, request_id, exc)
    try:
        answered = await answer(trace, caller, request_id)
    except ApiError as exc:
        return _failed(services, trace, route, request_id, exc)
    except BaseException as exc:
        trace.end(500, exc)
        raise
    finally:
        services.gate.leave(caller)
    trace.end(answered.status_code)
    return answered


async def _forward(
    services: Services, request: Request, trace: Trace, route: str, request_id: str, call: Call
) -> Response:
    telemetry = services.telemetry
    headers = {h: v for h in _FORWARDED if (v := request.headers.get(h)) is not None}
    headers["x-request-id"] = request_id
    first = call.rungs[0]
    done: Exchanged | None = None
    with trace.step("forward"):
        trace.inject(headers)
        async with cancelled_on_disconnect(request.receive):  # a client gone cancels upstream
            try:
                done = await services.pools.exchange(
                    call.rungs,
                    call.method,
                    call.target,
                    call.body,
                    headers,
                    pinned=call.pinned,
                    json=call.json,
                )
            except BackendError as exc:
                telemetry.failover(first, "exhausted", "none")
                telemetry.relayed(call.model, call.rule, first, "error", route)
                error = from_backend(exc)
                error.headers = _headers(services, request_id, first, call)
                raise error from None
    if done is None:
        raise _client_closed()
    served = done.spec.name
    for attempt in done.attempts:
        telemetry.upstream_failure(attempt.pool)
    if done.attempts or served != first:
        telemetry.failover(first, "served", served)
    reply = done.reply
    if reply.status >= 400:
        telemetry.rejected(served, reply.status)
    telemetry.relayed(call.model, call.rule, served, "ok" if reply.status < 400 else "error", route)
    headers = _headers(services, request_id, served, call, done.attempts)
    if shape_of(route) == "anthropic" and 400 <= reply.status < 500:  # vLLM's, reshaped
        return Response(
            anthropic_rejected(reply.status, reply.body), reply.status, headers, media_type=JSON
        )
    return Response(reply.body, reply.status, headers, media_type=reply.content_type or JSON)


def _headers(
    services: Services, request_id: str, served: str, call: Call, attempts: Sequence[Attempt] = ()
) -> dict[str, str]:
    if not services.settings.decision_headers:
        return {"x-request-id": request_id}
    return route_headers(request_id, served, call.why, call.rungs[0], attempts)


def _failed(
    services: Services, trace: Trace, route: str, request_id: str, exc: ApiError
) -> Response:
    """The gateway's own error, in the shape of the route's API, counted and traced."""
    services.telemetry.error(exc.status, exc.code or exc.type)
    trace.end(exc.status, exc)
    headers = {"x-request-id": request_id, **(exc.headers or {})}
    return exc.response(headers, shape_of(route))


def _target(request: Request) -> str:
    query: bytes = request.scope.get("query_string", b"")
    raw: bytes = request.scope.get("raw_path") or request.scope["path"].encode()
    path = raw.decode("latin-1")
    return path + ("?" + query.decode("latin-1") if query else "")


def _model_in(body: bytes, content_type: str) -> str | None:
    """The model a body names: its JSON ``model``, or a multipart form's ``model`` field;
    None when it names none (or is neither: the engine will say what is wrong with it)."""
    if content_type.lower().startswith("multipart/form-data"):
        found = _BOUNDARY.search(content_type)
        return _form_model(body, found.group(1).encode("latin-1")) if found else None
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    model = payload.get("model") if isinstance(payload, dict) else None
    return model if isinstance(model, str) and model else None


def _form_model(body: bytes, boundary: bytes) -> str | None:
    """The ``model`` field of a multipart form (a short text field; the file parts around it
    are never decoded)."""
    for part in body.split(b"--" + boundary):
        head, _, value = part.partition(b"\r\n\r\n")
        if _MODEL_FIELD.search(head):
            text = value.removesuffix(b"\r\n").decode(errors="replace").strip()
            return text or None
    return None
