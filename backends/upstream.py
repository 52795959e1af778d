"""Step 5 of a request, on the wire: one POST to one OpenAI-compatible endpoint, streamed
(or, for pools that allow it, one whole non-streamed answer), or one request of any method
whose answer passes through as it came (``exchange``: the engine's other routes).

Uses one ``backends/http1.py`` client (keep-alive connections per endpoint, a limit on
connections): the gateway spends a third to two fifths less CPU per request on it than on
aiohttp (bench/RESULTS.md, "Upstream HTTP client", has the figures). Every client and socket
exception is mapped to ``backends.errors`` inside ``_mapped`` and nowhere else.

A stream's first events are the upstream's answer as much as its status line is. vLLM checks
some fields only once the engine takes the request, after it has answered 200, and then
sends the error as the first event (``{"error": {..., "code": 400}}``); such an event, or one
right after the chat role chunk, fails the open like an HTTP error with that status would: a
4xx is ``UpstreamRejected`` carrying the event as the body, anything else ``Unavailable``.
Messages and Responses streams open with events written before the engine's first output
(``message_start``; ``response.created``, ``response.in_progress``): the events after them
are read and checked the same way before the stream counts as open (an ``error`` event, a
``response.failed``; Anthropic's error types give the client's statuses). How a stream
opens, and where an opening event carries its error, is its API's to say (``Opening``;
``gateway/apis/`` gives one for each API); this module applies it.

What is not an answer is not passed on as one (``BadAnswer``, and the pools try another
endpoint): a 200 whose whole body, or whose stream's first event, is not a JSON object, and
more than ``max_response_bytes`` of a whole body or of one event. Bodies are read chunk by
chunk and given up at the bound, so memory stays bounded whatever an upstream sends.

Every request has a ``deadline`` (loop time): the pools give it the request's first rung's
``total_s`` from when the request came, and every try, every wait and every read of a body
ends there. An answer still coming then is ``AnswerTimeout``; one not started,
``UpstreamTimeout``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import orjson

from backends.errors import (
    ANTHROPIC_STATUS,
    AnswerTimeout,
    BackendError,
    BadAnswer,
    StreamBroken,
    Unavailable,
    UpstreamRejected,
    UpstreamTimeout,
)
from backends.http1 import BadResponse, Client, ConnectError, Disconnected, Response
from backends.memory import Trimmer, libc_trim
from backends.sse import EventDecoder, SSEDecoder, data_of

DONE = b"[DONE]"
_ERROR_BODY_LIMIT = 64 * 1024
_RETRY_AFTER_MAX_S = 3600.0  # an upstream's Retry-After is kept up to this
_MAX_PRELUDES = 8
MAX_RESPONSE_BYTES = 32 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class Timeouts:
    """A pool's bounds on its answers: ``connect_s`` a connection, ``first_byte_s`` a
    stream's first event, ``idle_s`` the quiet between two reads, and ``total_s`` the whole
    request, every try included (the first rung's, from when the request came)."""

    connect_s: float = 2.0
    first_byte_s: float = 60.0
    idle_s: float = 60.0
    total_s: float = 600.0


def error_object(event: dict[str, Any]) -> dict[str, Any] | None:
    """The error an event carries: chat's and Anthropic's under ``error``, the Responses
    API's ``error`` event itself, a failed response's ``response.error``."""
    kind = event.get("type")
    inner = event.get("error")
    if isinstance(inner, dict):
        return inner
    if kind == "error":
        return event
    response = event.get("response")
    if kind == "response.failed" and isinstance(response, dict):
        failed = response.get("error")
        return failed if isinstance(failed, dict) else {}
    return None


@dataclass(frozen=True, slots=True)
class Opening:
    """How one API's stream opens, for ``UpstreamStream.read_first``: its API's to say
    (``gateway/apis/``), the backend's to apply.

    ``events``: the stream is read as whole events (``backends/sse.py``'s ``EventDecoder``,
    the APIs whose streams are relayed as they came), not data payloads ended by ``[DONE]``.
    ``preludes``: the types of the events such a stream opens with before the engine's
    first output (vLLM writes them when its chat stream's role chunk comes, so an error the
    engine finds after accepting the request follows them, as it follows the role chunk in
    a data stream). ``error``: the error object an opening event carries, if any."""

    events: bool = False
    preludes: frozenset[str] = frozenset()
    error: Callable[[dict[str, Any]], dict[str, Any] | None] = error_object


DATA = Opening()  # a stream of data payloads ended by [DONE]: chat and text completions


@dataclass(frozen=True, slots=True)
class Reply:
    """An upstream's whole answer to ``exchange``, as it came."""

    status: int
    content_type: str
    body: bytes


@contextmanager
def _mapped(started: bool, deadline: float | None = None) -> Iterator[None]:
    """Translate the HTTP client's exceptions; after the first event every failure is a
    break, and a timeout at ``deadline`` the request's time running out."""
    try:
        yield
    except TimeoutError as exc:
        if started and past(deadline):
            raise AnswerTimeout("the answer did not end within the request's total_s") from exc
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

    Its events are data payloads, ending with ``[DONE]``; when its ``opening`` says
    ``events`` (the APIs whose streams are relayed as they came: Anthropic's Messages,
    OpenAI's Responses) they are whole events (``backends/sse.py``'s ``EventDecoder``), and
    the end of the body ends the stream too, as it does for those APIs: whether the stream
    said all it had to is then for the reader of its events to tell."""

    __slots__ = (
        "_decoder",
        "_events",
        "_limit",
        "_opening",
        "_pending",
        "_received",
        "_response",
        "done",
        "first",
    )

    def __init__(
        self, response: Response, limit: int = MAX_RESPONSE_BYTES, *, opening: Opening = DATA
    ) -> None:
        self._response = response
        events = opening.events
        self._decoder: SSEDecoder | EventDecoder = EventDecoder() if events else SSEDecoder()
        self._events = events
        self._opening = opening
        self._limit = limit  # bytes of one event
        self._pending: list[bytes] = []
        self._received = False  # any byte of the body
        self.first = b""
        self.done = False

    async def _fill(self) -> bytes:
        """The next event, left in ``_pending``."""
        while not self._pending:
            with _mapped(started=False):
                chunk = await self._response.chunk()
            if not chunk and self._received:  # an HTML page, say
                raise BadAnswer("upstream answered 200 with a body that holds no event")
            if not chunk:
                raise Unavailable("upstream closed the stream before its first event")
            self._received = True
            self._pending = self._feed(chunk, BadAnswer)
        return self._pending[0]

    def _feed(self, chunk: bytes, error: type[BackendError]) -> list[bytes]:
        events = self._decoder.feed(chunk)
        if self._decoder.buffered > self._limit:
            self._drop()  # the frames of the error's traceback hold this stream
            raise error(f"upstream sent an event of more than {self._limit} bytes")
        return events

    def _drop(self) -> None:
        """Forget what was read and not passed on: a failed stream may outlive its request
        in an error's traceback, and what it read (up to ``limit``) must not."""
        self._decoder = EventDecoder() if self._events else SSEDecoder()
        self._pending = []

    async def read_first(self) -> bytes:
        """The first event, checked: one that is not a JSON object (``[DONE]`` included)
        raises ``BadAnswer``, an error event as for its status, and a chat stream's role
        chunk is checked together with the event after it."""
        self.first = await self._fill()
        self._pending.pop(0)
        if self.first == DONE:  # an empty answer: no event to pass on as one
            raise BadAnswer("upstream ended its stream before its first event")
        error = self._opening.error
        if self._events:
            await self._past_preludes(_check_event(data_of(self.first) or b"", error))
        else:
            _check_event(self.first, error)
            if _is_prelude(self.first):
                second = await self._fill()
                if second != DONE:
                    _check_event(second, error)
        return self.first

    async def _past_preludes(self, event: dict[str, Any]) -> None:
        """Check the events after an opening prelude (``Opening.preludes``) up to the first
        that is not one, leaving them all pending: an error among them fails the open, so the
        request goes elsewhere before any byte is sent."""
        index, preludes = 0, self._opening.preludes
        while event.get("type") in preludes and index < _MAX_PRELUDES:
            while len(self._pending) <= index:
                with _mapped(started=False):
                    chunk = await self._response.chunk()
                if not chunk:
                    return  # the end of the body: for the reader of the events to judge
                self._pending += self._feed(chunk, BadAnswer)
            if self._pending[index] == DONE:
                return
            event = _check_event(data_of(self._pending[index]) or b"", self._opening.error)
            index += 1

    @property
    def limit(self) -> int:
        """Bytes one event, or an answer assembled from the stream, may take."""
        return self._limit

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
            with _mapped(started=True, deadline=self._response.deadline):
                chunk = await self._response.chunk()
            if not chunk and self._events and not self._decoder.pending.strip():
                self.done = True  # the body ended, between events
                return
            if not chunk:
                raise StreamBroken("upstream ended the stream without [DONE]")
            self._pending = self._feed(chunk, StreamBroken)

    def close(self) -> None:
        """Release the connection; one that has not finished is closed, so upstream aborts."""
        if self.done:
            self._response.release()
        else:
            self._response.close()
            self._drop()


class Upstream:
    """Owns the HTTP client; opens streams to endpoints."""

    def __init__(
        self,
        *,
        max_connections: int = 1024,
        keepalive_s: float = 30.0,
        max_response_bytes: int = MAX_RESPONSE_BYTES,
    ) -> None:
        self._max_connections = max_connections
        self._keepalive_s = keepalive_s
        self.max_response_bytes = max_response_bytes
        self._client: Client | None = None

    async def start(self) -> None:
        trimmer = Trimmer(asyncio.get_running_loop(), libc_trim())
        self._client = Client(
            max_connections=self._max_connections, keepalive_s=self._keepalive_s, trimmer=trimmer
        )

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None

    def _post(
        self,
        url: str,
        body: bytes,
        headers: Mapping[str, str],
        timeouts: Timeouts,
        idle_s: float,
        deadline: float | None,
    ) -> Awaitable[Response]:
        assert self._client is not None, "Upstream.start() was not awaited"
        return self._client.request(
            b"POST",
            url,
            headers,
            body,
            connect_s=timeouts.connect_s,
            idle_s=idle_s,
            deadline=deadline,
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
                body = await _read_whole(response, self.max_response_bytes)
        return body.decode(errors="replace")

    async def complete(
        self,
        url: str,
        body: bytes,
        headers: Mapping[str, str],
        timeouts: Timeouts,
        deadline: float | None = None,
    ) -> tuple[bytes, dict[str, Any]]:
        """POST a non-streaming request and read the whole answer: its bytes and the JSON
        object they hold (``BadAnswer`` when they hold none, or are more than
        ``max_response_bytes``). A body that fails after a successful head is
        ``StreamBroken``: the answer had started. The head comes when the answer is done, so
        only ``deadline`` bounds the wait (a hung server is noticed by the outlier detector:
        ``Pools.complete`` gives up on an endpoint ejected meanwhile)."""
        deadline = _sooner(deadline, timeouts.total_s)
        response: Response | None = None
        try:
            async with asyncio.timeout_at(deadline):
                with _mapped(started=False):
                    idle_s = timeouts.total_s
                    response = await self._post(url, body, headers, timeouts, idle_s, deadline)
                response.idle_s = timeouts.idle_s  # the body has begun: it must keep coming
                with _mapped(started=response.status < 400, deadline=deadline):
                    whole = await _read_whole(response, self.max_response_bytes)
        except TimeoutError as exc:
            if response is not None and response.status < 400:
                raise AnswerTimeout("the answer did not end within the request's total_s") from exc
            raise UpstreamTimeout("no answer from upstream in time") from exc
        return whole, _json_object(whole)

    async def exchange(
        self,
        method: str,
        url: str,
        body: bytes,
        headers: Mapping[str, str],
        timeouts: Timeouts,
        deadline: float | None = None,
        *,
        json: bool = False,
    ) -> Reply:
        """One request whose answer is passed on as it came, a 4xx included (the request's
        own fault); a 5xx, 408 or 429 raises ``Unavailable``, so another endpoint may serve,
        and ``deadline`` (else ``total_s``) bounds the whole exchange. An answer of more than
        ``max_response_bytes`` is ``BadAnswer``, and so is, with ``json`` (a route that
        answers a JSON object), a 2xx whose body is not one (an HTML page)."""
        assert self._client is not None, "Upstream.start() was not awaited"
        deadline = _sooner(deadline, timeouts.total_s)
        limit = self.max_response_bytes
        response: Response | None = None
        try:
            async with asyncio.timeout_at(deadline):
                with _mapped(started=False):
                    response = await self._client.request(
                        method.encode("ascii"),
                        url,
                        headers,
                        body,
                        connect_s=timeouts.connect_s,
                        idle_s=timeouts.total_s,
                        deadline=deadline,
                    )
                    if response.status >= 500 or response.status in (408, 429):
                        await _read_whole(response, limit)  # raises Unavailable
                response.idle_s = timeouts.idle_s  # the body has begun: it must keep coming
                with _mapped(started=True, deadline=deadline):
                    answer = await _read_any(response, limit)
        except TimeoutError as exc:
            if response is not None:
                raise AnswerTimeout("the answer did not end within the request's total_s") from exc
            raise UpstreamTimeout("no answer from upstream in time") from exc
        assert response is not None
        if json and 200 <= response.status < 300:
            _json_object(answer)
        return Reply(response.status, response.content_type, answer)

    async def open(
        self,
        url: str,
        body: bytes,
        headers: Mapping[str, str],
        timeouts: Timeouts,
        deadline: float | None = None,
        opening: Opening = DATA,
    ) -> UpstreamStream:
        """POST ``body`` and wait for the first event (read as its API's ``opening`` says,
        see ``UpstreamStream``); raise a ``BackendError`` otherwise. The stream's reads end
        at ``deadline`` too."""
        with _mapped(started=False):
            loop = asyncio.get_running_loop()
            first_by = loop.time() + timeouts.first_byte_s
            async with asyncio.timeout_at(
                first_by if deadline is None else min(first_by, deadline)
            ):
                idle_s = timeouts.idle_s
                response = await self._post(url, body, headers, timeouts, idle_s, deadline)
                try:
                    if response.status >= 400:
                        await _raise_for(response)
                    stream = UpstreamStream(response, self.max_response_bytes, opening=opening)
                    await stream.read_first()
                except BaseException:
                    response.close()
                    raise
        return stream


def past(deadline: float | None) -> bool:
    """Whether ``deadline`` (loop time) has come."""
    return deadline is not None and asyncio.get_running_loop().time() >= deadline - 1e-3


def _sooner(deadline: float | None, seconds: float) -> float:
    """``deadline``, or ``seconds`` from now if that comes first."""
    by = asyncio.get_running_loop().time() + seconds
    return by if deadline is None else min(by, deadline)


async def _read_whole(response: Response, limit: int) -> bytes:
    """The whole body, read chunk by chunk and given up past ``limit`` bytes, or at once
    when its ``Content-Length`` says it is larger (``BadAnswer``);
    ``BackendError`` for an error status. A connection whose answer was read is reused, one
    abandoned half-way (a timeout, a cancelled request, a body too large) closed."""
    try:
        if response.status >= 400:
            await _raise_for(response)
        if response.length is not None and response.length > limit:
            raise BadAnswer(f"the upstream's answer is larger than {limit} bytes")
        parts: list[bytes] = []
        size = 0
        while data := await response.chunk():
            size += len(data)
            if size > limit:
                parts.clear()  # this frame outlives the call in the error's traceback
                raise BadAnswer(f"the upstream's answer is larger than {limit} bytes")
            parts.append(data)
    except (BadAnswer, UpstreamRejected, Unavailable) as exc:
        if isinstance(exc, BadAnswer):
            response.close()
        else:
            response.release()
        raise
    except BaseException:
        response.close()
        raise
    response.release()
    return b"".join(parts)


def _json_object(body: bytes) -> dict[str, Any]:
    """The JSON object a 200 answer holds; ``BadAnswer`` when it holds none (an HTML page,
    SSE text)."""
    try:
        answer = orjson.loads(body)
    except orjson.JSONDecodeError:
        answer = None
    if not isinstance(answer, dict):
        raise BadAnswer(f"upstream answered a success with no JSON object: {body[:80]!r}")
    return answer


async def _read_any(response: Response, limit: int) -> bytes:
    """The whole body, whatever the status; ``BadAnswer`` past ``limit`` bytes."""
    try:
        body = b"" if (response.length or 0) > limit else await response.read(limit + 1)
        if len(body) > limit or (response.length or 0) > limit:
            del body  # this frame outlives the call in the error's traceback
            raise BadAnswer(f"the upstream's answer is larger than {limit} bytes")
    except BaseException:
        response.close()
        raise
    response.release()
    return body


async def _raise_for(response: Response) -> None:
    body = await response.read(_ERROR_BODY_LIMIT)
    _raise_status(response.status, body, _seconds(response.retry_after))


def _seconds(retry_after: bytes | None) -> float | None:
    """A ``Retry-After`` of delta-seconds, up to an hour; ``None`` for none or a date."""
    if retry_after is None or not retry_after.strip().isdigit():
        return None
    return min(float(retry_after.strip()), _RETRY_AFTER_MAX_S)


def _raise_status(status: int | None, body: bytes, told_s: float | None = None) -> None:
    if status is None or status in (408, 429) or status >= 500:
        message = f"upstream answered {status or 'an error'}"
        suspect = status == 500 and _is_error_object(body)
        raise Unavailable(message, status, told_s, suspect=suspect)
    raise UpstreamRejected(status, body)


def _is_error_object(body: bytes) -> bool:
    """Whether ``body`` is an error in an engine's API shape: OpenAI's ``{"error": {...}}``,
    Anthropic's ``{"type": "error", ...}`` (an HTML page from a proxy in front is not)."""
    try:
        answer = orjson.loads(body)
    except orjson.JSONDecodeError:
        return False
    return isinstance(answer, dict) and error_object(answer) is not None


def _check_event(
    data: bytes, error_of: Callable[[dict[str, Any]], dict[str, Any] | None]
) -> dict[str, Any]:
    """The opening event, parsed. Raise ``BadAnswer`` when it is not a JSON object, and as
    for an HTTP error when it is an error instead of a chunk, as ``error_of`` reads it
    (``error_object``: chat's ``{"error": {...}}``, an Anthropic or Responses ``error``
    event, or ``response.failed``); Anthropic's error types give the client's statuses."""
    try:
        event = orjson.loads(data)
    except orjson.JSONDecodeError:
        event = None
    if not isinstance(event, dict):
        raise BadAnswer(f"upstream opened its stream with no JSON object: {data[:80]!r}")
    if b'"error"' not in data or event.get("choices"):
        return event
    error = error_of(event)
    if error is None:
        return event
    code, kind = error.get("code"), error.get("type")
    status = code if isinstance(code, int) and 400 <= code <= 599 else None
    if status is None and isinstance(kind, str):
        status = ANTHROPIC_STATUS.get(kind)
    _raise_status(status, data)
    return event


def _is_prelude(data: bytes) -> bool:
    """A chat stream's role chunk (``"delta":{"role":"assistant","content":""}``), told by
    its bytes: parsing it here would cost as much as the relay's own parse of it. Telling
    wrongly costs nothing: one more event read when it comes with this one, or an error
    event right after a role chunk left to the relay."""
    return b'"role"' in data and b'"content":""' in data
