"""Step 8 of a request: relay upstream events to the client, measuring them on the way.

``Relay.sse`` yields SSE bytes for a streaming client as events arrive; ``Relay.collect``
folds the whole stream into one JSON body. Both inspect every event once: output chunks
feed the acceptance fold, the usage chunk (asked of upstream always) is passed on only
when the client asked for usage, an upstream error event ends the stream.

The outcome is recorded in ``finally``: finished, failed and cancelled streams all count.
After the first byte a failure becomes a final SSE error event, never a silent end.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson

from backends.errors import StreamBroken
from backends.pool import Opened
from backends.upstream import DONE
from gateway.acceptance import Fold, Outcome, Status
from gateway.assemble import Assembler
from gateway.errors import ApiError

_DONE_EVENT = b"data: [DONE]\n\n"


class UpstreamErrorEvent(Exception):
    """The upstream sent an error object as an event, after the stream had started."""

    def __init__(self, payload: bytes, message: str) -> None:
        super().__init__(message)
        self.payload = payload


class Relay:
    """One upstream stream, read once, for one client."""

    __slots__ = (
        "_capture",
        "_clock",
        "_error",
        "_fold",
        "_include_usage",
        "_on_done",
        "_opened",
        "_status",
        "_text",
    )

    def __init__(
        self,
        opened: Opened,
        fold: Fold,
        *,
        include_usage: bool,
        clock: Callable[[], float],
        on_done: Callable[[Outcome], None],
        capture: asyncio.Future[str] | None = None,
    ) -> None:
        """``capture``, when given, receives the answer's text (for the shadow canary)."""
        self._opened = opened
        self._capture = capture
        self._text: list[str] | None = [] if capture is not None else None
        self._fold = fold
        self._include_usage = include_usage
        self._clock = clock
        self._on_done = on_done
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
        chunk = orjson.loads(data)
        if not isinstance(chunk, dict):
            raise StreamBroken("upstream sent an event that is not a JSON object")
        if "error" in chunk and not chunk.get("choices"):
            error = chunk["error"]
            message = error.get("message", "") if isinstance(error, dict) else str(error)
            raise UpstreamErrorEvent(data, f"upstream error: {message}")
        choices = chunk.get("choices")
        if choices:
            for choice in choices:
                delta = choice.get("delta") or choice
                finish = choice.get("finish_reason")
                if (
                    delta.get("content")
                    or delta.get("text")
                    or delta.get("tool_calls")
                    or delta.get("reasoning_content")
                    or delta.get("reasoning")
                ):
                    self._fold.content(now, finish)
                    if self._text is not None and choice.get("index", 0) == 0:
                        self._text.append(delta.get("content") or delta.get("text") or "")
                elif finish:
                    self._fold.finished(finish)
        elif "usage" in chunk:
            self._fold.usage(chunk["usage"] or {}, chunk.get("metrics"))
        return chunk

    async def sse(self) -> AsyncIterator[bytes]:
        try:
            async for batch in self._batches():
                now = self._clock()
                out = []
                for data in batch:
                    if data == DONE:
                        out.append(_DONE_EVENT)
                        self._status = Status.OK
                        break
                    chunk = self._inspect(data, now)
                    if self._include_usage or chunk.get("choices") or "usage" not in chunk:
                        out.append(b"data: " + data + b"\n\n")
                yield b"".join(out)
        except UpstreamErrorEvent as exc:
            self._fail(str(exc))
            yield b"data: " + exc.payload + b"\n\n"
        except (StreamBroken, orjson.JSONDecodeError) as exc:
            self._fail(f"stream broke after it started: {exc}")
            yield _broken(self._error).sse()
        finally:
            self._finish()

    async def collect(self, chat: bool) -> dict[str, Any]:
        assembler = Assembler(chat)
        try:
            async for batch in self._batches():
                now = self._clock()
                for data in batch:
                    if data == DONE:
                        self._status = Status.OK
                        return assembler.body()
                    assembler.add(self._inspect(data, now))
            raise StreamBroken("upstream ended without [DONE]")
        except UpstreamErrorEvent as exc:
            self._fail(str(exc))
            raise ApiError(502, str(exc), "server_error", None, "upstream_error") from None
        except (StreamBroken, orjson.JSONDecodeError) as exc:
            self._fail(f"stream broke after it started: {exc}")
            raise _broken(self._error) from None
        finally:
            self._finish()

    def _fail(self, error: str) -> None:
        self._status = Status.ERROR
        self._error = error

    def _finish(self) -> None:
        self._opened.close(failed=self._status is Status.ERROR)
        self._on_done(self._fold.finish(self._status, self._clock(), self._error))
        if self._capture is not None and not self._capture.done():
            if self._status is Status.OK and self._text is not None:
                self._capture.set_result("".join(self._text))
            else:
                self._capture.cancel()


def _broken(message: str) -> ApiError:
    return ApiError(502, message, "server_error", None, "upstream_stream_broken")
