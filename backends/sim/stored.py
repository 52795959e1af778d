"""The simulated server's stored Responses API responses, as vLLM keeps them: in the memory
of the server that made them, by id, and only there.

``store(id, body)`` keeps an answer (what ``POST /v1/responses`` with ``store`` does);
``GET /v1/responses/{id}`` and ``POST /v1/responses/{id}/cancel`` read and cancel it, and an
id the server does not hold gets vLLM's 404. Like vLLM 0.32, which has no route for it, the
server answers ``DELETE /v1/responses/{id}`` 405 ``{"detail": "Method Not Allowed"}`` (with
``Allow: GET``), whatever the id, and keeps the response: a conversation goes on from it.
One ``Stored`` per app (``app.state.stored``), at most ``limit`` answers, the oldest
forgotten first.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from backends.sim.responses import error_body

_JSON = "application/json"
_CANCELLABLE = ("queued", "in_progress")


class Stored:
    """Stored responses by id."""

    def __init__(self, limit: int = 10_000) -> None:
        self._limit = limit
        self._bodies: OrderedDict[str, dict[str, Any]] = OrderedDict()

    def store(self, response_id: str, body: dict[str, Any]) -> None:
        self._bodies[response_id] = body
        self._bodies.move_to_end(response_id)
        while len(self._bodies) > self._limit:
            self._bodies.popitem(last=False)

    def get(self, response_id: str) -> dict[str, Any] | None:
        return self._bodies.get(response_id)

    def __len__(self) -> int:
        return len(self._bodies)

    def routes(self) -> list[Route]:
        return [
            Route("/v1/responses/{response_id}", self._read, methods=["GET"]),
            Route("/v1/responses/{response_id}/cancel", self._cancel, methods=["POST"]),
        ]

    async def _read(self, request: Request) -> Response:
        response_id: str = request.path_params["response_id"]
        body = self.get(response_id)
        if body is None:
            return _not_found(response_id)
        return Response(orjson.dumps(body), media_type=_JSON)

    async def _cancel(self, request: Request) -> Response:
        response_id: str = request.path_params["response_id"]
        body = self.get(response_id)
        if body is None:
            return _not_found(response_id)
        if body.get("status") not in _CANCELLABLE:
            message = "Cannot cancel a synchronous response."
            return Response(
                error_body(message, "invalid_request_error", 400), 400, media_type=_JSON
            )
        body = body | {"status": "cancelled"}
        self.store(response_id, body)
        return Response(orjson.dumps(body), media_type=_JSON)


def _not_found(response_id: str) -> Response:
    message = f"Response with id '{response_id}' not found."
    body = error_body(message, "invalid_request_error", 404, "response_id")
    return Response(body, 404, media_type=_JSON)
