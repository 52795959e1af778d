"""Step 5 of a request, on the wire: one POST to one OpenAI-compatible endpoint, streamed
(or, for pools that allow it, one whole non-streamed answer).

Uses one shared aiohttp session (keep-alive, connection limits). aiohttp rather than httpx:
on the same machine httpx took 3.2x as long per streamed round trip with one in flight and
delivered 1/17 of the throughput with 64 (bench/RESULTS.md, "Upstream HTTP client").
Every aiohttp and socket exception is mapped to ``backends.errors`` inside ``_mapped`` and
nowhere else.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

import aiohttp

from backends.errors import (
    StreamBroken,
    Unavailable,
    UpstreamRejected,
    UpstreamTimeout,
)
from backends.sse import SSEDecoder

DONE = b"[DONE]"
_ERROR_BODY_LIMIT = 64 * 1024


@dataclass(frozen=True, slots=True)
class Timeouts:
    """``total_s`` bounds a whole non-streamed answer, which has no first byte before it."""

    connect_s: float = 2.0
    first_byte_s: float = 60.0
    idle_s: float = 60.0
    total_s: float = 600.0


@contextmanager
def _mapped(started: bool) -> Iterator[None]:
    """Translate the HTTP client's exceptions; after the first event every failure is a break."""
    try:
        yield
    except (TimeoutError, aiohttp.ServerTimeoutError) as exc:
        if started:
            raise StreamBroken("upstream went quiet for longer than the idle timeout") from exc
        raise UpstreamTimeout("no answer from upstream in time") from exc
    except aiohttp.ClientConnectorError as exc:
        raise Unavailable(f"cannot connect: {exc.os_error or exc}") from exc
    except (aiohttp.ClientError, ConnectionError) as exc:
        if started:
            raise StreamBroken(f"upstream stream broke: {type(exc).__name__}") from exc
        raise Unavailable(f"upstream failed: {type(exc).__name__}: {exc}") from exc


class UpstreamStream:
    """An open upstream response: the first event already read, the rest to iterate."""

    __slots__ = ("_decoder", "_pending", "_response", "done", "first")

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response
        self._decoder = SSEDecoder()
        self._pending: list[bytes] = []
        self.first = b""
        self.done = False

    async def read_first(self) -> bytes:
        while not self._pending:
            chunk = await self._response.content.readany()
            if not chunk:
                raise Unavailable("upstream closed the stream before its first event")
            self._pending = self._decoder.feed(chunk)
        self.first = self._pending.pop(0)
        self.done = self.first == DONE
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
                chunk = await self._response.content.readany()
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
    """Owns the shared HTTP session; opens streams to endpoints."""

    def __init__(self, *, max_connections: int = 1024, keepalive_s: float = 30.0) -> None:
        self._max_connections = max_connections
        self._keepalive_s = keepalive_s
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        connector = aiohttp.TCPConnector(
            limit=self._max_connections, keepalive_timeout=self._keepalive_s, ttl_dns_cache=60
        )
        self._session = aiohttp.ClientSession(
            connector=connector, auto_decompress=False, skip_auto_headers=("User-Agent",)
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def fetch_text(self, url: str, timeout_s: float) -> str:
        """GET a small text page (a ``/metrics`` scrape); ``BackendError`` on failure."""
        assert self._session is not None, "Upstream.start() was not awaited"
        with _mapped(started=False):
            async with asyncio.timeout(timeout_s), self._session.get(url) as response:
                if response.status != 200:
                    raise Unavailable(f"{url} answered {response.status}", response.status)
                return await response.text()

    async def complete(
        self, url: str, body: bytes, headers: Mapping[str, str], timeouts: Timeouts
    ) -> bytes:
        """POST a non-streaming request and read the whole answer."""
        assert self._session is not None, "Upstream.start() was not awaited"
        with _mapped(started=False):
            async with asyncio.timeout(timeouts.total_s):
                response = await self._session.post(
                    url, data=body, headers=headers, timeout=_client_timeout(timeouts)
                )
                return await _read_whole(response)

    async def open(
        self, url: str, body: bytes, headers: Mapping[str, str], timeouts: Timeouts
    ) -> UpstreamStream:
        """POST ``body`` and wait for the first event; raise a ``BackendError`` otherwise."""
        assert self._session is not None, "Upstream.start() was not awaited"
        timeout = _client_timeout(timeouts)
        with _mapped(started=False):
            async with asyncio.timeout(timeouts.first_byte_s):
                response = await self._session.post(
                    url, data=body, headers=headers, timeout=timeout
                )
                try:
                    if response.status >= 400:
                        await _raise_for(response)
                    stream = UpstreamStream(response)
                    await stream.read_first()
                except BaseException:
                    response.close()
                    raise
        return stream


@functools.lru_cache(maxsize=64)
def _client_timeout(timeouts: Timeouts) -> aiohttp.ClientTimeout:
    """One ClientTimeout per pool's settings, not one per request."""
    return aiohttp.ClientTimeout(sock_connect=timeouts.connect_s, sock_read=timeouts.idle_s)


async def _read_whole(response: aiohttp.ClientResponse) -> bytes:
    try:
        if response.status >= 400:
            await _raise_for(response)
        return await response.read()
    finally:
        response.release()


async def _raise_for(response: aiohttp.ClientResponse) -> None:
    body = await response.content.read(_ERROR_BODY_LIMIT)
    if response.status in (408, 429) or response.status >= 500:
        raise Unavailable(f"upstream answered {response.status}", response.status)
    raise UpstreamRejected(response.status, body)
