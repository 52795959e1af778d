"""Step 1 of a request: the HTTP endpoints. Each one hands its request to the pipeline or
answers from the services; none holds logic of its own."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable

import orjson
from starlette.requests import Request
from starlette.responses import Response

from gateway import pipeline
from gateway.apis import Api
from gateway.errors import JSON
from gateway.forward.respond import SSEResponse
from gateway.server import relayed
from gateway.server.health import pool_health
from gateway.services import Services


def _json(body: object, status: int = 200) -> Response:
    return Response(orjson.dumps(body), status, media_type=JSON)


class Endpoints:
    """The model endpoints, one made for each API (``gateway/apis/``), and the health
    checks."""

    def __init__(self, services: Services) -> None:
        self.services = services

    def model_api(self, api: Api) -> Callable[[Request], Awaitable[Response | SSEResponse]]:
        """The endpoint of one model API: every request to it goes down the pipeline."""
        services = self.services

        async def endpoint(request: Request) -> Response | SSEResponse:
            return await pipeline.complete(services, request, api)

        endpoint.__name__ = api.name
        return endpoint

    async def healthz(self, request: Request) -> Response:
        return _json({"status": "ok"})

    async def health(self, request: Request) -> Response:
        """vLLM's ``/health``: 200 and no body while the gateway serves, 503 once it drains."""
        return Response(status_code=503 if self.services.gate.draining else 200)

    async def readyz(self, request: Request) -> Response:
        """Ready once serving: a gateway whose upstreams are down still answers every request
        (with an OpenAI-style 503), which beats a Service with no ready pods refusing
        connections. Upstream health and shared-state degradation are in the detail."""
        services = self.services
        if services.gate.draining:
            return _json({"ready": False, "draining": True}, 503)
        policy = services.policy.current
        pools = pool_health(services)
        models = {
            model: any(pools[p]["healthy"] for p in ladder.pools)
            for model, ladder in policy.ladders.items()
        }
        detail = {
            "ready": True,
            "upstreams_ok": all(models.values()),
            "models": models,
            "pools": pools,
            "state": services.state.status(),
            "process": {"pid": os.getpid(), "workers": services.settings.workers},
            "policy": {
                "path": str(services.policy.path),
                "last_reload_error": list(services.policy.last_error),
            },
        }
        return _json(detail)

    # the engine's other routes, and calls to a stored response: gateway/server/relayed.py

    async def other_route(self, request: Request) -> Response:
        return await relayed.other_route(self.services, request)

    async def models(self, request: Request) -> Response:
        return await relayed.model_list(self.services, request)

    async def model_card(self, request: Request) -> Response:
        return await relayed.model_card(self.services, request)

    async def version(self, request: Request) -> Response:
        return await relayed.version(self.services, request)

    async def stored_response(self, request: Request) -> Response:
        return await relayed.stored_response(self.services, request)
