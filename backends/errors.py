"""Errors of the backend boundary. Every foreign (aiohttp, socket) exception is mapped to one
of these in ``backends/upstream.py``, and nowhere else.

    BackendError
     ├── Unavailable        no endpoint took the request: refused, reset, breaker open, 5xx
     ├── UpstreamTimeout    no connection, or no first event, in time
     ├── UpstreamRejected   the upstream answered 4xx: the request itself is wrong; no failover
     └── StreamBroken       the stream failed after its first event: too late to fail over
"""

from __future__ import annotations


class BackendError(Exception):
    """Base of every error a backend raises."""


class Unavailable(BackendError):
    """The endpoint could not serve the request; another endpoint or pool may."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class UpstreamTimeout(BackendError):
    """Connecting, or waiting for the first event, took longer than the pool allows."""


class UpstreamRejected(BackendError):
    """A 4xx answer: passed on to the client as it came, with its status and body."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"upstream answered {status}")
        self.status = status
        self.body = body


class StreamBroken(BackendError):
    """The upstream stream ended without ``[DONE]`` or failed after the first event."""
