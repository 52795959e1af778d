"""Errors of the backend boundary. Every foreign exception (the HTTP client's of
``backends/http1.py``, a socket's, a timeout) is mapped to one of these in
``backends/upstream.py``, and nowhere else. The gateway turns them into its clients' errors
once it has decided what to do about them (``gateway/errors.py``).

    BackendError
     ├── Unavailable        no endpoint took the request: refused, reset, 5xx, nothing in service
     ├── UpstreamTimeout    no connection, or no first event, in time
     ├── UpstreamRejected   the upstream answered 4xx (or opened its stream with a 4xx error
     │                      event): the request itself is wrong; no failover
     └── StreamBroken       the stream failed after its first event: too late to fail over
"""

from __future__ import annotations


class BackendError(Exception):
    """Base of every error a backend raises. ``retry_after_s``, when set, is how long a
    client should wait before trying again (every endpoint failed)."""

    retry_after_s: float | None = None


class Unavailable(BackendError):
    """The endpoint could not serve the request; another endpoint or pool may."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class UpstreamTimeout(BackendError):
    """Connecting, or waiting for the first event, took longer than the pool allows."""


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
