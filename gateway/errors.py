"""Gateway errors and their OpenAI-style rendering.

    ApiError(status, message, type, param, code)    -> {"error": {...}} with that status
     ├── 400 invalid_request_error                   bad JSON, a bad field (param names it)
     ├── 404 model_not_found                         no ladder serves the model
     ├── 413 request_too_large                       body over max_body_bytes
     ├── 503 no_healthy_upstream                     every pool of the ladder failed (Retry-After)
     └── 504 upstream_timeout                        every try timed out

Backend errors (``backends.errors``) are turned into these by ``from_backend``; a 4xx from
upstream, or an error event with a 4xx code that opened its stream, is passed through as it
came, with its status, whether the client streams or not. Nothing else reaches the client:
an unexpected exception is logged with its traceback and answered with a plain 500 body.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import orjson
from starlette.requests import Request
from starlette.responses import Response

from backends.errors import BackendError, UpstreamRejected, UpstreamTimeout

JSON = "application/json"


@dataclass(eq=False)
class ApiError(Exception):
    status: int
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None
    retry_after_s: float | None = None
    headers: dict[str, str] | None = None

    def body(self) -> dict[str, object]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self, headers: dict[str, str] | None = None) -> Response:
        if self.headers:
            headers = {**self.headers, **(headers or {})}
        if self.retry_after_s is not None:
            headers = {**(headers or {}), "retry-after": str(math.ceil(self.retry_after_s))}
        return Response(orjson.dumps(self.body()), self.status, headers, media_type=JSON)

    def sse(self) -> bytes:
        """The final event of a stream that failed after its first byte."""
        return b"data: " + orjson.dumps(self.body()) + b"\n\n"


def bad_request(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param=param)


def from_backend(exc: BackendError) -> ApiError:
    if isinstance(exc, UpstreamTimeout):
        return ApiError(504, str(exc), "server_error", None, "upstream_timeout")
    retry = exc.retry_after_s or 1.0
    return ApiError(503, str(exc), "server_error", None, "no_healthy_upstream", retry)


def rejected(exc: UpstreamRejected, headers: dict[str, str] | None = None) -> Response:
    """An upstream 4xx (or an error event that opened its stream), passed on with its own
    body when that body is an error object; ``headers`` say who answered."""
    try:
        body = orjson.loads(exc.body)
    except orjson.JSONDecodeError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return Response(exc.body, exc.status, headers, media_type=JSON)
    message = exc.body.decode(errors="replace")[:500] or f"upstream answered {exc.status}"
    return ApiError(exc.status, message, code="upstream_rejected").response(headers)


async def api_error_handler(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return exc.response()


def internal_error() -> Response:
    """The answer to a bug: no traceback, no detail, OpenAI's shape."""
    error = {"message": "internal error", "type": "server_error", "param": None, "code": None}
    return Response(orjson.dumps({"error": error}), 500, media_type=JSON)
