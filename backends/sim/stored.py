"""The simulated server's stored Responses API responses, as vLLM keeps them: in the memory
of the server that made them, by id, and only there.

``store(id, body)`` keeps an answer (what ``POST /v1/responses`` with ``store`` does);
``GET``/``DELETE /v1/responses/{id}`` and ``POST /v1/responses/{id}/cancel`` read, delete
and cancel it, and an id the server does not hold gets vLLM's 404. One ``Stored`` per app
(``app.state.stored``), at most ``limit`` answers, the oldest forgotten first.
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

    def delete(self, response_id: str) -> bool:
        return self._bodies.pop(response_id, None) is not None

    def routes(self) -> list[Route]:
        return [
            Route("/v1/responses/{response_id}", self._read, methods=["GET", "DELETE"]),
            Route("/v1/responses/{response_id}/cancel", self._cancel, methods=["POST"]),
        ]

    async def _read(self, request: Request) -> Response:
        response_id: str = request.path_params["response_id"]
        body = self.get(response_id)
        if body is None:
            return _not_found(response_id)
        if request.method == "DELETE":
            self.delete(response_id)
            deleted = {"id": response_id, "object": "response.deleted", "deleted": True}
            return Response(orjson.dumps(deleted), media_type=_JSON)
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
