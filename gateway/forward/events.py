"""Step 8 for the APIs whose streams are relayed event by event as they came: Anthropic's
Messages and OpenAI's Responses.

Each upstream event (``backends/sse.py``'s ``EventDecoder``: its ``event:`` line, its data,
as the upstream wrote them) is read once, in its API's dialect, into the answer's
``Measurement`` and passed on unchanged, batch by batch as the upstream's bytes arrive. The
answer ends well at its dialect's last event (``message_stop``; ``response.completed``),
followed by the end of the body (vLLM 0.32's streams of both) or by a ``[DONE]``, passed
on, where a server sends one. An error event the upstream sends is passed on and fails the
answer; a stream that ends or breaks before its last event ends with an error event of the
gateway's own, in the API's shape (``gateway/errors.py``; a Responses one numbered after
the last it relayed). The measurement finishes in ``finally``: finished, failed and
cancelled streams all count.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import orjson

from backends.errors import AnswerTimeout, StreamBroken
from backends.pool import Opened
from backends.sse import data_of
from backends.upstream import DONE
from gateway.errors import Shape, from_backend
from gateway.measure.acceptance import Status
from gateway.measure.answer import EventDialect, Measurement
from gateway.measure.messages import MESSAGES
from gateway.measure.responses import RESPONSES
from policies.features import Endpoint

_DONE_EVENT = b"data: [DONE]\n\n"
# the APIs relayed event by event, by path, and how their answers read
RELAYED: dict[str, EventDialect] = {
    Endpoint.MESSAGES.value: MESSAGES,
    Endpoint.RESPONSES.value: RESPONSES,
}


class EventRelay:
    """One upstream stream of whole events, read once, for one client."""

    __slots__ = (
        "_clock",
        "_dialect",
        "_error",
        "_measurement",
        "_next",
        "_opened",
        "_shape",
        "_status",
    )

    def __init__(
        self,
        opened: Opened,
        measurement: Measurement,
        dialect: EventDialect,
        *,
        clock: Callable[[], float],
        shape: Shape,
    ) -> None:
        self._opened = opened
        self._measurement = measurement
        self._dialect = dialect
        self._clock = clock
        self._shape = shape
        self._status = Status.CANCELLED
        self._error = ""
        self._next = 0  # the sequence_number an event of the gateway's own takes

    @property
    def finished(self) -> bool:
        """The last batch has been produced: the client's answer is complete."""
        return self._status is not Status.CANCELLED

    async def _batches(self) -> AsyncIterator[list[bytes]]:
        stream = self._opened.stream
        yield [stream.first, *stream.take_pending()]
        async for batch in stream.batches():
            yield batch

    async def sse(self) -> AsyncIterator[bytes]:
        ended = False  # the answer's last event came
        try:
            async for batch in self._batches():
                now = self._clock()
                out: list[bytes] = []
                for block in batch:
                    if block == DONE:
                        out.append(_DONE_EVENT)
                        break
                    out.append(block + b"\n\n")
                    kind = self._read(block, now)
                    ended = ended or kind in self._dialect.last
                    if self._status is Status.ERROR:
                        break
                yield b"".join(out)
                if self._status is Status.ERROR:
                    return
            if not ended:
                raise StreamBroken("upstream ended the stream before its last event")
            self._status = Status.OK
        except (StreamBroken, orjson.JSONDecodeError) as exc:
            self._fail(f"stream broke after it started: {exc}")
            late = isinstance(exc, AnswerTimeout)  # the request's time ran out: a timeout
            failed = from_backend((AnswerTimeout if late else StreamBroken)(self._error))
            yield failed.sse(self._shape, self._next)
        finally:
            self._opened.close(failed=self._status is Status.ERROR)
            self._measurement.finish(self._status, self._error)

    def _read(self, block: bytes, now: float) -> object:
        """Measure one event; its type. An error event fails the answer."""
        data = data_of(block)
        if data is None:
            return None
        event = orjson.loads(data)
        if not isinstance(event, dict):
            raise StreamBroken("upstream sent an event that is not a JSON object")
        if isinstance(sequence := event.get("sequence_number"), int):
            self._next = sequence + 1
        failure = self._dialect.event(self._measurement, event, now)
        if failure is not None:
            self._fail(failure[0])
        return event.get("type")

    def _fail(self, error: str) -> None:
        self._status = Status.ERROR
        self._error = error
