"""Every error the gateway answers with, and where it comes from. One tree per boundary
(``backends/errors.py`` draws the backend's); typed failures stay typed until nothing more
will be tried for them (the pools fail over and retry a broken whole answer), and only then
become the client's answer, in one place on the request path (``gateway/pipeline.py``'s
``_boundary``), by ``from_backend`` (``broke``) or ``rejected``. Past a stream's first
byte the relays end it with ``ApiError.sse`` instead.

    ApiError(status=, message=, type=, param=, code=)   -> {"error": {...}} with that status
     │                                      (on Anthropic's routes, /v1/messages...,
     │                                      {"type": "error", "error": {"type", "message"}},
     │                                      the type named by the status:
     │                                      ``backends.errors.ANTHROPIC_TYPES``;
     │                                      a Responses stream's final error event is
     │                                      ``event: error`` {"type": "error", "code", ...})
     │ the model routes (gateway/pipeline.py, gateway/schema.py, gateway/gate.py,
     │ gateway/identity.py)
     ├── 400 invalid_request_error          bad JSON, a bad field (``param`` names it)
     ├── 401 invalid_api_key                 no valid API key where keys are required
     ├── 404 model_not_found                 no ladder serves the model
     ├── 413 request_too_large               body over ``max_body_bytes``
     ├── 415 unsupported_media_type          a body sent as anything but JSON
     ├── 429 too_many_requests               no place in flight, the gateway's or the
     │                                       tenant's (Retry-After)
     ├── 499 client_closed                   the client hung up first (logged, never sent)
     ├── 502 upstream_stream_broken          a whole answer assembled from streams broke
     │                                       part way, retries spent (``BreaksSpent``; a
     │                                       body read whole: 503); after a stream's
     │                                       first byte, its final SSE error event
     ├── 502 upstream_error                  an upstream error event after the first, with
     │                                       a 5xx code or none (``UpstreamErrorEvent``)
     ├── 502 upstream_bad_answer             every try answered 200 with no answer: not a
     │                                       JSON object, or over ``max_response_bytes``
     │                                       (``BadAnswer``); after a stream's first byte,
     │                                       an event over it ends the stream (502
     │                                       upstream_stream_broken)
     ├── 429 upstream_rate_limited           every try was answered 429 (Retry-After: the
     │                                       largest an upstream sent, at least 1 s)
     ├── 503 no_healthy_upstream             every pool of the ladder failed (Retry-After:
     │                                       1 s, or the largest an upstream sent)
     ├── 503 shutting_down                   draining (Retry-After, Connection: close); as
     │                                       the final SSE event of a stream cut at the
     │                                       end of the drain
     ├── 504 upstream_timeout                every try timed out, or the request's time ran
     │                                       out (its first rung's ``total_s``, all tries
     │                                       included; ``AnswerTimeout``): after a stream's
     │                                       first byte, its final SSE error event
     ├── 4xx upstream_rejected               an upstream 4xx whose body is no error object
     │ the admin API (gateway/server/admin.py, admin_policy.py)
     ├── 400 invalid_request_error           a bad body or query parameter
     ├── 401 unauthorized                    no bearer token
     ├── 403 admin_disabled, forbidden       no admin token configured; a wrong one
     ├── 403 policy_apply_disabled           applying drafts is off
     ├── 404 flag_not_found, flag_not_set    no such flag; no ops value to delete
     ├── 409 policy_changed                  the file changed since the draft was taken
     ├── 409 policy_read_only                the file cannot be written here
     ├── 413 body_too_large                  a draft over its limit
     ├── 422 policy_invalid                  the draft does not lint
     │ routing (gateway/server/app.py), in vLLM's (FastAPI's) shape: {"detail": ...}
     ├── 404 Not Found, 405                  no such route; a method the route lacks
     └── 500 (no code)                       a bug: logged with its traceback, answered
                                             ``internal_error()``, no detail; counted in
                                             speclane_request_errors_total as
                                             ``internal_error`` on the OpenAI routes

Before a request exists (``gateway/server/connections.py``, the same shape, then
``Connection: close``): 400 (not HTTP/1.1), 408 ``request_timeout``, 431
``request_header_fields_too_large``, 503 ``too_many_connections``.

Passed through as they came: a 4xx from upstream with an error object, or an error event
with a 4xx code that opened its stream (``backends.errors.UpstreamRejected``), with its
status, whether the client streams or not (``rejected``); every answer of the engine's other
routes, whatever its status (``gateway/server/relayed.py``). On Anthropic's routes
(``/v1/messages`` and its ``count_tokens``) every upstream 4xx keeps its status and message
but takes Anthropic's shape and the status's type (``anthropic_rejected``): vLLM answers
what its request model refuses in its OpenAI shape. A Responses API call naming an
id the gateway cannot place gets vLLM's own 404 (``response_not_found``), and
``/v1/messages/count_tokens`` gets the gateway's errors in Anthropic's shape
(``{"type": "error", "error": {"type": ..., "message": ...}}``).

    UpstreamErrorEvent   an upstream stream carried an error object after its first event
                         (raised by the relay; a 4xx code there is still the client's
                         ``UpstreamRejected``)
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

import orjson
from pydantic import ValidationError
from starlette.responses import Response

from backends.errors import (
    AnswerTimeout,
    BackendError,
    BadAnswer,
    BreaksSpent,
    StreamBroken,
    Unavailable,
    UpstreamRejected,
    UpstreamTimeout,
    anthropic_type,
)

JSON = "application/json"
BROKEN = "upstream_stream_broken"
# the shape of an API's errors (each API's own, ``gateway/apis/``): OpenAI's, Anthropic's,
# or OpenAI's with the Responses API's own error event
Shape = Literal["openai", "anthropic", "responses"]


class UpstreamErrorEvent(Exception):
    """The upstream sent an error object as an event, after the stream had started;
    ``status`` is its ``code`` when that is an HTTP status."""

    def __init__(self, payload: bytes, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.payload = payload
        self.status = status


@dataclass(eq=False, kw_only=True)
class ApiError(Exception):
    status: int
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None
    retry_after_s: float | None = None
    headers: dict[str, str] | None = None

    def body(self, shape: Shape = "openai") -> dict[str, object]:
        if shape == "anthropic":
            return _anthropic(self.status, self.message)
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self, headers: dict[str, str] | None = None, shape: Shape = "openai") -> Response:
        if self.headers:
            headers = {**self.headers, **(headers or {})}
        if self.retry_after_s is not None:
            headers = {**(headers or {}), "retry-after": str(math.ceil(self.retry_after_s))}
        return Response(orjson.dumps(self.body(shape)), self.status, headers, media_type=JSON)

    def sse(self, shape: Shape = "openai", sequence_number: int = 0) -> bytes:
        """The final event of a stream that failed after its first byte. Anthropic's and
        the Responses API's are named ``error``; the Responses API's carries the error's
        fields flat, numbered ``sequence_number`` (the stream's next)."""
        if shape == "responses":
            event = {"type": "error", "code": self.code, "message": self.message,
                     "param": self.param, "sequence_number": sequence_number}  # fmt: skip
            return b"event: error\ndata: " + orjson.dumps(event) + b"\n\n"
        data = b"data: " + orjson.dumps(self.body(shape)) + b"\n\n"
        return b"event: error\n" + data if shape == "anthropic" else data


def bad_request(message: str, param: str | None = None) -> ApiError:
    return ApiError(status=400, message=message, param=param)


def invalid_body(exc: ValidationError) -> ApiError:
    """A 400 for an admin body that failed validation: its first error, at its field (none
    for the whole body, which is then no JSON object)."""
    first = exc.errors(include_url=False)[0]
    param = ".".join(str(p) for p in first["loc"]) or None
    message = f"{param}: {first['msg']}" if param else first["msg"]
    return ApiError(status=400, message=message, param=param)


def unknown_model(model: str, served: Iterable[str]) -> ApiError:
    """404 for a model no ladder serves, naming those that are (as vLLM's names its
    aliases), so a client can tell a typo from a wrong gateway."""
    names = ", ".join(sorted(served)) or "none"
    return ApiError(
        status=404,
        message=f"The model `{model}` does not exist. Served models: {names}.",
        param="model",
        code="model_not_found",
    )


def from_backend(exc: BackendError | UpstreamErrorEvent) -> ApiError:
    """What the client is told of a failure nothing more will be tried for."""
    if isinstance(exc, UpstreamErrorEvent):
        return _server_error(502, str(exc), "upstream_error")
    if isinstance(exc, (AnswerTimeout, UpstreamTimeout)):
        return _server_error(504, str(exc), "upstream_timeout")
    if isinstance(exc, BreaksSpent):
        return broke(exc.times)
    if isinstance(exc, StreamBroken):
        return _server_error(502, str(exc), BROKEN)
    if isinstance(exc, BadAnswer):
        return _server_error(502, str(exc), "upstream_bad_answer")
    retry = exc.retry_after_s or 1.0
    if isinstance(exc, Unavailable) and exc.status == 429:
        message = f"every upstream is busy; try again later: {exc}"
        return ApiError(
            status=429,
            message=message,
            type="rate_limit_error",
            code="upstream_rate_limited",
            retry_after_s=retry,
        )
    return _server_error(503, str(exc), "no_healthy_upstream", retry)


def broke(times: int) -> ApiError:
    """A whole answer that broke ``times`` times, the last time with no retry left."""
    message = f"the upstream answer broke before it was whole, {times} times"
    return _server_error(502, message, BROKEN)


def shutting_down(
    message: str, retry_after_s: float | None = None, headers: dict[str, str] | None = None
) -> ApiError:
    return _server_error(503, message, "shutting_down", retry_after_s, headers)


def _server_error(
    status: int,
    message: str,
    code: str,
    retry_after_s: float | None = None,
    headers: dict[str, str] | None = None,
) -> ApiError:
    return ApiError(
        status=status,
        message=message,
        type="server_error",
        code=code,
        retry_after_s=retry_after_s,
        headers=headers,
    )


def rejected(
    exc: UpstreamRejected, headers: dict[str, str] | None = None, shape: Shape = "openai"
) -> Response:
    """An upstream 4xx (or an error event that opened its stream), passed on with its own
    body when that body is an error object (OpenAI's or Anthropic's); on Anthropic's routes
    always in Anthropic's shape (``anthropic_rejected``); ``headers`` say who answered."""
    if shape == "anthropic":
        reshaped = anthropic_rejected(exc.status, exc.body)
        return Response(reshaped, exc.status, headers, media_type=JSON)
    try:
        body = orjson.loads(exc.body)
    except orjson.JSONDecodeError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return Response(exc.body, exc.status, headers, media_type=JSON)
    error = ApiError(
        status=exc.status, message=_message(exc.status, exc.body), code="upstream_rejected"
    )
    return error.response(headers, shape)


def anthropic_rejected(status: int, body: bytes) -> bytes:
    """An upstream's error answer on an Anthropic route, in Anthropic's shape: vLLM answers
    what its pydantic model refuses (a role of ``robot``, a thinking budget under 1024) in
    its OpenAI shape, and its own errors with its own type names (``NotFoundError``); the
    type is the status's (``backends.errors.ANTHROPIC_TYPES``), the message the upstream's."""
    return orjson.dumps(_anthropic(status, _message(status, body)))


def _anthropic(status: int, message: str) -> dict[str, object]:
    return {"type": "error", "error": {"type": anthropic_type(status), "message": message}}


def _message(status: int, raw: bytes) -> str:
    """The message of an upstream's error answer: its error object's, a Responses error
    event's, or its text."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        body = None
    error = body.get("error") if isinstance(body, dict) else None
    for holder in (error, body):
        if isinstance(holder, dict) and isinstance(holder.get("message"), str):
            return str(holder["message"])[:2000]
    if isinstance(error, str):  # some servers' {"error": "..."}
        return error[:2000]
    return raw.decode(errors="replace")[:500] or f"upstream answered {status}"


def response_not_found(response_id: str) -> Response:
    """vLLM's answer for a Responses API id it does not hold: what a call naming a response
    gets when the gateway does not know where it is stored, or that endpoint is gone."""
    error = {
        "message": f"Response with id '{response_id}' not found.",
        "type": "invalid_request_error",
        "param": "response_id",
        "code": 404,
    }
    return Response(orjson.dumps({"error": error}), 404, media_type=JSON)


def route_not_found(status: int = 404) -> Response:
    """vLLM's (FastAPI's) answer for a path it does not serve, or a method the path lacks."""
    detail = "Not Found" if status == 404 else "Method Not Allowed"
    return Response(orjson.dumps({"detail": detail}), status, media_type=JSON)


def internal_error(shape: Shape = "openai") -> Response:
    """The answer to a bug: no traceback, no detail, in the shape of the API it came in on."""
    error = ApiError(status=500, message="internal error", type="server_error")
    return error.response(shape=shape)
