"""Errors of the backend boundary. Every foreign exception (the HTTP client's of
``backends/http1.py``, a socket's, a timeout) is mapped to one of these in
``backends/upstream.py``, and nowhere else. The gateway turns them into its clients' errors
once it has decided what to do about them (``gateway/errors.py``).

    BackendError
     ├── Unavailable        no endpoint took the request: refused, reset, 5xx, 429, nothing
     │                      in service; ``status`` 429 when every try was told to wait;
     │                      ``suspect`` for a 500 that may be the request's own fault
     ├── UpstreamTimeout    no connection, or no first event, in time; or the request's time
     │                      (its first rung's ``total_s``) ran out between tries
     ├── BadAnswer          a 200 that is no answer: a body or first event that is not a JSON
     │                      object, or more than ``max_response_bytes``; fails over
     ├── UpstreamRejected   the upstream answered 4xx (or opened its stream with a 4xx error
     │                      event): the request itself is wrong; no failover
     └── StreamBroken       the stream failed after its first event: too late to fail over
          ├── AnswerTimeout the answer had started and did not end by the request's deadline
          └── BreaksSpent   an assembled whole answer broke on every try its budget allowed
"""

from __future__ import annotations

# Anthropic's error type for each status (its API's errors page), the one table of them: the
# gateway answers with them (an upstream's 4xx on Anthropic's routes is reshaped to them), and
# an upstream's Messages stream reports its errors by them (``ANTHROPIC_STATUS``). A status
# not in it is ``invalid_request_error`` (a 4xx) or ``api_error``; ``overloaded_error`` is
# Anthropic's 529, the gateway's 503.
ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    402: "billing_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
}
ANTHROPIC_STATUS = {kind: status for status, kind in ANTHROPIC_TYPES.items()}


def anthropic_type(status: int) -> str:
    """Anthropic's error type for an HTTP status."""
    return ANTHROPIC_TYPES.get(
        status, "invalid_request_error" if 400 <= status < 500 else "api_error"
    )


class BackendError(Exception):
    """Base of every error a backend raises. ``retry_after_s``, when set, is how long a
    client should wait before trying again (every endpoint failed)."""

    retry_after_s: float | None = None


class Unavailable(BackendError):
    """The endpoint could not serve the request; another endpoint or pool may.

    ``suspect``: the endpoint answered, in its API's shape, that the request failed (a 500
    whose body, or whose stream's opening event, is an error object): vLLM answers so for a
    request the engine accepted and then could not run (a JSON schema whose ``$ref`` never
    ends), which every endpoint would fail alike, as well as for a fault of its own. Whose
    fault it was is for the pools to tell (``backends/pool.py``)."""

    def __init__(
        self,
        message: str,
        status: int | None = None,
        told_s: float | None = None,
        *,
        suspect: bool = False,
    ) -> None:
        """``told_s``: the upstream's own ``Retry-After``, in seconds, when it sent one."""
        super().__init__(message)
        self.status = status
        self.told_s = told_s
        self.suspect = suspect


class UpstreamTimeout(BackendError):
    """Connecting, or waiting for the first event, took longer than the pool allows."""


class BadAnswer(BackendError):
    """The upstream answered 200 with something that is not an answer: a whole body, or a
    stream's first event, that is not a JSON object (an HTML page, SSE text where JSON was
    asked for), or more bytes than ``max_response_bytes``. Nothing of it reached the client,
    so another endpoint may serve; a 502 when none does."""


class UpstreamRejected(BackendError):
    """A 4xx answer, or an error event that opened a stream with a 4xx code: passed on to the
    client as it came, with its status and body. ``pool`` names the pool that answered."""

    def __init__(self, status: int, body: bytes, pool: str = "") -> None:
        super().__init__(f"upstream answered {status}")
        self.status = status
        self.body = body
        self.pool = pool


class StreamBroken(BackendError):
    """The upstream stream ended without ``[DONE]`` or failed after the first event."""


class AnswerTimeout(StreamBroken):
    """The answer had started but did not end by the request's deadline (its first rung's
    ``total_s``, all tries included): a 504, or a stream's final error event."""


class BreaksSpent(StreamBroken):
    """A whole answer assembled from streams broke part way ``times`` times, the last with
    no retry left (``backends/retries.py``)."""

    def __init__(self, times: int) -> None:
        super().__init__(f"the answer broke before it was whole, {times} times")
        self.times = times
