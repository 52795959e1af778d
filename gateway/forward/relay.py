"""Step 8 of a request: relay upstream events to the client, measuring them on the way.

``Relay.sse`` yields SSE bytes for a streaming client as events arrive; ``Relay.collect``
folds the whole stream into one JSON body. Both read every event once, in the answer's
dialect, into its ``Measurement`` (``gateway/measure/answer.py``, steps 6 and 7): the
usage chunk (asked of upstream always) is passed on only when the client asked for usage,
an upstream error event ends the stream. (An error event that opens the stream never gets
here: ``backends/upstream.py`` turns it into the upstream's answer.) A client error found
later still answers a non-streaming client with its status.

The measurement finishes in ``finally``: finished, failed and cancelled streams all count.
After the first byte a failure becomes a final SSE error event, never a silent end.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson

from backends.errors import AnswerTimeout, StreamBroken, UpstreamRejected
from backends.pool import Opened
from backends.upstream import DONE
from gateway.errors import UpstreamErrorEvent, from_backend
from gateway.forward.assemble import Assembler
from gateway.measure.acceptance import Status
from gateway.measure.answer import Dialect, Measurement
from gateway.measure.completions import COMPLETIONS

_DONE_EVENT = b"data: [DONE]\n\n"


class Relay:
    """One upstream stream, read once, for one client; measured by ``measurement`` and read
    in ``dialect`` (``gateway/measure/answer.py``)."""

    __slots__ = (
        "_clock",
        "_dialect",
        "_error",
        "_include_sglext",
        "_include_usage",
        "_measurement",
        "_opened",
        "_status",
    )

    def __init__(
        self,
        opened: Opened,
        measurement: Measurement,
        *,
        include_usage: bool,
        clock: Callable[[], float],
        include_sglext: bool = False,
        dialect: Dialect = COMPLETIONS,
    ) -> None:
        self._opened = opened
        self._measurement = measurement
        self._dialect = dialect
        self._include_usage = include_usage
        self._include_sglext = include_sglext
        self._clock = clock
        self._status = Status.CANCELLED
        self._error = ""

    async def _batches(self) -> AsyncIterator[list[bytes]]:
        stream = self._opened.stream
        yield [stream.first, *stream.take_pending()]
        async for batch in stream.batches():
            yield batch

    @property
    def finished(self) -> bool:
        """The last batch has been produced: the client's answer is complete."""
        return self._status is not Status.CANCELLED

    def _inspect(self, data: bytes, now: float) -> dict[str, Any]:
        event = orjson.loads(data)
        if not isinstance(event, dict):
            raise StreamBroken("upstream sent an event that is not a JSON object")
        failure = self._dialect.event(self._measurement, event, now)
        if failure is not None:
            raise UpstreamErrorEvent(data, *failure)
        return event

    async def sse(self) -> AsyncIterator[bytes]:
        held: dict[str, Any] | None = None  # the last choice's end, waiting for usage
        try:
            async for batch in self._batches():
                now = self._clock()
                out = []
                for data in batch:
                    if data == DONE:
                        if held is not None:
                            out.append(_event(held))
                        out.append(_DONE_EVENT)
                        self._status = Status.OK
                        break
                    held = self._relayed(data, self._inspect(data, now), held, out)
                yield b"".join(out)
        except UpstreamErrorEvent as exc:
            self._fail(str(exc))
            yield (b"" if held is None else _event(held)) + b"data: " + exc.payload + b"\n\n"
        except (StreamBroken, orjson.JSONDecodeError) as exc:
            self._fail(f"stream broke after it started: {exc}")
            # past the first byte nothing can be tried again: the client is told here
            late = isinstance(exc, AnswerTimeout)
            failed = from_backend((AnswerTimeout if late else StreamBroken)(self._error))
            yield (b"" if held is None else _event(held)) + failed.sse()
        finally:
            self._finish()

    def _relayed(
        self, data: bytes, chunk: dict[str, Any], held: dict[str, Any] | None, out: list[bytes]
    ) -> dict[str, Any] | None:
        """Add what the client gets of one upstream chunk to ``out``; return the chunk held
        back for the fingerprint of a usage chunk the client did not ask for."""
        if "sglext" in chunk and not chunk.get("choices"):
            if self._include_sglext:  # SGLang's counts: asked for on the client's account too
                out.append(b"data: " + data + b"\n\n")
            return held
        if self._include_usage:
            out.append(b"data: " + data + b"\n\n")
        elif chunk.get("choices") or "usage" not in chunk:
            if held is not None:
                out.append(_event(held))
                held = None
            if _ends(chunk):
                return chunk
            out.append(b"data: " + data + b"\n\n")
        elif held is not None:  # the dropped usage chunk: vLLM moved this here
            if "system_fingerprint" in chunk:
                held["system_fingerprint"] = chunk["system_fingerprint"]
            out.append(_event(held))
            held = None
        return held

    async def collect(self, chat: bool) -> dict[str, Any]:
        """The whole answer as one body, of at most the stream's ``limit`` bytes of events
        (``max_response_bytes``). A stream that broke, or grew past it, raises
        ``StreamBroken`` and an error event ``UpstreamErrorEvent`` (``UpstreamRejected`` for
        a 4xx code): the caller decides whether to try again."""
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
                    assembler.add(self._inspect(data, now))
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


def _ends(chunk: dict[str, Any]) -> bool:
    """A chunk that finishes a choice and carries no fingerprint. Asked for usage, vLLM
    moves ``system_fingerprint`` from this chunk to the usage chunk after it; when the client
    did not ask for usage that chunk is dropped, so the fingerprint goes back here."""
    if "system_fingerprint" in chunk:
        return False
    return any(c.get("finish_reason") for c in chunk.get("choices") or ())


def _event(chunk: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(chunk) + b"\n\n"
