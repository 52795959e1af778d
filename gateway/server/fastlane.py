"""Step 1 for the hot endpoints: a ``POST`` to the path of an API served (``gateway/apis/``:
``/v1/chat/completions``, ``/v1/completions``, ``/v1/messages``, ``/v1/responses``) goes
straight to its handler, past Starlette's middleware stack and route matching, which cost
~50 us a request under load (bench/RESULTS.md); every other request goes to the Starlette
app. Each hot request
passes the gate first (``gateway/gate.py``: caller, places in flight) and gives its place
back once its answer is sent. Errors are rendered by the same handlers the app uses, in
the shape of the API the request came in on.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.errors import ApiError
from gateway.gate import Gate
from gateway.identity import remember

Answer = Callable[[Scope, Receive, Send], Awaitable[None]]
Handler = Callable[[Request], Awaitable[Answer]]
ErrorHandler = Callable[[Request, Exception], Awaitable[Answer]]


class FastLane:
    """Dispatches the hot POST paths itself; hands everything else to ``app``."""

    def __init__(
        self,
        app: ASGIApp,
        routes: Mapping[str, Handler],
        on_error: ErrorHandler,
        gate: Gate,
        on_crash: ErrorHandler,
    ) -> None:
        """``on_error`` renders an ``ApiError``; ``on_crash`` any other exception (a bug)."""
        self._app = app
        self._routes = dict(routes)
        self._on_error = on_error
        self._gate = gate
        self._on_crash = on_crash

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            handler = self._routes.get(scope["path"])
            if handler is not None:
                await self._serve(handler, scope, receive, send)
                return
        await self._app(scope, receive, send)

    async def _serve(self, handler: Handler, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        try:
            caller = self._gate.enter(request.headers)
        except ApiError as exc:
            await (await self._on_error(request, exc))(scope, receive, send)
            return
        remember(scope, caller)
        try:
            try:
                answer = await handler(request)
            except ApiError as exc:
                answer = await self._on_error(request, exc)
            except Exception as exc:
                answer = await self._on_crash(request, exc)
            await answer(scope, receive, send)
        finally:
            self._gate.leave(caller)
