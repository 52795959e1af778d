"""The app factory: wiring only. Builds the services, the routes, the error handlers and the
lifespan that starts and stops the background work."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp

from backends.pool import Pools
from backends.upstream import Upstream
from gateway.acceptance import Outcome
from gateway.admin import Admin
from gateway.api import Api
from gateway.classify import Defaults
from gateway.errors import ApiError, api_error_handler, internal_error
from gateway.fastlane import FastLane
from gateway.flagstore import FlagStore
from gateway.lifecycle import (
    discover,
    policy_changed,
    pool_specs,
    reload_policy,
    tick,
    watch_policy,
)
from gateway.livestats import LiveStats
from gateway.policyfile import PolicyHolder
from gateway.scrape import PoolScraper
from gateway.services import Services
from gateway.settings import Settings
from gateway.shadow import CanaryCounts, CanaryLimits, ShadowLimits, ShadowRunner
from gateway.state import MemoryState, SharedState
from gateway.state_redis import RedisState
from gateway.telemetry import Telemetry

log = logging.getLogger(__name__)


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
    flags = FlagStore(holder.current)
    stats = LiveStats(
        lambda: holder.current,
        on_transition=telemetry.transition,
    )
    pools = Pools(
        pool_specs(holder.current),
        upstream,
        clock,
        breaker_failures=settings.breaker_failures,
        breaker_reset_s=settings.breaker_reset_s,
        tries_per_pool=settings.tries_per_pool,
    )

    def record(outcome: Outcome) -> None:
        stats.record(outcome, wall())
        telemetry.observe(outcome)

    def alarm(slice_key: str, counts: CanaryCounts) -> None:
        rate = counts.matched / counts.compared
        numbers = {"compared": float(counts.compared), "exact_match_rate": rate}
        reason = f"canary: greedy output differs on speculation (exact match {rate:.1%})"
        stats.alarm(slice_key, reason, numbers, wall())

    shadow = ShadowRunner(
        pools,
        clock,
        record,
        telemetry,
        ShadowLimits(
            settings.shadow_max_concurrency,
            settings.shadow_tokens_per_minute,
            settings.shadow_max_outstanding,
            settings.shadow_timeout_s,
        ),
        CanaryLimits(settings.canary_max_mismatch, settings.canary_min_samples),
        alarm,
    )
    services = Services(
        settings=settings,
        clock=clock,
        wall=wall,
        policy=holder,
        flags=flags,
        stats=stats,
        state=_state(settings, flags, stats, holder, telemetry, wall),
        upstream=upstream,
        pools=pools,
        telemetry=telemetry,
        shadow=shadow,
        record=record,
        scraper=PoolScraper(pools, upstream, stats, wall, telemetry.pool_acceptance),
        defaults=Defaults(
            settings.default_temperature,
            settings.default_top_p,
            settings.tenant_header.lower(),
            settings.endpoint_header.lower(),
        ),
    )
    holder.subscribe(lambda new: policy_changed(services, new))
    return services


def _state(
    settings: Settings,
    flags: FlagStore,
    stats: LiveStats,
    holder: PolicyHolder,
    telemetry: Telemetry,
    wall: Callable[[], float],
) -> SharedState:
    if settings.redis_url is None:
        return MemoryState(flags, stats)
    return RedisState(
        settings.redis_url,
        settings.namespace,
        flags,
        stats,
        lambda: holder.current,
        telemetry,
        wall,
        interval_s=settings.sync_interval_s,
    )


def create_app(settings: Settings, services: Services | None = None) -> ASGIApp:
    """The gateway as an ASGI app; pass ``services`` to plug in prebuilt collaborators."""
    services = services or build_services(settings)
    api = Api(services)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await services.upstream.start()
        await services.state.start()
        tasks = [
            asyncio.create_task(watch_policy(services), name="policy-watch"),
            asyncio.create_task(tick(services), name="guardrail-tick"),
            asyncio.create_task(discover(services), name="endpoint-discovery"),
            asyncio.create_task(
                services.scraper.run(settings.scrape_interval_s), name="pool-scrape"
            ),
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
            await services.shadow.close()
            await services.state.close()
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
        *Admin(services).routes(),
    ]
    on_api_error = _counted(services.telemetry)
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={
            ApiError: on_api_error,
            HTTPException: _http_error,
            Exception: _unexpected,
        },
    )
    hot = {"/v1/chat/completions": api.chat, "/v1/completions": api.completions}
    return FastLane(app, hot, on_api_error)


def _counted(telemetry: Telemetry) -> Callable[[Request, Exception], Awaitable[Response]]:
    async def handler(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        telemetry.error(exc.status, exc.code or exc.type)
        return await api_error_handler(request, exc)

    return handler


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    kind = "not_found" if exc.status_code == 404 else "invalid_request_error"
    return ApiError(exc.status_code, str(exc.detail), kind).response(dict(exc.headers or {}))


async def _unexpected(request: Request, exc: Exception) -> Response:
    log.exception("unexpected error serving %s", request.url.path, exc_info=exc)
    return internal_error()
