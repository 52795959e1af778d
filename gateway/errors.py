"""Every error the gateway answers with, and where it comes from. One tree per boundary
(``backends/errors.py`` draws the backend's); typed failures stay typed until the pipeline
has decided what to do about them (fail over, retry a broken answer), and only then become
an ``ApiError``, here, in ``from_backend`` and ``broke``.

    ApiError(status=, message=, type=, param=, code=)   -> {"error": {...}} with that status
     │                                      (on Anthropic's routes, /v1/messages...,
     │                                      {"type": "error", "error": {"type", "message"}},
     │                                      the type named by the status: ``ANTHROPIC``;
     │                                      a Responses stream's final error event is
     │                                      ``event: error`` {"type": "error", "code", ...})
     │ the model routes (gateway/pipeline.py, gateway/schema.py, gateway/gate.py,
     │ gateway/identity.py)
     ├── 400 invalid_request_error          bad JSON, a bad field (``param`` names it)
     ├── 401 invalid_api_key                 no valid API key where keys are required
     ├── 404 model_not_found                 no ladder serves the model
     ├── 413 request_too_large               body over ``max_body_bytes``
     ├── 429 too_many_requests               no place in flight, the gateway's or the
     │                                       tenant's (Retry-After)
     ├── 499 client_closed                   the client hung up first (logged, never sent)
     ├── 502 upstream_stream_broken          a whole answer broke part way, retries spent
     │                                       (``StreamBroken``); after a stream's first
     │                                       byte, its final SSE error event
     ├── 502 upstream_error                  an upstream error event after the first, with
     │                                       a 5xx code or none (``UpstreamErrorEvent``)
     ├── 502 upstream_bad_answer             every try answered 200 with no answer: not a
     │                                       JSON object, or over ``max_response_bytes``
     │                                       (``BadAnswer``); after a stream's first byte,
     │                                       an event over it ends the stream (502
     │                                       upstream_stream_broken)
     ├── 429 upstream_rate_limited           every try was answered 429 (Retry-After: the
     │                                       largest an upstream sent, at least the pools')
     ├── 503 no_healthy_upstream             every pool of the ladder failed (Retry-After:
     │                                       the pools' own, or the largest an upstream sent)
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
routes, whatever its status (``gateway/server/relayed.py``). A Responses API call naming an
id the gateway cannot place gets vLLM's own 404 (``response_not_found``), and
``/v1/messages/count_tokens`` gets the gateway's errors in Anthropic's shape
(``{"type": "error", "error": {"type": ..., "message": ...}}``).

    UpstreamErrorEvent   an upstream stream carried an error object after its first event
                         (raised by the relay; a 4xx code there is still the client's
                         ``UpstreamRejected``)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import orjson
from starlette.requests import Request
from starlette.responses import Response

from backends.errors import (
    ANTHROPIC_TYPES,
    AnswerTimeout,
    BackendError,
    BadAnswer,
    StreamBroken,
    Unavailable,
    UpstreamRejected,
    UpstreamTimeout,
)

JSON = "application/json"
BROKEN = "upstream_stream_broken"
Shape = Literal["openai", "anthropic", "responses"]
ANTHROPIC = ANTHROPIC_TYPES  # the error type of each status, on Anthropic's routes


def shape_of(path: str) -> Shape:
    """The error shape of the API served at ``path``: Anthropic's under ``/v1/messages``;
    under ``/v1/responses`` OpenAI's, with the Responses API's own error event."""
    if path == "/v1/messages" or path.startswith("/v1/messages/"):
        return "anthropic"
    return "responses" if path == "/v1/responses" or path.startswith("/v1/responses/") else "openai"


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
            kind = ANTHROPIC.get(self.status, "api_error")
            return {"type": "error", "error": {"type": kind, "message": self.message}}
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


def from_backend(exc: BackendError | UpstreamErrorEvent) -> ApiError:
    """What the client is told of a failure nothing more will be tried for."""
    if isinstance(exc, UpstreamErrorEvent):
        return _server_error(502, str(exc), "upstream_error")
    if isinstance(exc, (AnswerTimeout, UpstreamTimeout)):
        return _server_error(504, str(exc), "upstream_timeout")
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
    body when that body is an error object (OpenAI's or Anthropic's); ``headers`` say who
    answered."""
    try:
        body = orjson.loads(exc.body)
    except orjson.JSONDecodeError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return Response(exc.body, exc.status, headers, media_type=JSON)
    if isinstance(body, dict) and isinstance(body.get("message"), str):  # a Responses event
        message = body["message"][:500]
    else:
        message = exc.body.decode(errors="replace")[:500] or f"upstream answered {exc.status}"
    error = ApiError(status=exc.status, message=message, code="upstream_rejected")
    return error.response(headers, shape)


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


async def api_error_handler(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return exc.response(shape=shape_of(request.scope["path"]))


def internal_error(path: str = "") -> Response:
    """The answer to a bug: no traceback, no detail, in the shape of the API at ``path``."""
    error = ApiError(status=500, message="internal error", type="server_error")
    return error.response(shape=shape_of(path))
