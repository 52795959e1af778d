"""The app factory: wiring only. Builds the services, the routes, the error handlers and the
lifespan that starts and stops the background work (policy watch, guardrail tick)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import orjson
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from backends.pool import Pools, PoolSpec
from backends.upstream import Timeouts, Upstream
from gateway.api import Api
from gateway.classify import Defaults
from gateway.errors import JSON, ApiError, api_error_handler
from gateway.flagstore import FlagStore
from gateway.livestats import LiveStats
from gateway.policyfile import PolicyHolder
from gateway.services import Services
from gateway.settings import Settings
from gateway.telemetry import Telemetry
from policies.compiled import CompiledPolicy

log = logging.getLogger(__name__)


def pool_specs(policy: CompiledPolicy) -> list[PoolSpec]:
    return [
        PoolSpec(
            name=name,
            model=pool.model,
            endpoints=tuple(pool.endpoints),
            k=pool.num_speculative_tokens,
            timeouts=Timeouts(
                pool.timeouts.connect_s, pool.timeouts.first_byte_s, pool.timeouts.idle_s
            ),
        )
        for name, pool in policy.pools.items()
    ]


def build_services(
    settings: Settings,
    policy: PolicyHolder | None = None,
    *,
    clock: Callable[[], float] = time.monotonic,
    wall: Callable[[], float] = time.time,
) -> Services:
    holder = policy or PolicyHolder.from_file(settings.policy)
    upstream = Upstream(
        max_connections=settings.upstream_max_connections,
        keepalive_s=settings.upstream_keepalive_s,
    )
    telemetry = Telemetry.build(settings.otlp_endpoint)
    services = Services(
        settings=settings,
        clock=clock,
        wall=wall,
        policy=holder,
        flags=FlagStore(holder.current),
        stats=LiveStats(lambda: holder.current),
        upstream=upstream,
        pools=Pools(
            pool_specs(holder.current),
            upstream,
            clock,
            breaker_failures=settings.breaker_failures,
            breaker_reset_s=settings.breaker_reset_s,
            tries_per_pool=settings.tries_per_pool,
        ),
        telemetry=telemetry,
        defaults=Defaults(
            settings.default_temperature,
            settings.default_top_p,
            settings.tenant_header.lower(),
            settings.endpoint_header.lower(),
        ),
    )
    holder.subscribe(lambda new: _policy_changed(services, new))
    return services


def _policy_changed(services: Services, policy: CompiledPolicy) -> None:
    services.pools.update(pool_specs(policy))
    services.flags.policy_changed(policy)
    services.telemetry.reloads.add(1, {"result": "ok"})


def reload_policy(services: Services) -> bool:
    result = services.policy.reload()
    if not result.changed:
        services.telemetry.reloads.add(1, {"result": "rejected"})
    return result.changed


async def _watch_policy(services: Services) -> None:
    while True:
        await asyncio.sleep(services.settings.policy_watch_s)
        if services.policy.changed_on_disk():
            reload_policy(services)


async def _tick(services: Services) -> None:
    while True:
        await asyncio.sleep(1.0)
        services.stats.tick(services.clock())


def create_app(settings: Settings, services: Services | None = None) -> Starlette:
    """The gateway as an ASGI app; pass ``services`` to plug in prebuilt collaborators."""
    services = services or build_services(settings)
    api = Api(services)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await services.upstream.start()
        tasks = [
            asyncio.create_task(_watch_policy(services), name="policy-watch"),
            asyncio.create_task(_tick(services), name="guardrail-tick"),
        ]
        loop = asyncio.get_running_loop()
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(signal.SIGHUP, reload_policy, services)
        try:
            yield
        finally:
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.remove_signal_handler(signal.SIGHUP)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await services.upstream.close()
            services.telemetry.shutdown()

    async def metrics(request: Request) -> Response:
        return Response(
            generate_latest(services.telemetry.registry), media_type=CONTENT_TYPE_LATEST
        )

    routes = [
        Route("/v1/chat/completions", api.chat, methods=["POST"]),
        Route("/v1/completions", api.completions, methods=["POST"]),
        Route("/v1/models", api.models, methods=["GET"]),
        Route("/healthz", api.healthz, methods=["GET"]),
        Route("/readyz", api.readyz, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
    return Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={
            ApiError: api_error_handler,
            HTTPException: _http_error,
            Exception: _unexpected,
        },
    )


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    kind = "not_found" if exc.status_code == 404 else "invalid_request_error"
    return ApiError(exc.status_code, str(exc.detail), kind).response(dict(exc.headers or {}))


async def _unexpected(request: Request, exc: Exception) -> Response:
    log.exception("unexpected error serving %s", request.url.path, exc_info=exc)
    body = {
        "error": {"message": "internal error", "type": "server_error", "param": None, "code": None}
    }
    return Response(orjson.dumps(body), 500, media_type=JSON)
