"""A small HTTP/1.1 client for step 5: keep-alive connections per origin, one write per
request, answers parsed by httptools (llhttp, what uvicorn parses requests with) as they
arrive. ``backends/upstream.py`` is its only user and maps its errors.

Why not aiohttp: on the gateway's machine the whole gateway spends a third to two fifths less
CPU per request on this client than on aiohttp's ``ClientSession``, and its whole budget is
500 us (bench/RESULTS.md, "Upstream HTTP client", has the figures). An upstream
is an OpenAI-compatible server, so this client does what that needs and no more: no
redirects, cookies, proxies, compression (it asks for none), HTTP/2 or ``Expect``. TLS
works (``https://`` endpoints).

    ConnectError    the connection could not be made (an ``OSError``: refused, no route)
    Disconnected    the connection closed before the answer ended
    BadResponse     the peer did not answer HTTP/1.1
    TimeoutError    no byte for ``idle_s`` while one was awaited; connecting took too long;
                    a body still being read at the request's ``deadline``

A connection goes back to its pool only when its answer ended cleanly and both sides keep
it alive; an answer abandoned half-read closes it, so the upstream sees the client go.
"""

from __future__ import annotations

import asyncio
import functools
import ssl
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import cast
from urllib.parse import urlsplit

import httptools

from backends.memory import Trimmer

_HIGH_WATER = 1 << 20  # stop reading from a socket with this much unread body buffered
_LINGER_S = 1.0  # how long a released answer may take to end before its connection closes


class ConnectError(Exception):
    """The connection could not be made."""


class Disconnected(Exception):
    """The connection closed before the answer ended."""


class BadResponse(Exception):
    """What came back was not an HTTP/1.1 answer."""


@dataclass(frozen=True, slots=True)
class Origin:
    scheme: str
    host: str
    port: int
    host_header: bytes


@functools.lru_cache(maxsize=512)
def split(url: str) -> tuple[Origin, bytes]:
    """``url``'s origin and request target (path and query)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {url!r}")
    default = 443 if parts.scheme == "https" else 80
    port = parts.port or default
    host = parts.hostname
    shown = f"[{host}]" if ":" in host else host
    header = shown if port == default else f"{shown}:{port}"
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    return Origin(parts.scheme, host, port, header.encode("idna")), target.encode()


def _fresh(error: BaseException) -> BaseException:
    """A new exception like ``error``, to raise in its place: the one kept on the
    connection is never raised, so no traceback of it holds the frames that hold the
    connection (a reference cycle)."""
    return type(error)(*error.args)


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())


class _Connection(asyncio.Protocol):
    """One socket to one origin, carrying one request at a time."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, on_lost: Callable[[_Connection], None]
    ) -> None:
        self._loop = loop
        self._on_lost = on_lost
        self._parser: httptools.HttpResponseParser | None = httptools.HttpResponseParser(self)
        self._transport: asyncio.Transport | None = None
        self._waiter: asyncio.Future[None] | None = None
        self.closed = False
        self.holds_slot = False
        self.reused = False
        self.idle_since = 0.0
        self.on_complete: Callable[[], None] | None = None
        self._reset()

    def _reset(self) -> None:
        self.status = 0
        self.content_type = b""
        self.head_done = False
        self.complete = False
        self.keep_alive = False
        self.retry_after: bytes | None = None
        self.length: int | None = None  # the Content-Length the answer declared
        self._framed = False
        self._chunks: list[bytes] = []
        self._size = 0
        self.received = 0  # body bytes of the answer, in all
        self._paused = False
        self.error: BaseException | None = None
        self._busy = False

    # --- the transport's side ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports implement asyncio.Transport without deriving from it
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if not self._busy:
            self._fail(BadResponse("the upstream sent bytes nobody asked for"))
            return
        if self._parser is None:
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(BadResponse(f"not an HTTP/1.1 answer: {exc}"))

    def eof_received(self) -> bool | None:
        return None  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._busy and not self.complete:
            if self.head_done and not self._framed:
                self.complete = True  # a body delimited by the end of the connection
            elif self.error is None:
                self.error = Disconnected(f"the upstream closed the connection: {exc or 'EOF'}")
        self._wake()
        self._on_lost(self)
        # the parser holds this protocol's callbacks and the transport holds the protocol:
        # dropping both leaves no reference cycle, so the connection, its transport and its
        # parser are freed with their last reference instead of at a rare full collection
        self._parser = None
        self._transport = None

    # --- the parser's callbacks --------------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        lowered = name.lower()
        if lowered == b"content-type":
            self.content_type = value
        elif lowered == b"retry-after":
            self.retry_after = value
        elif lowered == b"content-length" and value.strip().isdigit():
            self.length = int(value)
        if lowered == b"content-length" or (
            lowered == b"transfer-encoding" and b"chunked" in value.lower()
        ):
            self._framed = True

    def on_headers_complete(self) -> None:
        assert self._parser is not None  # called from ``feed_data``
        self.status = self._parser.get_status_code()
        self.head_done = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)
        self._size += len(body)
        self.received += len(body)
        if self._size > _HIGH_WATER and not self._paused and self._transport is not None:
            self._paused = True
            self._transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        self.complete = True
        assert self._parser is not None  # called from ``feed_data``
        self.keep_alive = self._parser.should_keep_alive()
        self._wake()
        if self.on_complete is not None:
            self.on_complete()

    # --- the client's side -------------------------------------------------------------------

    def send(self, data: bytes) -> None:
        self._reset()
        self.on_complete = None
        self._busy = True
        assert self._transport is not None
        self._transport.write(data)

    async def head(self, idle_s: float) -> int:
        while not self.head_done:
            if self.error is not None:
                raise _fresh(self.error)
            await self._wait(idle_s)
        return self.status

    async def chunk(self, idle_s: float, deadline: float | None = None) -> bytes:
        """The body bytes that arrived since the last call; ``b""`` once it has ended.
        ``TimeoutError`` at ``deadline`` (loop time), whether bytes still come or not."""
        if deadline is not None and self._loop.time() >= deadline:
            raise TimeoutError()
        while True:
            if self._chunks:
                chunks, self._chunks, self._size = self._chunks, [], 0
                if self._paused and self._transport is not None:
                    self._paused = False
                    self._transport.resume_reading()
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)
            if self.complete:
                return b""
            if self.error is not None:
                raise _fresh(self.error)
            left = idle_s if deadline is None else min(idle_s, deadline - self._loop.time())
            await self._wait(left)

    @property
    def reusable(self) -> bool:
        return self.complete and self.keep_alive and not self.closed and self.error is None

    def close(self) -> None:
        if self._transport is not None and not self.closed:
            self._transport.close()
        self.closed = True
        self._chunks, self._size = [], 0  # abandoned: what was read unread goes with it

    async def _wait(self, idle_s: float) -> None:
        waiter = self._waiter = self._loop.create_future()
        expiry = self._loop.call_later(idle_s, _expire, waiter)
        try:
            await waiter
        finally:
            expiry.cancel()
            self._waiter = None

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, error: BaseException) -> None:
        if self.error is None:
            self.error = error
        self._wake()
        if self._transport is not None:
            self._transport.close()


class Response:
    """An answer whose status line and headers are in; its body is read with ``chunk``."""

    __slots__ = ("_client", "_conn", "_origin", "content_type", "deadline", "idle_s", "status")

    def __init__(
        self,
        client: Client,
        origin: Origin,
        conn: _Connection,
        idle_s: float,
        deadline: float | None = None,
    ) -> None:
        self._client = client
        self._origin = origin
        self._conn = conn
        self.idle_s = idle_s  # may be changed between reads
        self.deadline = deadline
        self.status = conn.status
        self.content_type = conn.content_type.decode("latin-1")

    @property
    def length(self) -> int | None:
        """The answer's ``Content-Length``, when it declared one."""
        return self._conn.length

    @property
    def retry_after(self) -> bytes | None:
        """The answer's ``Retry-After`` header, as sent."""
        return self._conn.retry_after

    async def chunk(self) -> bytes:
        """Body bytes as they arrive; ``b""`` at the end. An idle wait longer than the
        request's ``idle_s``, or reaching its ``deadline``, raises ``TimeoutError``."""
        return await self._conn.chunk(self.idle_s, self.deadline)

    async def read(self, limit: int | None = None) -> bytes:
        """The rest of the body, or its first ``limit`` bytes."""
        parts: list[bytes] = []
        size = 0
        while limit is None or size < limit:
            data = await self.chunk()
            if not data:
                break
            parts.append(data)
            size += len(data)
        body = b"".join(parts)
        return body if limit is None else body[:limit]

    @property
    def ended(self) -> bool:
        return self._conn.complete

    def release(self) -> None:
        """Done with the answer: its connection is reused if the answer ended cleanly."""
        self._client.release(self._origin, self._conn)
        self._client.done_with(self._conn.received)

    def close(self) -> None:
        """Abandon the answer and its connection."""
        self._conn.close()
        self._client.done_with(self._conn.received)


class Client:
    """Connections per origin, at most ``max_connections`` open in all."""

    def __init__(
        self,
        *,
        max_connections: int = 1024,
        keepalive_s: float = 30.0,
        tls: ssl.SSLContext | None = None,
        trimmer: Trimmer | None = None,
    ) -> None:
        """``tls`` verifies ``https://`` upstreams; by default the system's CAs.
        ``trimmer`` is told of every answer done with, to give large ones' memory back."""
        self._trimmer = trimmer
        self._max = max_connections
        self._keepalive_s = keepalive_s
        self._idle: dict[Origin, list[_Connection]] = {}
        self._open = 0  # connections open or being opened
        self._slots: deque[asyncio.Future[None]] = deque()
        self._tls = tls
        self._all: set[_Connection] = set()

    async def request(
        self,
        method: bytes,
        url: str,
        headers: Mapping[str, str],
        body: bytes = b"",
        *,
        connect_s: float,
        idle_s: float,
        deadline: float | None = None,
    ) -> Response:
        """Send one request and wait for the answer's status line and headers; its body is
        read by ``deadline`` (loop time) or not at all. A kept-alive
        connection that the upstream had closed before answering anything is replaced by a
        new one once: the upstream dropped an idle connection as the request went out."""
        origin, target = split(url)
        data = _encode(method, target, origin.host_header, headers, body)
        while True:
            conn = await self._acquire(origin, connect_s)
            try:
                conn.send(data)
                await conn.head(idle_s)
            except Disconnected:
                conn.close()
                if conn.reused:
                    continue
                raise
            except BaseException:
                conn.close()
                raise
            return Response(self, origin, conn, idle_s, deadline)

    def release(self, origin: Origin, conn: _Connection) -> None:
        """Reuse ``conn`` once its answer has ended; close it if that takes too long."""
        if conn.reusable:
            self._keep(origin, conn)
        elif conn.complete or conn.closed or conn.error is not None or not conn.head_done:
            conn.close()
        else:
            timer = asyncio.get_running_loop().call_later(_LINGER_S, conn.close)

            def ended() -> None:
                timer.cancel()
                conn.on_complete = None
                if conn.reusable:
                    self._keep(origin, conn)
                else:
                    conn.close()

            conn.on_complete = ended

    def done_with(self, size: int) -> None:
        """An answer of ``size`` body bytes is done with."""
        if self._trimmer is not None:
            self._trimmer.freed(size)

    def _keep(self, origin: Origin, conn: _Connection) -> None:
        conn.idle_since = asyncio.get_running_loop().time()
        self._idle.setdefault(origin, []).append(conn)
        self._wake_one()

    async def close(self) -> None:
        if self._trimmer is not None:
            self._trimmer.close()
        for conn in list(self._all):
            conn.close()
        self._idle.clear()
        await asyncio.sleep(0)  # let the transports finish closing

    async def _acquire(self, origin: Origin, connect_s: float) -> _Connection:
        loop = asyncio.get_running_loop()
        while True:
            idle = self._idle.get(origin)
            while idle:
                conn = idle.pop()
                if not conn.closed and loop.time() - conn.idle_since < self._keepalive_s:
                    conn.reused = True
                    return conn
                conn.close()
            if self._open < self._max:
                break
            self._close_an_idle_one()  # its slot comes free when it has closed
            slot = loop.create_future()
            self._slots.append(slot)
            await slot
        self._open += 1
        try:
            conn = await self._connect(loop, origin, connect_s)
        except BaseException:
            self._free_slot()
            raise
        conn.holds_slot = True
        self._all.add(conn)
        if conn.closed:
            self._lost(conn)
            raise Disconnected("the upstream closed the connection as it was made")
        return conn

    def _close_an_idle_one(self) -> None:
        for idle in self._idle.values():
            if idle:
                idle.pop(0).close()
                return

    async def _connect(
        self, loop: asyncio.AbstractEventLoop, origin: Origin, connect_s: float
    ) -> _Connection:
        tls = None
        if origin.scheme == "https":
            tls = self._tls = self._tls or ssl.create_default_context()
        try:
            async with asyncio.timeout(connect_s):
                _, conn = await loop.create_connection(
                    lambda: _Connection(loop, self._lost),
                    origin.host,
                    origin.port,
                    ssl=tls,
                    server_hostname=origin.host if tls else None,
                )
        except OSError as exc:
            raise ConnectError(str(exc) or type(exc).__name__) from exc
        return conn

    def _lost(self, conn: _Connection) -> None:
        self._all.discard(conn)
        if conn.holds_slot:
            conn.holds_slot = False
            self._free_slot()

    def _free_slot(self) -> None:
        self._open -= 1
        self._wake_one()

    def _wake_one(self) -> None:
        while self._slots:
            slot = self._slots.popleft()
            if not slot.done():
                slot.set_result(None)
                return


def _encode(
    method: bytes, target: bytes, host: bytes, headers: Mapping[str, str], body: bytes
) -> bytes:
    parts = [method, b" ", target, b" HTTP/1.1\r\nhost: ", host, b"\r\n"]
    for name, value in headers.items():
        if "\n" in value or "\r" in value or "\n" in name or "\r" in name:
            raise ValueError(f"header {name!r} holds a line break")
        parts += [name.encode("latin-1"), b": ", value.encode("latin-1"), b"\r\n"]
    if body or method != b"GET":
        parts += [b"content-length: ", str(len(body)).encode(), b"\r\n"]
    parts += [b"\r\n", body]
    return b"".join(parts)
