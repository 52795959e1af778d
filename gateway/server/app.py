"""The app factory: wiring only. Builds the services, the routes and the error handlers;
the lifespan runs ``gateway/lifespan.py``'s steps."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from opentelemetry.sdk.trace import TracerProvider
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp

from backends.outlier import OutlierRules
from backends.pool import Pools
from backends.upstream import Upstream
from gateway.apis import APIS, Registry
from gateway.classify import Defaults
from gateway.engines import ENGINES
from gateway.engines import Registry as Engines
from gateway.errors import ApiError, internal_error, route_not_found
from gateway.forward.passthrough import PerRequestReports
from gateway.forward.shadow import ShadowLimits, ShadowRunner
from gateway.gate import Gate
from gateway.identity import Identity
from gateway.lifecycle import policy_changed, pool_specs
from gateway.lifespan import running
from gateway.measure.canary import Canary, CanaryLimits
from gateway.measure.checks import Checks
from gateway.measure.feedback import Feedback
from gateway.measure.livestats import LiveStats
from gateway.measure.load import LoadMeter
from gateway.measure.loadscrape import LoadScraper
from gateway.measure.outcomelog import OutcomeLog
from gateway.measure.requestlog import RequestLog
from gateway.measure.scrape import PoolScraper
from gateway.measure.signals import SignalsSeen
from gateway.measure.telemetry import Telemetry
from gateway.server.admin import Admin
from gateway.server.api import Endpoints
from gateway.server.console.routes import console_off_routes, console_routes
from gateway.server.fastlane import FastLane
from gateway.server.relayed import OTHER_ROUTES
from gateway.services import Services
from gateway.settings import Settings
from gateway.state.flagstore import FlagStore
from gateway.state.memory import MemoryState, SharedState
from gateway.state.pins import MemoryPins, RedisPins, ResponsePins
from gateway.state.policyfile import PolicyHolder
from gateway.state.prefixes import MemoryPrefixes, PrefixMap, RedisPrefixes
from gateway.state.redis_store import RedisState
from policies.compiled import CompiledPolicy

log = logging.getLogger(__name__)


def build_services(
    settings: Settings,
    policy: PolicyHolder | None = None,
    *,
    clock: Callable[[], float] | None = None,
    wall: Callable[[], float] | None = None,
    tracers: TracerProvider | None = None,
    engines: Engines = ENGINES,
) -> Services:
    """``tracers``, when given, is where spans go instead of ``settings.otlp_endpoint``;
    ``clock`` (monotonic) and ``wall``, when given, replace the clocks ``settings`` says;
    ``engines``: those a pool's ``engine`` may name (``gateway/engines/``)."""
    clock = clock or scaled(time.monotonic, settings.time_scale)
    wall = wall or scaled(time.time, settings.time_scale)
    holder = policy or PolicyHolder.from_file(settings.policy, engines)
    current = holder.get
    upstream = Upstream(
        max_connections=settings.upstream_connections,
        keepalive_s=settings.upstream_keepalive_s,
        max_response_bytes=settings.max_response_bytes,
    )
    telemetry = Telemetry.build(
        settings.otlp_endpoint,
        tracers,
        shared=settings.metrics_dir if settings.several_workers else None,
        max_slices=settings.metrics_max_slices,
    )
    flags = FlagStore(holder.current)
    identity = Identity(settings.trusted_tenant_header, settings.require_api_key)
    identity.policy_changed(holder.current)
    pools = Pools(
        pool_specs(holder.current),
        upstream,
        clock,
        outlier=outlier_rules(settings),
        tries_per_pool=settings.tries_per_pool,
    )
    load = _load_meter(settings, pools, current)
    stats = LiveStats(current, on_transition=telemetry.transition, load=load.ladder)
    feedback = Feedback(
        stats, telemetry, SignalsSeen(), _outcome_log(settings, current), load, wall
    )
    checks = Checks(feedback.record)
    state = _state(settings, flags, stats, current, telemetry, wall)
    services = Services(
        settings=settings,
        clock=clock,
        wall=wall,
        policy=holder,
        flags=flags,
        stats=stats,
        state=state,
        upstream=upstream,
        pools=pools,
        telemetry=telemetry,
        shadow=_shadow(settings, pools, clock, checks, telemetry, feedback, engines),
        feedback=feedback,
        scraper=_scraper(settings, pools, upstream, stats, wall, telemetry, state, engines),
        defaults=_defaults(settings),
        identity=identity,
        gate=Gate(identity, current, settings.max_requests, settings.max_requests_per_tenant),
        reports=PerRequestReports(),
        load=load,
        checks=checks,
        load_scraper=_load_scraper(pools, upstream, load, clock, stats, wall, engines),
        request_log=_request_log(settings),
        pins=_pins(settings, clock, telemetry),
        prefixes=_prefixes(settings, clock),
        engines=engines,
    )
    telemetry.watch(stats.views, current, wall, flags.known, load.kept_shares)
    holder.subscribe(lambda new: policy_changed(services, new))
    return services


def _defaults(settings: Settings) -> Defaults:
    return Defaults(
        settings.default_temperature,
        settings.default_top_p,
        endpoint_header=settings.endpoint_header.lower(),
    )


def _load_scraper(
    pools: Pools,
    upstream: Upstream,
    load: LoadMeter,
    clock: Callable[[], float],
    stats: LiveStats,
    wall: Callable[[], float],
    engines: Engines,
) -> LoadScraper:
    """The engines' load pages, their step counters teaching each pool's step time."""
    return LoadScraper(
        pools,
        upstream,
        load,
        clock,
        on_step=lambda pool, k, step: stats.steps.learn_engine(
            pool, k, step.seconds, step.batch, step.prefill, wall()
        ),
        engines=engines,
    )


def _load_meter(
    settings: Settings, pools: Pools, policy: Callable[[], CompiledPolicy]
) -> LoadMeter:
    return LoadMeter(
        lambda: {
            name: [(e.url, e.outstanding, e.load.area()) for e in endpoints]
            for name, endpoints in pools.endpoints.items()
        },
        lambda: {model: ladder.pools for model, ladder in policy().ladders.items()},
        gauge_fresh_s=1.5 * settings.scrape_interval_s,
    )


def _outcome_log(settings: Settings, policy: Callable[[], CompiledPolicy]) -> OutcomeLog:
    return OutcomeLog(
        lambda pool: policy().price(pool),
        keep=settings.outcome_records,
        path=settings.outcome_log,
        max_bytes=int(settings.outcome_log_max_mb * 1024 * 1024),
    )


def _shadow(
    settings: Settings,
    pools: Pools,
    clock: Callable[[], float],
    checks: Checks,
    telemetry: Telemetry,
    feedback: Feedback,
    engines: Engines,
) -> ShadowRunner:
    limits = ShadowLimits.of(settings)
    canary = CanaryLimits(settings.canary_max_mismatch, settings.canary_min_samples)
    alarm = Canary(telemetry, canary, feedback.canary_failed)
    return ShadowRunner(pools, clock, checks, telemetry, limits, alarm, feedback.prefilled, engines)


def _scraper(
    settings: Settings,
    pools: Pools,
    upstream: Upstream,
    stats: LiveStats,
    wall: Callable[[], float],
    telemetry: Telemetry,
    state: SharedState,
    engines: Engines,
) -> PoolScraper:
    return PoolScraper(
        pools,
        upstream,
        stats,
        wall,
        telemetry.pool_acceptance,
        # a reading stands for the last six scrapes, and never less than a minute
        window_s=max(60.0, 6 * settings.scrape_interval_s),
        drain=state.drained,
        engines=engines,
    )


def _request_log(settings: Settings) -> RequestLog | None:
    if not settings.request_log:
        return None
    return RequestLog(
        settings.request_log, (settings.endpoint_header.lower(), Defaults().tenant_header)
    )


def scaled(real: Callable[[], float], scale: float) -> Callable[[], float]:
    """``real`` as a clock that runs ``1 / scale`` times as fast (``time_scale``), from the
    start of the current UTC day: replicas started that day agree on the time."""
    if scale == 1.0:
        return real
    epoch = real() // 86_400 * 86_400

    def clock() -> float:
        return epoch + (real() - epoch) / scale

    return clock


def outlier_rules(settings: Settings) -> OutlierRules:
    return OutlierRules(
        consecutive_failures=settings.outlier_consecutive_failures,
        interval_s=settings.outlier_interval_s,
        base_ejection_s=settings.outlier_base_ejection_s,
        max_ejection_s=settings.outlier_max_ejection_s,
        max_ejection_percent=settings.outlier_max_ejection_percent,
        failure_percentage=settings.outlier_failure_percentage,
        slow_start_s=settings.outlier_slow_start_s,
    )


def _state(
    settings: Settings,
    flags: FlagStore,
    stats: LiveStats,
    policy: Callable[[], CompiledPolicy],
    telemetry: Telemetry,
    wall: Callable[[], float],
) -> SharedState:
    if settings.redis_url is None:
        return MemoryState(flags, stats.replica)
    return RedisState(
        settings.redis_url,
        settings.namespace,
        flags,
        stats.replica,
        policy,
        telemetry,
        wall,
        interval_s=settings.real_s(settings.sync_interval_s),
        password=settings.redis_secret,
    )


def _pins(settings: Settings, clock: Callable[[], float], telemetry: Telemetry) -> ResponsePins:
    ttl_s, per_tenant = settings.response_pin_ttl_s, settings.response_pins_per_tenant
    local = MemoryPins(ttl_s, clock=clock, per_tenant=per_tenant)
    if settings.redis_url is None:
        return local
    return RedisPins(
        settings.redis_url,
        settings.namespace,
        settings.real_s(ttl_s),
        password=settings.redis_secret,
        per_tenant=per_tenant,
        local=local,
        dropped=telemetry.pin_writes_dropped,
    )


def _prefixes(settings: Settings, clock: Callable[[], float]) -> PrefixMap:
    ttl_s = settings.prefix_ttl_s
    local = MemoryPrefixes(ttl_s, clock=clock, max_entries=settings.prefix_map_entries)
    if settings.redis_url is None:
        return local
    return RedisPrefixes(
        settings.redis_url,
        settings.namespace,
        settings.real_s(ttl_s),
        password=settings.redis_secret,
        local=local,
    )


def create_app(
    settings: Settings, services: Services | None = None, apis: Registry = APIS
) -> ASGIApp:
    """The gateway as an ASGI app; pass ``services`` to plug in prebuilt collaborators. It
    serves every API of ``apis`` (``gateway/apis/``) at its path, through the fast lane."""
    services = services or build_services(settings)
    api = Endpoints(services)
    served = {model_api.path: api.model_api(model_api) for model_api in apis}

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with running(services):
            yield

    async def metrics(request: Request) -> Response:
        services.telemetry.push()
        return Response(
            generate_latest(services.telemetry.exposition), media_type=CONTENT_TYPE_LATEST
        )

    routes = [
        *(Route(path, endpoint, methods=["POST"]) for path, endpoint in served.items()),
        Route("/v1/models", api.models, methods=["GET"]),
        Route("/v1/models/{model:path}", api.model_card, methods=["GET"]),
        *(Route(path, api.other_route, methods=["POST"]) for path in OTHER_ROUTES),
        Route("/v1/responses/{response_id}", api.stored_response, methods=["GET", "DELETE"]),
        Route("/v1/responses/{response_id}/cancel", api.stored_response, methods=["POST"]),
        Route("/version", api.version, methods=["GET"]),
        Route("/healthz", api.healthz, methods=["GET"]),
        Route("/health", api.health, methods=["GET"]),
        Route("/readyz", api.readyz, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
        *Admin(services).routes(),
    ]
    if settings.admin_token is not None and settings.console:
        routes += console_routes()
    else:
        routes += console_off_routes(admin_api=settings.admin_token is not None)
    on_api_error = _counted(services.telemetry, apis)
    on_crash = _crashed(services.telemetry, apis)
    app = Starlette(
        routes=routes,
        lifespan=lifespan,
        exception_handlers={
            ApiError: on_api_error,
            HTTPException: _http_error(apis),
            Exception: on_crash,
        },
    )
    # A path with a trailing slash is an unknown path (404), never a redirect: Starlette
    # builds the redirect's target from the client's Host header.
    app.router.redirect_slashes = False
    return FastLane(app, served, on_api_error, services.gate, on_crash)


Handler = Callable[[Request, Exception], Awaitable[Response]]


def _counted(telemetry: Telemetry, apis: Registry) -> Handler:
    """Errors of the model routes are counted; the admin API's (a wrong token, an unknown
    flag) and the console's are the operator's, not the clients'. Each is answered in the
    shape of the API it came in on."""

    async def handler(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ApiError)
        path = request.scope["path"]
        if path.startswith("/v1/"):
            telemetry.error(exc.status, exc.code or exc.type)
        return exc.response(shape=apis.shape_of(path))

    return handler


def _http_error(apis: Registry) -> Handler:
    """A path the gateway does not serve, or a method its route lacks: vLLM's own answer."""

    async def handler(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        if exc.status_code in (404, 405):
            return route_not_found(exc.status_code)
        error = ApiError(status=exc.status_code, message=str(exc.detail))
        return error.response(dict(exc.headers or {}), apis.shape_of(request.scope["path"]))

    return handler


def _crashed(telemetry: Telemetry, apis: Registry) -> Handler:
    """A bug: logged with its traceback, answered 500 with no detail in the shape of the API
    it came in on, and counted like any other error answer of the model APIs
    (``speclane_request_errors_total``)."""

    async def handler(request: Request, exc: Exception) -> Response:
        log.exception("unexpected error serving %s", request.url.path, exc_info=exc)
        path = request.scope["path"]
        if path.startswith("/v1/"):
            telemetry.error(500, "internal_error")
        return internal_error(apis.shape_of(path))

    return handler
