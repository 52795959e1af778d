"""Two ASGI responses the simulated server needs and Starlette does not have.

``EventStream`` streams SSE chunks while it listens for the client going away, and always
runs its ``on_close`` callback (which cancels the sequence in the engine); with
``complete=False`` it returns without finishing the HTTP body, so the server drops the
connection mid-stream (the ``die`` fault). ``DeferredJSON`` waits for a non-streamed answer
the same way before sending it as one body.

Must not: know about the engine or the answer formats (callbacks and byte iterators only).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, Awaitable, Callable

import anyio
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

SSE_MEDIA_TYPE = "text/event-stream"


async def _until_disconnect(receive: Receive, scope: anyio.CancelScope) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    scope.cancel()


class EventStream(Response):
    """SSE body from an async iterator of ready ``data:`` chunks."""

    media_type = SSE_MEDIA_TYPE

    def __init__(
        self,
        chunks: AsyncGenerator[bytes, None],
        on_close: Callable[[], None],
        *,
        complete: bool = True,
    ) -> None:
        self._chunks = chunks
        self._on_close = on_close
        self._complete = complete
        self.status_code = 200
        self.background = None
        self.init_headers({"cache-control": "no-cache"})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(_until_disconnect, receive, tg.cancel_scope)
                await self._send_all(send)
                tg.cancel_scope.cancel()
        finally:
            self._on_close()

    async def _send_all(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        async with contextlib.aclosing(self._chunks) as chunks:
            async for chunk in chunks:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        if self._complete:
            await send({"type": "http.response.body", "body": b"", "more_body": False})


class DeferredJSON(Response):
    """A JSON body that is ready only when ``produce`` returns; gives up if the client leaves.

    ``cut`` breaks it halfway through the body: ``"drop"`` returns there, so the server
    drops the connection; ``"stall"`` goes silent until the client leaves."""

    media_type = "application/json"

    def __init__(
        self,
        produce: Callable[[], Awaitable[bytes]],
        on_close: Callable[[], None],
        cut: str | None = None,
    ) -> None:
        self._produce = produce
        self._on_close = on_close
        self._cut = cut
        self.status_code = 200
        self.background = None
        self.body = b""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(_until_disconnect, receive, tg.cancel_scope)
                self.body = await self._produce()
                tg.cancel_scope.cancel()
            if not self.body:  # the client left first
                return
            self.init_headers()
            if self._cut is None:
                await super().__call__(scope, receive, send)
                return
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            half = self.body[: len(self.body) // 2]
            await send({"type": "http.response.body", "body": half, "more_body": True})
            if self._cut == "stall":
                while (await receive())["type"] != "http.disconnect":
                    pass
        finally:
            self._on_close()
