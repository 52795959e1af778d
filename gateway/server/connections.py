"""Before step 1: the connection, up to the point where a request exists.

uvicorn's httptools protocol, with bounds a client cannot stretch (httptools itself has none:
it buffers a header of any size, and an idle or trickling connection is kept for ever):

- the head (request line and headers) is at most ``max_header_bytes``: the bytes are counted
  before the parser sees them, so a larger head costs no more memory than the limit; the
  answer is a 431, and the connection is closed;
- the head must arrive within ``header_timeout_s`` of the connection opening or of the head's
  first byte, the body within ``body_timeout_s`` of the head: a client sending a byte every
  few seconds gets a 408 and its connection is closed (the app sees a disconnect);
- at most ``max_connections`` connections are open: one more is answered 503 with
  ``Retry-After`` at once and closed, so that file descriptors run out neither for the
  connections being served nor for the upstream ones;
- a parser error is a 400 in OpenAI's shape, as every other error.

Idle keep-alive connections are closed by uvicorn (``timeout_keep_alive``). Every refusal is
OpenAI-shaped JSON with ``Connection: close``. This module knows nothing of routes or requests.

Explained for operators, with its numbers, in docs/operations.md ("Hostile connections").
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import orjson
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

if TYPE_CHECKING:
    from gateway.settings import Settings

log = logging.getLogger(__name__)

_LINGER_S = 1.0


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """What one connection may take of the server (``gateway/settings.py`` documents each)."""

    max_header_bytes: int
    header_timeout_s: float
    body_timeout_s: float
    max_connections: int
    retry_after_s: int = 1

    @classmethod
    def of(cls, settings: Settings) -> ConnectionLimits:
        return cls(
            settings.max_header_bytes,
            settings.header_timeout_s,
            settings.body_timeout_s,
            settings.max_connections,
        )


def server_options(settings: Settings) -> dict[str, Any]:
    """uvicorn's options for the connection bounds of ``settings``."""
    return {
        "http": protocol(ConnectionLimits.of(settings)),
        "timeout_keep_alive": settings.keepalive_timeout_s,
    }


def protocol(limits: ConnectionLimits) -> type[asyncio.Protocol]:
    """The protocol class to give uvicorn as ``http=``."""

    class Bounded(BoundedProtocol):
        pass

    Bounded.limits = limits
    return Bounded


class BoundedProtocol(HttpToolsProtocol):
    """``HttpToolsProtocol`` with the bounds of ``limits`` (set by ``protocol()``)."""

    limits: ClassVar[ConnectionLimits]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = True
        self._head_left = self.limits.max_header_bytes
        self._heads = 0
        self._deadline: asyncio.TimerHandle | None = None
        self._discarding = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections:
            message = "too many connections to the gateway; retry shortly"
            self._refuse(503, message, "server_error", "too_many_connections")
            return
        self._arm(self.limits.header_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._discarding:
            return
        if not self._in_head:
            super().data_received(data)
            return
        if self._deadline is None:  # the first byte of a head after an answer
            self._arm(self.limits.header_timeout_s)
        if len(data) <= self._head_left:
            self._head_left -= len(data)
            super().data_received(data)
            return
        allowed, rest = data[: self._head_left], data[self._head_left :]
        heads = self._heads
        self._head_left = 0
        if allowed:
            super().data_received(allowed)
        if self.transport.is_closing() or self._discarding:
            return
        if self._heads == heads:  # the head did not end within its limit
            limit = self.limits.max_header_bytes
            message = f"the request's headers are larger than the gateway's limit of {limit} bytes"
            self._refuse(431, message, "invalid_request_error", "request_header_fields_too_large")
            return
        self.data_received(rest)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._heads += 1
        self._arm(self.limits.body_timeout_s)
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._disarm()  # the next head's clock starts with its first byte
        self._in_head = True
        self._head_left = self.limits.max_header_bytes
        super().on_message_complete()

    def send_400_response(self, msg: str) -> None:
        cycle = self.cycle
        if cycle is not None and cycle.response_started and not cycle.response_complete:
            self.transport.close()  # an answer is on its way: a 400 cannot follow it
            return
        self._refuse(400, "the request is not valid HTTP/1.1", "invalid_request_error", None)

    def _arm(self, after_s: float) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(after_s, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self) -> None:
        self._deadline = None
        if self.transport.is_closing() or self._discarding:
            return
        cycle = self.cycle if not self._in_head else None
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True  # the app's receive() answers with a disconnect
            cycle.message_event.set()
        started = self._in_head and self._head_left < self.limits.max_header_bytes
        if started or (cycle is not None and not cycle.response_started):
            part = "headers" if self._in_head else "body"
            message = f"the request's {part} did not arrive in time"
            self._refuse(408, message, "invalid_request_error", "request_timeout")
        else:
            self.transport.close()  # a connection that never sent a byte: nothing to answer

    def _refuse(self, status: int, message: str, kind: str, code: str | None) -> None:
        """Answer ``status`` in OpenAI's shape and close the connection."""
        self._disarm()
        error = {"message": message, "type": kind, "param": None, "code": code}
        body = orjson.dumps({"error": error})
        head = [STATUS_LINE[status]]
        for name, value in self.server_state.default_headers:
            head += [name, b": ", value, b"\r\n"]
        head.append(b"content-type: application/json\r\n")
        if status == 503:
            head.append(b"retry-after: %d\r\n" % self.limits.retry_after_s)
        head += [b"content-length: %d\r\n" % len(body), b"connection: close\r\n\r\n", body]
        self.transport.write(b"".join(head))
        if not self.transport.can_write_eof():
            self.transport.close()
            return
        # A lingering close: the answer is followed by our FIN, and what the client still
        # sends is read and dropped for a moment, since closing with unread bytes would send
        # a reset, and with it the client could lose the answer before reading it.
        try:
            self.transport.write_eof()
        except OSError:  # the client is already gone: nothing to linger for
            self.transport.close()
            return
        self._discarding = True
        self._deadline = self.loop.call_later(_LINGER_S, self.transport.close)
        log.debug("connection from %s refused: %d %s", self.client, status, message)
