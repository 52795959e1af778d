"""Before step 1: the connection, up to the point where a request exists.

uvicorn's httptools protocol, with bounds a client cannot stretch (httptools itself has none:
it buffers a header of any size, and an idle or trickling connection is kept for ever):

- the head (request line and headers) is at most ``max_header_bytes``: the bytes are counted
  before the parser sees them, so a larger head costs no more memory than the limit; the
  answer is a 431, and the connection is closed. A chunked body's extensions and trailer
  count against the same limit as the head (a trailer is read and dropped, never a header),
  and a head that arrives in the same read as the end of the request before it counts from
  its first byte: ``framing.py`` says where each request ends before the parser is given its
  bytes, and a message the parser would read on past that is a 400;
- the head must arrive within ``header_timeout_s`` of the connection opening or of the head's
  first byte, the body within ``body_timeout_s`` of the head: a client sending a byte every
  few seconds gets a 408 and its connection is closed (the app sees a disconnect);
- at most ``max_connections`` connections are open, and at most ``max_connections_per_peer``
  from one client address (an IPv6 one by its /64): one more is answered 503 with
  ``Retry-After`` at once and closed, and never counts as open; past ``max_lingering`` such
  refusals closing at once, it is closed without a lingering close. So file descriptors
  run out neither for the connections being served nor for the upstream ones, and one
  client cannot take them all, however fast it opens connections;
- a body is given to the parser ``_TURN`` bytes at a time, each in its own turn of the event
  loop, reading from the client paused meanwhile, so that a body of millions of one-byte
  chunks costs its sender time, never the other connections (tiny chunks are framed at C
  speed, ``framing.py``, and their pieces handed to the request once a read);
- a parser error is a 400, in the shape of the API its path is under, as every other error;
- a refusal of a pipelined request is written after the answers to the requests before it
  on the connection, never in their place.

Idle keep-alive connections are closed by uvicorn (``timeout_keep_alive``). Every refusal is
JSON with ``Connection: close``, in the error shape of the API whose path the request line
named as far as it came (``Registry.shape_of``: Anthropic's under ``/v1/messages``), else OpenAI's.
This module knows nothing else of routes or requests.

Explained for operators, with its numbers, in docs/operations.md ("Hostile connections").
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

import orjson
from uvicorn.protocols.http.httptools_impl import (
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
)

from gateway.apis import APIS, Registry
from gateway.errors import ApiError
from gateway.server.framing import Body, HeadEnd, body_of

if TYPE_CHECKING:
    from gateway.settings import Settings

log = logging.getLogger(__name__)

_LINGER_S = 1.0
# Body bytes one connection gives the parser before every other connection gets its turn of
# the event loop: about 2 ms of framing and parsing for a body of one-byte chunks (the worst
# case, about 0.15 us a chunk), where a whole read of up to 256 KiB would hold the loop four
# times as long, and a client that writes faster than that is read no faster.
_TURN = 64 * 1024


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """What one connection may take of the server (``gateway/settings.py`` documents each)."""

    max_header_bytes: int
    header_timeout_s: float
    body_timeout_s: float
    max_connections: int
    max_connections_per_peer: int
    retry_after_s: int = 1
    max_lingering: int = 16  # connections turned away as they opened that close slowly

    @classmethod
    def of(cls, settings: Settings) -> ConnectionLimits:
        cap = settings.client_connections
        return cls(
            settings.max_header_bytes,
            settings.header_timeout_s,
            settings.body_timeout_s,
            cap,
            settings.connections_per_peer,
            max_lingering=min(max(16, cap // 16), 256),
        )


def server_options(settings: Settings) -> dict[str, Any]:
    """uvicorn's options for the connection bounds of ``settings``."""
    return {
        "http": protocol(ConnectionLimits.of(settings)),
        "timeout_keep_alive": settings.keepalive_timeout_s,
        "ws": "none",  # no WebSocket routes: an upgrade request is answered as HTTP/1.1
    }


def protocol(limits: ConnectionLimits, apis: Registry = APIS) -> type[asyncio.Protocol]:
    """The protocol class to give uvicorn as ``http=``; ``apis`` say a path's error shape."""

    class Bounded(BoundedProtocol):
        pass

    Bounded.limits = limits
    Bounded.apis = apis
    Bounded.peers = Counter()
    Bounded.lingering = set()
    return Bounded


class BoundedProtocol(HttpToolsProtocol):
    """``HttpToolsProtocol`` with the bounds of ``limits`` (set by ``protocol()``)."""

    limits: ClassVar[ConnectionLimits]
    apis: ClassVar[Registry]
    peers: ClassVar[Counter[str]]
    lingering: ClassVar[set[BoundedProtocol]]  # turned away as they opened, closing

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = True
        self._head_left = self.limits.max_header_bytes
        self._head_end = HeadEnd()
        self._body: Body | None = None
        self._deadline: asyncio.TimerHandle | None = None
        self._discarding = False
        self._peer: str | None = None
        self._before: RequestResponseCycle | None = None  # the cycle before the newest one
        self._owed: tuple[RequestResponseCycle, _Refusal] | None = None
        self._held = bytearray()  # bytes read and not yet given to the parser
        self._pieces: list[bytes] = []  # body the parser gave in this read
        self._line = b""  # a refused head's request line, where the parser saw none of it

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections:
            message = "too many connections to the gateway; retry shortly"
            self._turn_away(_Refusal(503, message, "server_error", "too_many_connections"))
            return
        if self.client is None:  # a Unix socket: no address to share by
            self._arm(self.limits.header_timeout_s)
            return
        peer = peer_of(self.client[0])
        if self.peers[peer] >= self.limits.max_connections_per_peer:
            message = "too many connections to the gateway from this address; retry shortly"
            refusal = _Refusal(503, message, "server_error", "too_many_connections_from_peer")
            self._turn_away(refusal)
            return
        self._peer = peer
        self.peers[peer] += 1
        self._arm(self.limits.header_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self.lingering.discard(self)
        if self._peer is not None:
            self.peers[self._peer] -= 1
            if not self.peers[self._peer]:
                del self.peers[self._peer]
            self._peer = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._held:  # bytes read before these still wait for their turn
            self._held += data
            self.transport.pause_reading()
            return
        self._take(data)

    def _take(self, data: bytes) -> None:
        fed = 0  # body bytes given to the parser in this turn of the event loop
        while data and not self._discarding and not self.transport.is_closing():
            if not self._in_head and self._body is None:
                # A message the parser goes on reading with no framing the headers name:
                # nothing of it could be counted, so it is refused rather than read uncounted.
                self.send_400_response("")
                return
            if self._in_head:
                data = self._feed_head(data)
            elif fed < _TURN:
                turn = _TURN - fed
                rest = self._feed_body(data[:turn])
                fed += min(turn, len(data)) - len(rest)
                data = rest + data[turn:]
            else:  # the rest waits while every other connection gets its turn
                self._held = bytearray(data)
                self.transport.pause_reading()
                self.loop.call_soon(self._release)
                return

    def _release(self) -> None:
        data, self._held = bytes(self._held), bytearray()
        if self.transport.is_closing():
            return
        if not self.flow.read_paused:  # else the app has yet to read what it was given
            self.transport.resume_reading()
        self._take(data)

    def _feed_head(self, data: bytes) -> bytes:
        """Give the parser ``data`` up to its head's end; what is left after it."""
        if self._deadline is None:  # the first byte of a head after an answer
            self._arm(self.limits.header_timeout_s)
        end = self._head_end.end(data)
        size = len(data) if end is None else end
        if size > self._head_left:
            if self._head_left == self.limits.max_header_bytes:  # the parser saw none of it
                self._line = data[: data.find(b"\r\n")]
            limit = self.limits.max_header_bytes
            message = f"the request's headers are larger than the gateway's limit of {limit} bytes"
            self._refuse(_Refusal(431, message, _INVALID, _TOO_LARGE))
            return b""
        self._head_left -= size
        super().data_received(data[:size])
        return data[size:]

    def _feed_body(self, data: bytes) -> bytes:
        """Give the parser ``data`` up to its body's end; what is left after it."""
        assert self._body is not None
        size, ended = self._body.take(data)
        if self._body.extra > self._head_left:
            limit = self.limits.max_header_bytes
            message = (
                "the request's chunk extensions and trailer are larger than the gateway's limit "
                f"of {limit} bytes"
            )
            self._refuse(_Refusal(431, message, _INVALID, _TOO_LARGE))
            return b""
        super().data_received(data[:size])
        if self._pieces:  # the request is given what this read held of its body at once
            piece = self._pieces[0] if len(self._pieces) == 1 else b"".join(self._pieces)
            self._pieces.clear()
            super().on_body(piece)
        if ended and not self._in_head:
            self._body = None  # the parser reads on where the framing ended: refused above
        return data[size:]

    def on_body(self, body: bytes) -> None:
        self._pieces.append(body)  # one a chunk: handed on by ``_feed_body``, once a read

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._in_head:  # a trailer's fields are counted and dropped, never headers
            super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._body = body_of(self.headers)
        self._before = self.cycle
        self._arm(self.limits.body_timeout_s)
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._disarm()  # the next head's clock starts with its first byte
        self._in_head = True
        self._head_left = self.limits.max_header_bytes
        self._head_end = HeadEnd()
        self._body = None
        super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self._owed is not None and self._owed[0].response_complete:
            refusal = self._owed[1]
            self._owed = None
            if not self.transport.is_closing():
                self._refuse(refusal)

    def send_400_response(self, msg: str) -> None:
        del msg
        self._refuse(_Refusal(400, "the request is not valid HTTP/1.1", _INVALID, None))

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
        if self._in_head and self._head_left == self.limits.max_header_bytes:
            self.transport.close()  # a connection that never sent a byte: nothing to answer
            return
        part = "headers" if self._in_head else "body"
        message = f"the request's {part} did not arrive in time"
        self._refuse(_Refusal(408, message, _INVALID, "request_timeout"))

    def _refuse(self, refusal: _Refusal) -> None:
        """Answer ``refusal`` and close the connection, once the answers to the requests
        before it on this connection are written (each client gets its answers in order)."""
        self._disarm()
        awaited: RequestResponseCycle | None = self.cycle
        if not self._in_head and self.cycle is not None:  # refusing the request being read
            cycle = self.cycle
            cycle.disconnected = True  # the app's receive() answers with a disconnect
            cycle.message_event.set()
            if cycle.response_started:  # its answer is on its way: no other can follow it
                self.transport.close()
                return
            queued = [entry for entry in self.pipeline if entry[0] is cycle]
            for entry in queued:
                self.pipeline.remove(entry)
            awaited = self._before if queued else None
        if awaited is not None and not awaited.response_complete:
            self._owed = (awaited, refusal)
            self._discarding = True  # what the client still sends is dropped meanwhile
            return
        self._write(refusal)

    def _turn_away(self, refusal: _Refusal) -> None:
        """Refuse a connection over a cap as it opens, outside the count of open
        connections: one address opening connections faster than they close would
        otherwise fill the cap with its own refusals and starve every other client. Its
        answer is followed by a lingering close (``_write``) while fewer than
        ``max_lingering`` refusals linger, and by an immediate one past that, so that a
        flood of connections cannot hold the process's file descriptors either (what the
        client sent is then unread, and it may see a reset in place of the answer)."""
        self.connections.discard(self)
        if len(self.lingering) < self.limits.max_lingering:
            self.lingering.add(self)
            self._write(refusal)
            return
        self._discarding = True
        self.transport.write(self._answer(refusal))
        self.transport.close()

    def _write(self, refusal: _Refusal) -> None:
        """Write ``refusal`` and close the connection."""
        self.transport.write(self._answer(refusal))
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
        log.debug("connection from %s refused: %d %s", self.client, *refusal[:2])

    def _answer(self, refusal: _Refusal) -> bytes:
        """``refusal`` as an HTTP answer in its route's shape, with ``Connection: close``."""
        status, message, kind, code = refusal
        seen = getattr(self, "url", b"") or self._line.partition(b" ")[2].partition(b" ")[0]
        path = seen.split(b"?", 1)[0].decode("latin-1")
        error = ApiError(status=status, message=message, type=kind, code=code)
        body = orjson.dumps(error.body(self.apis.shape_of(path)))
        head = [STATUS_LINE[status]]
        for name, value in self.server_state.default_headers:
            head += [name, b": ", value, b"\r\n"]
        head.append(b"content-type: application/json\r\n")
        if status == 503:
            head.append(b"retry-after: %d\r\n" % self.limits.retry_after_s)
        head += [b"content-length: %d\r\n" % len(body), b"connection: close\r\n\r\n", body]
        return b"".join(head)


def peer_of(host: str) -> str:
    """Whose a connection is, for the per-peer share: its IPv4 address, or the /64 network of
    an IPv6 one (a host is given a whole /64 and may use any address in it)."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return host


class _Refusal(NamedTuple):
    status: int
    message: str
    kind: str
    code: str | None


_INVALID = "invalid_request_error"
_TOO_LARGE = "request_header_fields_too_large"
