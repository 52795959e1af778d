"""A new API is one module and one registry row: a toy ``POST /v1/echo``, defined here whole
(its request model, its dialect, how its stream opens and where its errors are), registered
beside the built-in APIs, and served end to end through a real gateway on loopback in front
of a tiny real upstream, streamed and whole: routed by a rule that names it, relayed event
by event as it came, measured in its own dialect, and refused in its own error form."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import orjson
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from backends.upstream import Opening
from gateway.apis import APIS, Api
from gateway.measure.answer import Measurement
from gateway.schema import CompletionRequest
from gateway.server.app import build_services, create_app
from gateway.server.connections import server_options
from gateway.services import Services
from tests.gateways import policy_yaml, settings
from tests.servers import serving

pytestmark = pytest.mark.anyio

# --- the new API, whole: the one module ---------------------------------------------------


class EchoRequest(CompletionRequest):
    """``{"model", "prompt", "times", "stream"}``: the prompt, said ``times`` times."""

    times: int = 1


class Echo:
    """The echo API's dialect: ``echo.start``, one ``echo.delta`` a word, ``echo.done`` with
    the usage; ``echo.failed`` is its error event."""

    __slots__ = ()
    last = frozenset({"echo.done"})

    def event(
        self, measurement: Measurement, event: dict[str, Any], now: float
    ) -> tuple[str, int | None] | None:
        kind = event.get("type")
        if kind == "echo.delta":
            measurement.content(now, None, event["text"])
        elif kind == "echo.done":
            measurement.finished("stop")
            measurement.usage(_usage(event["usage"]), None)
        elif kind == "echo.failed":
            return f"upstream error: {event['error']}", event.get("code")
        return None

    def whole(self, measurement: Measurement, body: dict[str, Any]) -> None:
        measurement.usage(_usage(body["usage"]), None)
        measurement.finished("stop")
        measurement.answered(body["text"], None)


def _usage(usage: dict[str, int]) -> dict[str, int]:
    return {"prompt_tokens": usage["in"], "completion_tokens": usage["out"]}


def _failed(event: dict[str, Any]) -> dict[str, Any] | None:
    return event if event.get("type") == "echo.failed" else None


ECHO = Api(
    name="echo",
    path="/v1/echo",
    operation="text_completion",
    shape="openai",
    model=EchoRequest,
    dialect=Echo(),
    opening=Opening(events=True, preludes=frozenset({"echo.start"}), error=_failed),
)

# --- the registry row ---------------------------------------------------------------------

WITH_ECHO = APIS.plus(ECHO)

# --- a tiny real upstream that speaks it --------------------------------------------------


def _event(data: dict[str, Any]) -> bytes:
    return b"event: " + data["type"].encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def echo_upstream(name: str) -> Starlette:
    async def echo(request: Request) -> Response:
        body = await request.json()
        words = [body["prompt"]] * body.get("times", 1)
        usage = {"in": 1, "out": len(words)}
        if body["prompt"] == "refuse":
            failed = {"type": "echo.failed", "error": f"{name} refuses", "code": 422}
            if not body.get("stream"):
                return Response(orjson.dumps({"error": failed}), 422)

            async def refused() -> AsyncIterator[bytes]:
                yield _event({"type": "echo.start"}) + _event(failed)

            return StreamingResponse(refused(), media_type="text/event-stream")
        if not body.get("stream"):
            whole = {"type": "echo", "by": name, "text": " ".join(words), "usage": usage}
            return Response(orjson.dumps(whole), media_type="application/json")

        async def events() -> AsyncIterator[bytes]:
            yield _event({"type": "echo.start", "by": name})
            for word in words:
                yield _event({"type": "echo.delta", "text": word})
            yield _event({"type": "echo.done", "usage": usage})

        return StreamingResponse(events(), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/echo", echo, methods=["POST"])])


RULES = """
rules:
  - name: echoes
    match: {endpoint: [echo]}
    start: standard
  - name: default
    start: spec
"""


@asynccontextmanager
async def echo_gateway(tmp_path: Any) -> AsyncIterator[tuple[str, Services]]:
    async with serving(echo_upstream("spec")) as spec, serving(echo_upstream("std")) as std:
        configured = settings(tmp_path, policy_yaml([spec], [std], rules=RULES))
        services = build_services(configured)
        app = create_app(configured, services, apis=WITH_ECHO)
        async with serving(app, **server_options(configured)) as url:
            yield url, services


async def test_a_registered_api_is_served_streamed_and_whole_through_a_real_gateway(tmp_path):
    body = {"model": "tiny", "prompt": "hi", "times": 3}
    async with echo_gateway(tmp_path) as (url, services), httpx.AsyncClient(timeout=10) as c:
        streamed = await c.post(url + "/v1/echo", json=body | {"stream": True})
        whole = await c.post(url + "/v1/echo", json=body)
        records = services.outcomes.recent()
    assert streamed.status_code == 200, streamed.text
    assert streamed.headers["x-speclane-pool"] == "standard"  # the rule that names the API
    assert streamed.headers["x-speclane-rule"] == "echoes"
    expected = [{"type": "echo.start", "by": "std"}] + [{"type": "echo.delta", "text": "hi"}] * 3
    expected.append({"type": "echo.done", "usage": {"in": 1, "out": 3}})
    assert streamed.content == b"".join(_event(e) for e in expected)  # relayed as it came
    assert whole.status_code == 200 and whole.headers["x-speclane-pool"] == "standard"
    usage = expected[-1]["usage"]
    assert whole.json() == {"type": "echo", "by": "std", "text": "hi hi hi", "usage": usage}
    assert [(r["rule"], r["status"], r["completion_tokens"]) for r in records] == [
        ("echoes", "ok", 3),
        ("echoes", "ok", 3),
    ]
    assert records[0]["steps"] == 2  # its dialect's deltas: one step each after the first


async def test_a_registered_apis_refusal_is_read_by_its_own_error_reader(tmp_path):
    body = {"model": "tiny", "prompt": "refuse", "stream": True}
    async with echo_gateway(tmp_path) as (url, _), httpx.AsyncClient(timeout=10) as c:
        refused = await c.post(url + "/v1/echo", json=body)
        bad = await c.post(url + "/v1/echo", json={"model": "tiny", "prompt": "x", "times": "a"})
    assert refused.status_code == 422  # a 4xx: the client's answer, no failover
    error = refused.json()["error"]
    assert error["message"] == "std refuses" and error["code"] == "upstream_rejected"
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "times"


async def test_the_built_in_registry_does_not_serve_it(tmp_path):
    async with serving(echo_upstream("spec")) as up:
        configured = settings(tmp_path, policy_yaml([up], [up]))
        app = create_app(configured)
        async with serving(app, **server_options(configured)) as url, httpx.AsyncClient() as c:
            answer = await c.post(url + "/v1/echo", json={"model": "tiny", "prompt": "x"})
    assert answer.status_code == 404
