"""Sending the answer, and noticing when the client goes away.

``SSEResponse`` streams a relay's bytes as they come. It replaces Starlette's
``StreamingResponse``, whose task group and cancel scope cost ~110 us a response
(bench/RESULTS.md); it keeps what that gave: a client that disconnects cancels the producer,
whose ``finally`` then records the outcome and closes the upstream.

``cancelled_on_disconnect`` is the one mechanism for both kinds of answer: a single watcher
task waits for ``http.disconnect`` and cancels the handler's task; the cancellation it
caused is absorbed, so the server sees a handler that returned, not one that failed.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager

from starlette.types import Receive, Scope, Send

from gateway.errors import Shape, shutting_down

_CUT_MESSAGE = "the gateway shut down before the answer finished"
_CUT = shutting_down(_CUT_MESSAGE).sse()


def cut_event(shape: Shape) -> bytes:
    """The final event of a stream the gateway's stop cut, in the shape of its API."""
    return shutting_down(_CUT_MESSAGE).sse(shape)


class Disconnect:
    """Whether the client went away; set by the watcher of ``cancelled_on_disconnect``."""

    __slots__ = ("gone", "settled")

    def __init__(self) -> None:
        self.gone = False
        self.settled = False  # the answer is complete: a disconnect now changes nothing


@asynccontextmanager
async def cancelled_on_disconnect(receive: Receive) -> AsyncIterator[Disconnect]:
    """Run the block, cancelling it if the client disconnects; then ``state.gone`` says so."""
    task = asyncio.current_task()
    assert task is not None
    state = Disconnect()

    async def watch() -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        if not state.settled:
            state.gone = True
            task.cancel()

    watcher = asyncio.create_task(watch())
    try:
        yield state
    except asyncio.CancelledError:
        if not state.gone:
            raise
        task.uncancel()
    finally:
        state.settled = True
        watcher.cancel()


class SSEResponse:
    """A ``text/event-stream`` response fed by an async iterator of bytes."""

    __slots__ = ("_body", "_cut", "_finished", "_headers")

    def __init__(
        self,
        body: AsyncIterator[bytes],
        headers: Mapping[str, str],
        finished: Callable[[], bool] = lambda: False,
        cut: bytes = _CUT,
    ) -> None:
        """``finished()`` true right after a chunk means it was the last: it goes out with
        the end of the response, which saves the server one empty write. ``cut``: the last
        event of a stream the server's stop cuts (``cut_event``)."""
        self._body = body
        self._cut = cut
        self._finished = finished
        self._headers = [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            *((k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()),
        ]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = self._body
        started = ended = False
        try:
            async with cancelled_on_disconnect(receive) as disconnect:
                await send({"type": "http.response.start", "status": 200, "headers": self._headers})
                started = True
                last = b""
                async for chunk in body:
                    if self._finished():
                        last = chunk
                        break
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                disconnect.settled = True
                ended = True
                await send({"type": "http.response.body", "body": last, "more_body": False})
        except asyncio.CancelledError:
            # Not the client's disconnect (that is absorbed above): the server stopping after
            # its drain time. The stream ends with an error event, not silently truncated.
            if started and not ended:
                with contextlib.suppress(Exception):
                    await send(
                        {"type": "http.response.body", "body": self._cut, "more_body": False}
                    )
            raise
        finally:
            await _close(body)


async def _close(body: AsyncIterator[bytes]) -> None:
    close: Callable[[], object] | None = getattr(body, "aclose", None)
    if close is not None:
        await close()  # type: ignore[misc]
