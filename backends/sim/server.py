"""The simulated vLLM as a Starlette app: ``create_app(config)`` and ``serve(config, host, port)``.

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions``, ``POST /v1/messages``,
``POST /v1/messages/count_tokens``, ``POST /v1/responses`` (``serving.SimServer``),
``GET /v1/models`` (each engine's ``owned_by``), ``GET /health``, ``GET /metrics`` (vLLM names,
app-owned registry), ``GET /version`` (vLLM-shaped engines), ``GET /server_info`` (SGLang),
``GET /prometheus/metrics`` (TensorRT-LLM), and the simulator's own ``GET /sim/state`` /
``POST /sim/control`` for tests and the demo::

    {"acceptance": {"code": 0.1, "json": null},   # set / clear a workload's base now
     "faults": {"error_rate": 0.2, "overloaded": false}}   # any Faults field

``"acceptance": null`` clears every override. The answer is the new state; its
``traceparents`` are the W3C trace contexts of the last 64 requests that carried one.

Beside generation: ``other_routes.py`` (tokenize, detokenize, embeddings,
``GET /v1/models/{id}``, vLLM's 404 for other paths) and ``stored.py`` (stored Responses API
responses: ``GET /v1/responses/{id}``, cancel, and vLLM's 405 for ``DELETE``;
``app.state.stored``).

Must not: keep module-level state or use the global Prometheus registry; wiring only.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

import orjson
import uvicorn
from prometheus_client.core import Metric
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from backends.sim.config import Faults, SimConfig
from backends.sim.dialects import SimEngine
from backends.sim.engine import Clock, Sleep
from backends.sim.engine_pages import (
    drain,
    sglang_families,
    sglang_server_info,
    trtllm_families,
)
from backends.sim.kvcache import KVCache
from backends.sim.metrics import CONTENT_TYPE, build_registry, exposition, registry_of
from backends.sim.other_routes import OtherRoutes, not_found
from backends.sim.serving import SimServer
from backends.sim.validation import SimHTTPError, bad_request
from backends.sim.workload import Workload

# Who a model card says owns the model (each engine's own ModelCard default), and the vLLM
# version ``GET /version`` names (vllm-neuron runs under vLLM 0.11).
_OWNERS = {
    SimEngine.VLLM: "vllm",
    SimEngine.VLLM_NEURON: "vllm",
    SimEngine.SGLANG: "sglang",
    SimEngine.TRTLLM: "tensorrt_llm",
}
_VERSIONS = {SimEngine.VLLM: "0.32.0", SimEngine.VLLM_NEURON: "0.11.0"}


def _json(value: object, status: int = 200) -> Response:
    return Response(orjson.dumps(value), status, media_type="application/json")


class _Admin:
    """The non-generation endpoints of one simulated server."""

    def __init__(self, sim: SimServer, wall_clock: Clock) -> None:
        self._sim = sim
        self._wall = wall_clock
        config = sim.config
        model = config.served_model_names[0]
        self._registry = build_registry(sim.scheduler, model, report_spec=config.counts_drafts)
        if config.engine is SimEngine.SGLANG:
            self._registry = registry_of(self._sglang)
        self._trtllm = registry_of(self._trtllm_counters)

    async def models(self, request: Request) -> Response:
        data = [self.card(name) for name in self._sim.config.served_model_names]
        return _json({"object": "list", "data": data})

    def card(self, name: str) -> dict[str, Any]:
        """The model card of ``name`` (``GET /v1/models`` lists them)."""
        created = int(self._wall())
        config = self._sim.config
        return {
            "id": name,
            "object": "model",
            "created": created,
            "owned_by": _OWNERS[config.engine],
            "root": config.root or f"{config.served_model_names[0]}/target",
            "parent": None,
            "max_model_len": config.max_model_len,
            "permission": [_permission(name, created)],
        }

    async def health(self, request: Request) -> Response:
        return Response(status_code=200)

    async def metrics(self, request: Request) -> Response:
        config = self._sim.config
        if config.engine is SimEngine.TRTLLM:  # iteration stats, drained on read
            return _json(drain(self._sim.iterations, config.max_num_seqs, config.speculative))
        return Response(exposition(self._registry), media_type=CONTENT_TYPE)

    async def prometheus(self, request: Request) -> Response:
        return Response(exposition(self._trtllm), media_type=CONTENT_TYPE)

    async def server_info(self, request: Request) -> Response:
        config, counters = self._sim.config, self._sim.scheduler.counters
        model = config.served_model_names[0]
        steps, accepted = counters.num_drafts, counters.num_accepted_tokens
        k = config.k if config.speculative else None
        return _json(sglang_server_info(steps, accepted, model, k))

    async def version(self, request: Request) -> Response:
        return _json({"version": _VERSIONS[self._sim.config.engine]})

    def _sglang(self) -> list[Metric]:
        scheduler = self._sim.scheduler
        model = self._sim.config.served_model_names[0]
        return sglang_families(
            self._sim.recent, scheduler.num_running, scheduler.num_waiting, model
        )

    def _trtllm_counters(self) -> list[Metric]:
        scheduler, model = self._sim.scheduler, self._sim.config.served_model_names[0]
        c = scheduler.counters
        return trtllm_families(
            c.num_draft_tokens,
            c.num_accepted_tokens,
            c.generation_tokens,
            scheduler.num_running,
            model,
        )

    async def state(self, request: Request) -> Response:
        return _json(self.snapshot())

    async def control(self, request: Request) -> Response:
        try:
            change = orjson.loads(await request.body())
            if not isinstance(change, dict):
                raise bad_request("the control body must be a JSON object")
            self._apply(change)
        except orjson.JSONDecodeError:
            return _json({"error": {"message": "invalid JSON", "code": 400}}, 400)
        except SimHTTPError as err:
            return Response(err.body, err.status, media_type="application/json")
        return _json(self.snapshot())

    def _apply(self, change: Mapping[str, Any]) -> None:
        unknown = set(change) - {"acceptance", "faults"}
        if unknown:
            raise bad_request(f"unknown control keys: {sorted(unknown)}")
        overrides = dict(self._sim.overrides)
        acceptance = change.get("acceptance", {})
        if acceptance is None:
            overrides.clear()
        elif isinstance(acceptance, Mapping):
            overrides = _override(overrides, acceptance)
        else:
            raise bad_request("acceptance must be an object of workload: value or null")
        faults = self._sim.faults
        if "faults" in change:
            faults = _faults(faults, change["faults"])
        self._sim.overrides, self._sim.faults = overrides, faults

    def snapshot(self) -> dict[str, Any]:
        sim = self._sim
        config = sim.config
        return {
            "mode": config.mode.value,
            "k": config.k,
            "models": list(config.served_model_names),
            "seed": config.seed,
            "time_scale": config.time_scale,
            "zero_latency": config.zero_latency,
            "uptime_s": sim.uptime_s,
            "running": sim.scheduler.num_running,
            "waiting": sim.scheduler.num_waiting,
            "acceptance": {w.value: sim.base_acceptance(w) for w in Workload},
            "overrides": {w.value: v for w, v in sim.overrides.items()},
            "faults": dataclasses.asdict(sim.faults),
            "outcomes": dataclasses.asdict(sim.outcomes),
            "counters": dataclasses.asdict(sim.scheduler.counters),
            "engine": config.engine.value,
            "speculating": sim.scheduler.speculative,
            "speculation_off_at": sim.speculation_off_at,
            "traceparents": list(sim.traceparents),
            "kv": _kv(sim.scheduler.kv),
        }


def _kv(kv: KVCache | None) -> dict[str, Any] | None:
    """The KV memory and prefix cache, for ``/sim/state``."""
    if kv is None:
        return None
    return {
        "blocks": kv.num_blocks,
        "block_size": kv.block_size,
        "used_blocks": kv.used_blocks,
        "cached_blocks": kv.cached_blocks,
        "usage": kv.usage,
        "prefix_caching": kv.caching,
    } | dataclasses.asdict(kv.stats)


def _override(current: dict[Workload, float], change: Mapping[str, Any]) -> dict[Workload, float]:
    out = dict(current)
    for name, value in change.items():
        try:
            workload = Workload(name)
        except ValueError as exc:
            names = [w.value for w in Workload]
            raise bad_request(f"unknown workload {name!r}; one of {names}") from exc
        if value is None:
            out.pop(workload, None)
        elif isinstance(value, int | float) and 0.0 <= value <= 1.0:
            out[workload] = float(value)
        else:
            raise bad_request(f"acceptance for {name} must be in [0, 1] or null")
    return out


def _faults(current: Faults, change: object) -> Faults:
    if not isinstance(change, Mapping):
        raise bad_request("faults must be an object of Faults fields")
    try:
        return dataclasses.replace(current, **change)
    except (TypeError, ValueError) as exc:
        raise bad_request(f"bad faults: {exc}") from exc


def _permission(name: str, created: int) -> dict[str, Any]:
    return {
        "id": "modelperm-"
        + hashlib.blake2b(f"{name}:{created}".encode(), digest_size=8).hexdigest(),
        "object": "model_permission",
        "created": created,
        "allow_create_engine": False,
        "allow_sampling": True,
        "allow_logprobs": True,
        "allow_search_indices": False,
        "allow_view": True,
        "allow_fine_tuning": False,
        "organization": "*",
        "group": None,
        "is_blocking": False,
    }


def create_app(
    config: SimConfig,
    *,
    clock: Clock = time.monotonic,
    sleep: Sleep = asyncio.sleep,
    wall_clock: Clock = time.time,
) -> Starlette:
    """A simulated vLLM server; the clocks and sleep are seams for tests."""
    sim = SimServer(config, clock=clock, sleep=sleep, wall_clock=wall_clock)
    admin = _Admin(sim, wall_clock)
    stored = sim.stored  # what POST /v1/responses keeps

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        await sim.engine.aclose()

    routes = [
        Route("/v1/chat/completions", sim.chat, methods=["POST"]),
        Route("/v1/completions", sim.completions, methods=["POST"]),
        Route("/v1/messages", sim.messages, methods=["POST"]),
        Route("/v1/messages/count_tokens", sim.count_tokens, methods=["POST"]),
        Route("/v1/responses", sim.responses, methods=["POST"]),
        Route("/v1/models", admin.models, methods=["GET"]),
        Route("/health", admin.health, methods=["GET"]),
        Route("/metrics", admin.metrics, methods=["GET"]),
        Route("/sim/state", admin.state, methods=["GET"]),
        Route("/sim/control", admin.control, methods=["POST"]),
        *OtherRoutes(config, admin.card, wall_clock).routes(),
        *stored.routes(),
    ]
    if config.engine is SimEngine.TRTLLM and config.prometheus:
        routes.append(Route("/prometheus/metrics", admin.prometheus, methods=["GET"]))
    if config.engine is SimEngine.SGLANG:
        routes.append(Route("/server_info", admin.server_info, methods=["GET"]))
    if config.engine.vllm_shaped:
        routes.append(Route("/version", admin.version, methods=["GET"]))
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={HTTPException: not_found})
    app.state.stored = stored  # what POST /v1/responses keeps, by id
    return app


async def serve(config: SimConfig, host: str = "127.0.0.1", port: int = 8101) -> None:
    """Serve a simulated vLLM on ``host:port`` in the running event loop.

    Runs until the server stops; cancelling it shuts the server down cleanly first.
    """
    server = uvicorn.Server(uvicorn_config(create_app(config), host, port, loop="none"))
    task = asyncio.ensure_future(server.serve())
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        server.should_exit = True
        await task
        raise


def uvicorn_config(app: Starlette, host: str, port: int, *, loop: str) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        loop=loop,
        http="httptools",
        log_level="warning",
        access_log=False,
        lifespan="on",
    )
