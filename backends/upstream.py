"""Step 5 of a request, on the wire: one POST to one OpenAI-compatible endpoint, streamed
(or, for pools that allow it, one whole non-streamed answer), or one request of any method
whose answer passes through as it came (``exchange``: the engine's other routes).

Uses one ``backends/http1.py`` client (keep-alive connections per endpoint, a limit on
connections): it costs a third to a fifth of the CPU per request that aiohttp did
(bench/RESULTS.md, "Upstream HTTP client", has the figures). Every client and socket
exception is mapped to ``backends.errors`` inside ``_mapped`` and nowhere else.

A stream's first events are the upstream's answer as much as its status line is. vLLM checks
some fields only once the engine takes the request, after it has answered 200, and then
sends the error as the first event (``{"error": {..., "code": 400}}``); such an event, or one
right after the chat role chunk, fails the open like an HTTP error with that status would: a
4xx is ``UpstreamRejected`` carrying the event as the body, anything else ``Unavailable``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

import orjson

from backends.errors import (
    BackendError,
    StreamBroken,
    Unavailable,
    UpstreamRejected,
    UpstreamTimeout,
)
from backends.http1 import BadResponse, Client, ConnectError, Disconnected, Response
from backends.sse import EventDecoder, SSEDecoder, data_of

DONE = b"[DONE]"
_ERROR_BODY_LIMIT = 64 * 1024


@dataclass(frozen=True, slots=True)
class Timeouts:
    """``total_s`` bounds a whole non-streamed answer, which has no first byte before it."""

    connect_s: float = 2.0
    first_byte_s: float = 60.0
    idle_s: float = 60.0
    total_s: float = 600.0


@dataclass(frozen=True, slots=True)
class Reply:
    """An upstream's whole answer to ``exchange``, as it came."""

    status: int
    content_type: str
    body: bytes


@contextmanager
def _mapped(started: bool) -> Iterator[None]:
    """Translate the HTTP client's exceptions; after the first event every failure is a break."""
    try:
        yield
    except TimeoutError as exc:
        if started:
            raise StreamBroken("upstream went quiet for longer than the idle timeout") from exc
        raise UpstreamTimeout("no answer from upstream in time") from exc
    except ConnectError as exc:
        raise Unavailable(f"cannot connect: {exc}") from exc
    except (Disconnected, BadResponse, ConnectionError) as exc:
        if started:
            raise StreamBroken(f"upstream stream broke: {exc}") from exc
        raise Unavailable(f"upstream failed: {type(exc).__name__}: {exc}") from exc


class UpstreamStream:
    """An open upstream response: the first event already read, the rest to iterate.

    Its events are data payloads, ending with ``[DONE]``; with ``events`` (the APIs whose
    streams are relayed as they came: Anthropic's Messages, OpenAI's Responses) they are
    whole events (``backends/sse.py``'s ``EventDecoder``), and the end of the body ends
    the stream too, as it does for those APIs: whether the stream said all it had to is
    then for the reader of its events to tell."""

    __slots__ = ("_decoder", "_events", "_pending", "_response", "done", "first")

    def __init__(self, response: Response, events: bool = False) -> None:
        self._response = response
        self._decoder: SSEDecoder | EventDecoder = EventDecoder() if events else SSEDecoder()
        self._events = events
        self._pending: list[bytes] = []
        self.first = b""
        self.done = False

    async def _fill(self) -> bytes:
        """The next event, left in ``_pending``."""
        while not self._pending:
            with _mapped(started=False):
                chunk = await self._response.chunk()
            if not chunk:
                raise Unavailable("upstream closed the stream before its first event")
            self._pending = self._decoder.feed(chunk)
        return self._pending[0]

    async def read_first(self) -> bytes:
        """The first event, checked: an error event raises, and a chat stream's role chunk
        is checked together with the event after it."""
        self.first = await self._fill()
        self._pending.pop(0)
        self.done = self.first == DONE
        if self._events and not self.done:
            _raise_for_event(data_of(self.first) or b"")
        elif not self.done:
            _raise_for_event(self.first)
            if _is_prelude(self.first):
                _raise_for_event(await self._fill())
        return self.first

    def take_pending(self) -> list[bytes]:
        """Events that arrived with the first one: the caller sends them together."""
        pending, self._pending = self._pending, []
        if DONE in pending:
            self.done = True
            pending = pending[: pending.index(DONE) + 1]
        return pending

    async def batches(self) -> AsyncIterator[list[bytes]]:
        """Data payloads after the first, as read from the socket together, ending with
        ``[DONE]``; ``StreamBroken`` if the stream ends or fails without it."""
        while not self.done:
            if self._pending:
                batch, self._pending = self._pending, []
                if DONE in batch:
                    self.done = True
                    batch = batch[: batch.index(DONE) + 1]
                yield batch
                continue
            with _mapped(started=True):
                chunk = await self._response.chunk()
            if not chunk and self._events and not self._decoder.pending.strip():
                self.done = True  # the body ended, between events
                return
            if not chunk:
                raise StreamBroken("upstream ended the stream without [DONE]")
            self._pending = self._decoder.feed(chunk)

    def close(self) -> None:
        """Release the connection; one that has not finished is closed, so upstream aborts."""
        if self.done:
            self._response.release()
        else:
            self._response.close()


class Upstream:
    """Owns the HTTP client; opens streams to endpoints."""

    def __init__(self, *, max_connections: int = 1024, keepalive_s: float = 30.0) -> None:
        self._max_connections = max_connections
        self._keepalive_s = keepalive_s
        self._client: Client | None = None

    async def start(self) -> None:
        self._client = Client(max_connections=self._max_connections, keepalive_s=self._keepalive_s)

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    def _post(
        self, url: str, body: bytes, headers: Mapping[str, str], timeouts: Timeouts, idle_s: float
    ) -> Awaitable[Response]:
        assert self._client is not None, "Upstream.start() was not awaited"
        return self._client.request(
            b"POST", url, headers, body, connect_s=timeouts.connect_s, idle_s=idle_s
        )

    async def fetch_text(self, url: str, timeout_s: float) -> str:
        """GET a small text page (a ``/metrics`` scrape); ``BackendError`` on failure."""
        assert self._client is not None, "Upstream.start() was not awaited"
        with _mapped(started=False):
            async with asyncio.timeout(timeout_s):
                response = await self._client.request(
                    b"GET", url, {}, connect_s=timeout_s, idle_s=timeout_s
                )
                if response.status != 200:
                    response.close()
                    raise Unavailable(f"{url} answered {response.status}", response.status)
                body = await _read_whole(response)
        return body.decode(errors="replace")

    async def complete(
        self, url: str, body: bytes, headers: Mapping[str, str], timeouts: Timeouts
    ) -> bytes:
        """POST a non-streaming request and read the whole answer. A body that fails after a
        successful head is ``StreamBroken``: the answer had started. The head comes when the
        answer is done, so only ``total_s`` bounds the wait (a hung server is noticed by the
        outlier detector: ``Pools.complete`` gives up on an endpoint ejected meanwhile)."""
        response: Response | None = None
        try:
            async with asyncio.timeout(timeouts.total_s):
                with _mapped(started=False):
                    response = await self._post(url, body, headers, timeouts, timeouts.total_s)
                with _mapped(started=response.status < 400):
                    return await _read_whole(response)
        except TimeoutError as exc:
            if response is not None and response.status < 400:
                raise StreamBroken("the answer did not end within the total timeout") from exc
            raise UpstreamTimeout("no answer from upstream in time") from exc

    async def exchange(
        self,
        method: str,
        url: str,
        body: bytes,
        headers: Mapping[str, str],
        timeouts: Timeouts,
    ) -> Reply:
        """One request whose answer is passed on as it came, a 4xx included (the request's
        own fault); a 5xx, 408 or 429 raises ``Unavailable``, so another endpoint may serve,
        and ``total_s`` bounds the whole exchange."""
        assert self._client is not None, "Upstream.start() was not awaited"
        response: Response | None = None
        try:
            async with asyncio.timeout(timeouts.total_s):
                with _mapped(started=False):
                    response = await self._client.request(
                        method.encode("ascii"),
                        url,
                        headers,
                        body,
                        connect_s=timeouts.connect_s,
                        idle_s=timeouts.total_s,
                    )
                    if response.status >= 500 or response.status in (408, 429):
                        await _read_whole(response)  # raises Unavailable
                with _mapped(started=True):
                    answer = await _read_any(response)
        except TimeoutError as exc:
            if response is not None:
                raise StreamBroken("the answer did not end within the total timeout") from exc
            raise UpstreamTimeout("no answer from upstream in time") from exc
        assert response is not None
        return Reply(response.status, response.content_type, answer)

    async def open(
        self,
        url: str,
        body: bytes,
        headers: Mapping[str, str],
        timeouts: Timeouts,
        events: bool = False,
    ) -> UpstreamStream:
        """POST ``body`` and wait for the first event (a whole one with ``events``, see
        ``UpstreamStream``); raise a ``BackendError`` otherwise."""
        with _mapped(started=False):
            async with asyncio.timeout(timeouts.first_byte_s):
                response = await self._post(url, body, headers, timeouts, timeouts.idle_s)
                try:
                    if response.status >= 400:
                        await _raise_for(response)
                    stream = UpstreamStream(response, events)
                    await stream.read_first()
                except BaseException:
                    response.close()
                    raise
        return stream


async def _read_whole(response: Response) -> bytes:
    """The whole body; ``BackendError`` for an error status. A connection whose answer was
    read is reused, one abandoned half-way (a timeout, a cancelled request) closed."""
    try:
        if response.status >= 400:
            await _raise_for(response)
        body = await response.read()
    except BackendError:
        response.release()
        raise
    except BaseException:
        response.close()
        raise
    response.release()
    return body


async def _read_any(response: Response) -> bytes:
    """The whole body, whatever the status."""
    try:
        body = await response.read()
    except BaseException:
        response.close()
        raise
    response.release()
    return body


async def _raise_for(response: Response) -> None:
    body = await response.read(_ERROR_BODY_LIMIT)
    _raise_status(response.status, body)


def _raise_status(status: int | None, body: bytes) -> None:
    if status is None or status in (408, 429) or status >= 500:
        raise Unavailable(f"upstream answered {status or 'an error'}", status)
    raise UpstreamRejected(status, body)


def _raise_for_event(data: bytes) -> None:
    """Raise as for an HTTP error when ``data`` is an error object instead of a chunk."""
    if b'"error"' not in data:
        return
    try:
        event = orjson.loads(data)
    except orjson.JSONDecodeError:
        return
    if not isinstance(event, dict) or event.get("choices"):
        return
    error = event.get("error")
    if not isinstance(error, dict):
        return
    code = error.get("code")
    status = code if isinstance(code, int) and 400 <= code <= 599 else None
    _raise_status(status, data)


def _is_prelude(data: bytes) -> bool:
    """A chat stream's role chunk (``"delta":{"role":"assistant","content":""}``), told by
    its bytes: parsing it here would cost as much as the relay's own parse of it. Telling
    wrongly costs nothing: one more event read when it comes with this one, or an error
    event right after a role chunk left to the relay."""
    return b'"role"' in data and b'"content":""' in data
