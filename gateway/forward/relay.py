"""Step 8 of a request: relay upstream events to the client, measuring them on the way.

One relay for every API, parameterised by the API's dialect (``gateway/measure/answer.py``):
``Relay.sse`` yields SSE bytes for a streaming client batch by batch as the upstream's bytes
arrive; ``Relay.collect`` folds the whole stream into one JSON body. Both read every event
once, in the answer's dialect, into its ``Measurement`` (steps 6 and 7). The dialect says
how the stream is passed on:

- **Chunks** (``last`` None: chat and text completions): data payloads ending with
  ``[DONE]``. The usage chunk (asked of upstream always) is passed on only when the client
  asked for usage; a chunk the engine adds of its own on the gateway's account
  (``Engine.own``, ``gateway/engines/``) only when the client asked for it too. A
  whole answer for a non-streaming client is assembled from them (``collect``), and a
  client error found there still answers that client with its status.
- **Events** (Anthropic's Messages, OpenAI's Responses): each event (``backends/sse.py``'s
  ``EventDecoder``: its ``event:`` line, its data, as the upstream wrote them) passed on
  unchanged. The answer ends well at one of its dialect's ``last`` events
  (``message_stop``; ``response.completed``), followed by the end of the body (vLLM 0.32's
  streams of both) or by a ``[DONE]``, passed on, where a server sends one.

An upstream error event is passed on and ends the stream. A stream that ends or breaks
before its end (a ``[DONE]`` before the last event of an event stream included, which is
not passed on) ends with an error event of the gateway's own, in the API's shape
(``gateway/errors.py``; a Responses one numbered after the last it relayed): after the
first byte a failure is never a silent end. After an event stream's last event, a break or
a stall of the upstream is no failure: the answer was whole. (An error event that opens the
stream never gets here: ``backends/upstream.py`` turns it into the upstream's answer.) The
measurement finishes in ``finally``: finished, failed and cancelled streams all count.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import orjson

from backends.errors import AnswerTimeout, StreamBroken, UpstreamRejected
from backends.pool import Opened
from backends.sse import data_of
from backends.upstream import DONE
from gateway.errors import Shape, UpstreamErrorEvent, from_backend
from gateway.forward.assemble import Assembler
from gateway.measure.acceptance import Status
from gateway.measure.answer import Dialect, Measurement

_DONE_EVENT = b"data: [DONE]\n\n"


class Relay:
    """One upstream stream, read once, for one client; measured by ``measurement`` and read
    in ``dialect``, which says how it is passed on. ``shape``: the shape of the gateway's
    own error event; ``include_usage``: the chunk stream's client asked for usage;
    ``own_asked``: it asked itself for what the engine adds in chunks of its own
    (``Engine.own``, the measurement's engine's), which are dropped otherwise."""

    __slots__ = (
        "_clock",
        "_dialect",
        "_error",
        "_events",
        "_measurement",
        "_opened",
        "_pass",
        "_shape",
        "_status",
    )

    def __init__(
        self,
        opened: Opened,
        measurement: Measurement,
        dialect: Dialect,
        *,
        clock: Callable[[], float],
        shape: Shape = "openai",
        include_usage: bool = True,
        own_asked: bool = False,
    ) -> None:
        self._opened = opened
        self._measurement = measurement
        self._dialect = dialect
        self._clock = clock
        self._shape = shape
        last = dialect.last
        self._pass: _Chunks | _Events = (
            _Chunks(include_usage, measurement.engine.own, own_asked)
            if last is None
            else _Events(last)
        )
        self._events = last is not None
        self._error = ""
        self._status = Status.CANCELLED

    async def _batches(self) -> AsyncIterator[list[bytes]]:
        stream = self._opened.stream
        yield [stream.first, *stream.take_pending()]
        async for batch in stream.batches():
            yield batch

    @property
    def finished(self) -> bool:
        """The last batch has been produced: the client's answer is complete."""
        return self._status is not Status.CANCELLED

    def _read(
        self, data: bytes, now: float
    ) -> tuple[dict[str, Any], tuple[str, int | None] | None]:
        """One event, parsed and measured; its failure when it is an error event."""
        event = orjson.loads(data)
        if not isinstance(event, dict):
            raise StreamBroken("upstream sent an event that is not a JSON object")
        return event, self._dialect.event(self._measurement, event, now)

    async def sse(self) -> AsyncIterator[bytes]:
        passing, events = self._pass, self._events
        add, measure, measurement = passing.add, self._dialect.event, self._measurement
        try:
            async for batch in self._batches():
                now = self._clock()
                out: list[bytes] = []
                for item in batch:  # the hot path: one pass per chunk, its steps inline
                    if item == DONE:
                        passing.end(out)
                        if passing.ended:
                            self._status = Status.OK
                        break
                    data = data_of(item) if events else item
                    if data is None:  # an event with no data: passed on, nothing to read
                        add(item, None, out)
                        continue
                    event = orjson.loads(data)
                    if not isinstance(event, dict):
                        raise StreamBroken("upstream sent an event that is not a JSON object")
                    failure = measure(measurement, event, now)
                    add(item, event, out)
                    if failure is not None:  # passed on; the answer failed
                        self._fail(failure[0])
                        break
                yield b"".join(out)
                if self._status is not Status.CANCELLED:
                    return
            if not passing.ended:
                raise StreamBroken("upstream ended the stream before its last event")
            self._status = Status.OK
        except (StreamBroken, orjson.JSONDecodeError) as exc:
            if passing.ended:  # after the answer's last event: what follows is not its part
                self._status = Status.OK
                return
            self._fail(f"stream broke after it started: {exc}")
            # past the first byte nothing can be tried again: the client is told here
            late = isinstance(exc, AnswerTimeout)  # the request's time ran out: a timeout
            failed = from_backend((AnswerTimeout if late else StreamBroken)(self._error))
            yield passing.rest() + failed.sse(self._shape, passing.next)
        finally:
            self._finish()

    async def collect(self, chat: bool) -> dict[str, Any]:
        """The whole answer of a chunk stream as one body, of at most the stream's ``limit``
        bytes of events (``max_response_bytes``). A stream that broke, or grew past it,
        raises ``StreamBroken`` and an error event ``UpstreamErrorEvent``
        (``UpstreamRejected`` for a 4xx code): the caller decides whether to try again."""
        assembler = Assembler(chat)
        size, limit = 0, self._opened.stream.limit
        try:
            async for batch in self._batches():
                now = self._clock()
                for data in batch:
                    if data == DONE:
                        self._status = Status.OK
                        return assembler.body()
                    size += len(data)
                    if size > limit:
                        raise StreamBroken(f"the answer grew past {limit} bytes")
                    event, failure = self._read(data, now)
                    if failure is not None:
                        raise UpstreamErrorEvent(data, *failure)
                    assembler.add(event)
            raise StreamBroken("upstream ended without [DONE]")
        except UpstreamErrorEvent as exc:
            self._fail(str(exc))
            if exc.status is not None and exc.status < 500:
                # a client error the upstream found late: still its answer to this request
                raise UpstreamRejected(exc.status, exc.payload, self._opened.spec.name) from None
            raise
        except (StreamBroken, orjson.JSONDecodeError) as exc:
            self._fail(f"stream broke after it started: {exc}")
            late = isinstance(exc, AnswerTimeout)
            raise (AnswerTimeout if late else StreamBroken)(self._error) from None
        finally:
            self._finish()

    def _fail(self, error: str) -> None:
        self._status = Status.ERROR
        self._error = error

    def _finish(self) -> None:
        self._opened.close(failed=self._status is Status.ERROR)
        self._measurement.finish(self._status, self._error)


class _Chunks:
    """How a stream of data chunks is passed on (chat and text completions)."""

    __slots__ = ("ended", "held", "include_usage", "own", "own_asked")
    next = 0  # their error events are not numbered

    def __init__(
        self,
        include_usage: bool,
        own: Callable[[Mapping[str, Any]], bool] | None,
        own_asked: bool,
    ) -> None:
        self.include_usage = include_usage
        self.own = own
        self.own_asked = own_asked
        self.held: dict[str, Any] | None = None  # the last choice's end, waiting for usage
        self.ended = False

    def add(self, data: bytes, chunk: dict[str, Any] | None, out: list[bytes]) -> None:
        """Add what the client gets of one upstream chunk to ``out``, holding back the end
        of the last choice for the fingerprint of a usage chunk the client did not ask for."""
        assert chunk is not None
        if self.own is not None and self.own(chunk):
            if self.own_asked:  # the engine's own chunk: asked for on the client's account too
                out.append(b"data: " + data + b"\n\n")
            return
        if self.include_usage:
            out.append(b"data: " + data + b"\n\n")
        elif chunk.get("choices") or "usage" not in chunk:
            if self.held is not None:
                out.append(_event(self.held))
                self.held = None
            if _ends(chunk):
                self.held = chunk
                return
            out.append(b"data: " + data + b"\n\n")
        elif self.held is not None:  # the dropped usage chunk: vLLM moved this here
            if "system_fingerprint" in chunk:
                self.held["system_fingerprint"] = chunk["system_fingerprint"]
            out.append(_event(self.held))
            self.held = None

    def end(self, out: list[bytes]) -> None:
        """``[DONE]``: the answer ended well."""
        out.append(self.rest() + _DONE_EVENT)
        self.ended = True

    def rest(self) -> bytes:
        """What is still held back, to go out before the stream's last event."""
        held, self.held = self.held, None
        return b"" if held is None else _event(held)


class _Events:
    """How a stream of whole events is passed on (Messages, Responses): as they came."""

    __slots__ = ("ended", "last", "next")

    def __init__(self, last: frozenset[str]) -> None:
        self.last = last
        self.ended = False  # the answer's last event came
        self.next = 0  # the sequence_number an event of the gateway's own takes

    def add(self, block: bytes, event: dict[str, Any] | None, out: list[bytes]) -> None:
        out.append(block + b"\n\n")
        if event is None:
            return
        if isinstance(sequence := event.get("sequence_number"), int):
            self.next = sequence + 1
        self.ended = self.ended or event.get("type") in self.last

    def end(self, out: list[bytes]) -> None:
        """``[DONE]``, where a server sends one: passed on after the answer's last event;
        before it, the stream ended short and is not passed on, since a client that reads
        ``[DONE]`` (the ``openai`` client's Responses stream) stops there, taking a cut
        answer for a whole one."""
        if self.ended:
            out.append(_DONE_EVENT)

    @staticmethod
    def rest() -> bytes:
        return b""


def _ends(chunk: dict[str, Any]) -> bool:
    """A chunk that finishes a choice and carries no fingerprint. Asked for usage, vLLM
    moves ``system_fingerprint`` from this chunk to the usage chunk after it; when the client
    did not ask for usage that chunk is dropped, so the fingerprint goes back here."""
    if "system_fingerprint" in chunk:
        return False
    return any(c.get("finish_reason") for c in chunk.get("choices") or ())


def _event(chunk: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(chunk) + b"\n\n"
