"""The engine's other routes through the gateway, on real sockets: each answer equal to the
upstream's own (the simulator's tokenize, detokenize, embeddings and model card; an echoing
upstream for the routes the simulator does not serve, multipart audio included), the
passthrough pool and failover, the gateway's 404 for an unknown model in the route's API
shape, vLLM's 404 for an unknown path, and what metrics and headers say."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, NamedTuple

import anyio
import httpx
import orjson
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from prometheus_client.parser import text_string_to_metric_families
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from backends.sim.config import Mode, SimConfig
from backends.sim.server import create_app as sim_app
from gateway.identity import key_hash
from gateway.server.app import build_services, create_app
from gateway.services import Services
from tests.gateways import gateway, settings
from tests.servers import serving

pytestmark = pytest.mark.anyio

WALL = 1_764_000_000.0
MODEL = "tiny"


def echo(name: str) -> Starlette:
    """An upstream that answers every request with what it got, and who it is."""

    async def answer(request: Request) -> Response:
        body = await request.body()
        seen = {
            "served_by": name,
            "method": request.method,
            "path": request.url.path,
            "query": request.url.query,
            "content_type": request.headers.get("content-type"),
            "anthropic_version": request.headers.get("anthropic-version"),
            "sha256": hashlib.sha256(body).hexdigest(),
        }
        return Response(orjson.dumps(seen), media_type="application/json")

    return Starlette(routes=[Route("/{path:path}", answer, methods=["GET", "POST"])])


def policy(spec: list[str], standard: list[str], extra: str = "") -> str:
    return f"""
version: 1
pools:
  spec: {{kind: speculative, model: {MODEL}, num_speculative_tokens: 4, endpoints: {spec},
         timeouts: {{connect_s: 1, first_byte_s: 5, idle_s: 5, total_s: 10}}}}
  standard: {{kind: standard, model: {MODEL}, endpoints: {standard},
             timeouts: {{connect_s: 1, first_byte_s: 5, idle_s: 5, total_s: 10}}}}
ladder: [spec, standard]
{extra}
rules: [{{name: default, start: spec}}]
"""


class Stack(NamedTuple):
    url: str
    spec: str
    standard: str
    services: Services | None = None


@asynccontextmanager
async def sims(tmp: Path, extra: str = "", **overrides: Any) -> AsyncIterator[Stack]:
    """The gateway before two simulators of ``tiny`` whose clocks stand still."""
    configs = [
        SimConfig(mode=mode, served_model_names=(MODEL,), max_model_len=2048, time_scale=0.01)
        for mode in (Mode.SPECULATIVE, Mode.STANDARD)
    ]
    apps = [sim_app(c, wall_clock=lambda: WALL) for c in configs]
    async with serving(apps[0]) as spec, serving(apps[1]) as std:
        text = policy([spec], [std], extra)
        async with gateway(settings(tmp, text, **overrides)) as (url, services):
            yield Stack(url, spec, std, services)


@asynccontextmanager
async def echoes(tmp: Path, extra: str = "") -> AsyncIterator[Stack]:
    async with (
        serving(echo("spec")) as spec,
        serving(echo("standard")) as std,
        gateway(settings(tmp, policy([spec], [std], extra))) as (url, _),
    ):
        yield Stack(url, spec, std)


SIM_CALLS = [
    ("POST", "/tokenize", {"model": MODEL, "prompt": "hello speclane"}),
    ("POST", "/tokenize", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}),
    ("POST", "/detokenize", {"model": MODEL, "tokens": [104, 105]}),
    ("POST", "/v1/embeddings", {"model": MODEL, "input": ["a", "b"]}),
    ("POST", "/v1/embeddings", {"model": MODEL, "input": "x", "encoding_format": "float"}),
    ("POST", "/detokenize", {"model": MODEL, "tokens": [999]}),  # the engine's own 400
    ("GET", f"/v1/models/{MODEL}", None),
]


async def test_simulator_routes_answer_as_direct(tmp_path):
    async with sims(tmp_path) as stack, httpx.AsyncClient() as c:
        for method, path, body in SIM_CALLS:
            via = await c.request(method, stack.url + path, json=body)
            direct = await c.request(method, stack.standard + path, json=body)
            assert (via.status_code, via.content) == (direct.status_code, direct.content), path
            assert via.headers["content-type"] == direct.headers["content-type"]
            assert via.headers["x-speclane-pool"] == "standard"
            assert via.headers["x-speclane-reason"].startswith("passthrough: ")


ECHO_CALLS = [
    "/v1/messages/count_tokens",
    "/pooling",
    "/score",
    "/v1/score",
    "/rerank",
    "/v1/rerank",
    "/v2/rerank",
]


async def test_other_json_routes_pass_through_with_their_bytes(tmp_path):
    body = orjson.dumps({"model": MODEL, "query": "q", "documents": ["a", "b"]})
    headers = {"content-type": "application/json", "anthropic-version": "2023-06-01"}
    async with echoes(tmp_path) as stack, httpx.AsyncClient() as c:
        for path in ECHO_CALLS:
            via = await c.post(stack.url + path + "?x=1", content=body, headers=headers)
            direct = await c.post(stack.standard + path + "?x=1", content=body, headers=headers)
            assert via.status_code == 200
            assert via.content == direct.content, path
    seen = via.json()
    assert seen["sha256"] == hashlib.sha256(body).hexdigest()
    assert seen["anthropic_version"] == "2023-06-01" and seen["query"] == "x=1"


async def test_audio_goes_as_multipart_bytes_to_the_model_the_form_names(tmp_path):
    audio = bytes(range(256)) * 64  # binary, CRLFs and all
    files = {"file": ("a.wav", audio, "audio/wav")}
    data = {"model": MODEL, "language": "en"}
    async with echoes(tmp_path) as stack, httpx.AsyncClient() as c:
        for path in ("/v1/audio/transcriptions", "/v1/audio/translations"):
            via = await c.post(stack.url + path, files=files, data=data)
            assert via.status_code == 200, via.text
            seen = via.json()
            assert seen["path"] == path and seen["served_by"] == "standard"
            assert seen["content_type"].startswith("multipart/form-data; boundary=")
            assert seen["sha256"] == hashlib.sha256(via.request.read()).hexdigest()
        other = await c.post(stack.url + path, files=files, data={"model": "nope"})
    assert other.status_code == 404
    assert other.json()["error"]["code"] == "model_not_found"


async def test_multipart_body_bytes_reach_upstream_unchanged(tmp_path):
    boundary = "b0undary"
    body = (
        (
            f'--{boundary}\r\ncontent-disposition: form-data; name="model"\r\n\r\n{MODEL}\r\n'
            f'--{boundary}\r\ncontent-disposition: form-data; name="file"; filename="a.wav"\r\n'
            "content-type: audio/wav\r\n\r\n"
        ).encode()
        + bytes(range(256))
        + f"\r\n--{boundary}--\r\n".encode()
    )
    headers = {"content-type": f"multipart/form-data; boundary={boundary}"}
    async with echoes(tmp_path) as stack, httpx.AsyncClient() as c:
        via = await c.post(stack.url + "/v1/audio/transcriptions", content=body, headers=headers)
    assert via.json()["sha256"] == hashlib.sha256(body).hexdigest()


async def test_a_form_head_made_to_slow_the_model_search_is_read_in_linear_time(tmp_path):
    # a part's head of one long line saying content-disposition: over and over, no model in
    # it: searched from every place it says so, 320 KB held the gateway for half a minute
    boundary = "b0undary"
    head = b"content-disposition:" * 16_000
    body = f"--{boundary}\r\n".encode() + head + f"\r\n\r\nx\r\n--{boundary}--\r\n".encode()
    headers = {"content-type": f"multipart/form-data; boundary={boundary}"}
    async with echoes(tmp_path) as stack, httpx.AsyncClient(timeout=5) as c:
        via = await c.post(stack.url + "/v1/audio/transcriptions", content=body, headers=headers)
    assert via.status_code == 200 and via.json()["sha256"] == hashlib.sha256(body).hexdigest()


async def test_the_policy_names_the_passthrough_pool(tmp_path):
    async with echoes(tmp_path, "passthrough_pool: spec") as stack, httpx.AsyncClient() as c:
        via = await c.post(stack.url + "/tokenize", json={"model": MODEL, "prompt": "x"})
    assert via.json()["served_by"] == "spec"
    assert via.headers["x-speclane-reason"] == "passthrough: /tokenize of tiny goes to spec"


async def test_a_dead_endpoint_fails_over_to_the_next_one_and_the_next_pool(tmp_path, closed_port):
    dead = f"http://127.0.0.1:{closed_port()}"
    async with serving(echo("spec")) as spec, serving(echo("standard")) as std:
        text = policy([spec], [dead, std])
        async with gateway(settings(tmp_path, text)) as (url, _), httpx.AsyncClient() as c:
            for _ in range(4):  # whichever endpoint is tried first
                via = await c.post(url + "/tokenize", json={"model": MODEL, "prompt": "x"})
                assert via.status_code == 200 and via.json()["served_by"] == "standard"
        text = policy([spec], [dead])
        async with gateway(settings(tmp_path, text)) as (url, _), httpx.AsyncClient() as c:
            via = await c.post(url + "/tokenize", json={"model": MODEL, "prompt": "x"})
    assert via.status_code == 200 and via.json()["served_by"] == "spec"
    assert via.headers["x-speclane-pool"] == "spec"
    assert via.headers["x-speclane-reason"].startswith("failover: standard failed: ")


async def test_every_endpoint_down_is_a_503(tmp_path, closed_port):
    dead = [f"http://127.0.0.1:{closed_port()}"]
    async with (
        gateway(settings(tmp_path, policy(dead, dead))) as (url, _),
        httpx.AsyncClient() as c,
    ):
        plain = await c.post(url + "/v1/embeddings", json={"model": MODEL, "input": "x"})
        anthropic = await c.post(
            url + "/v1/messages/count_tokens", json={"model": MODEL, "messages": []}
        )
    assert plain.status_code == 503
    assert plain.json()["error"]["code"] == "no_healthy_upstream"
    assert "retry-after" in plain.headers
    assert anthropic.status_code == 503
    assert anthropic.json()["type"] == "error"
    assert anthropic.json()["error"]["type"] == "overloaded_error"


async def test_an_unknown_model_gets_the_gateways_404_in_the_routes_shape(tmp_path):
    async with echoes(tmp_path) as stack, httpx.AsyncClient() as c:
        openai_shaped = await c.post(stack.url + "/v1/embeddings", json={"model": "nope"})
        card = await c.get(stack.url + "/v1/models/nope")
        anthropic = await c.post(
            stack.url + "/v1/messages/count_tokens", json={"model": "nope", "messages": []}
        )
        unnamed = await c.post(stack.url + "/tokenize", json={"prompt": "x"})
    for answer in (openai_shaped, card):
        assert answer.status_code == 404
        assert answer.json()["error"] == {
            "message": "The model `nope` does not exist. Served models: tiny.",
            "type": "invalid_request_error",
            "param": "model",
            "code": "model_not_found",
        }
    assert anthropic.status_code == 404
    assert anthropic.json() == {
        "type": "error",
        "error": {
            "type": "not_found_error",
            "message": "The model `nope` does not exist. Served models: tiny.",
        },
    }
    assert unnamed.json()["served_by"] == "standard"  # one model: a request may name none


@pytest.mark.parametrize(
    ("method", "path", "status", "detail"),
    [
        ("GET", "/v1/nothing", 404, "Not Found"),
        ("POST", "/v2/whatever", 404, "Not Found"),
        ("GET", "/tokenize", 405, "Method Not Allowed"),
    ],
)
async def test_an_unknown_path_gets_vllms_own_answer(tmp_path, method, path, status, detail):
    async with sims(tmp_path) as stack, httpx.AsyncClient() as c:
        via = await c.request(method, stack.url + path)
        direct = await c.request(method, stack.standard + path)
    assert via.status_code == direct.status_code == status
    assert via.json() == direct.json() == {"detail": detail}


@pytest.mark.parametrize(
    "path", ["/tokenize/", "/v1/chat/completions/", "/v1/responses/resp_1/", "/admin/flags/"]
)
async def test_a_trailing_slash_is_an_unknown_path_never_a_redirect(tmp_path, path):
    # a redirect would be built from the client's Host: a link to anywhere
    async with sims(tmp_path) as stack, httpx.AsyncClient() as c:
        answer = await c.post(stack.url + path, json={}, headers={"host": "evil.example"})
    assert answer.status_code == 404
    assert answer.json() == {"detail": "Not Found"}
    assert "location" not in answer.headers


async def test_a_body_over_the_limit_is_refused(tmp_path):
    async with sims(tmp_path, max_body_bytes=1024) as stack, httpx.AsyncClient() as c:
        big = await c.post(stack.url + "/v1/embeddings", json={"model": MODEL, "input": "x" * 2000})
    assert big.status_code == 413
    assert big.json()["error"]["code"] == "request_too_large"


async def test_keys_are_required_alike_bearer_or_x_api_key(tmp_path):
    extra = f"tenants: {{acme: {{api_keys: ['{key_hash('sk-acme')}']}}}}"
    body = {"model": MODEL, "prompt": "x"}
    async with sims(tmp_path, extra, require_api_key=True) as stack, httpx.AsyncClient() as c:
        none = await c.post(stack.url + "/tokenize", json=body)
        bearer = await c.post(
            stack.url + "/tokenize", json=body, headers={"authorization": "Bearer sk-acme"}
        )
        x_api_key = await c.post(
            stack.url + "/tokenize", json=body, headers={"x-api-key": "sk-acme"}
        )
        anthropic = await c.post(
            stack.url + "/v1/messages/count_tokens", json=body, headers={"x-api-key": "wrong"}
        )
    assert none.status_code == 401 and none.json()["error"]["code"] == "invalid_api_key"
    assert bearer.status_code == x_api_key.status_code == 200
    assert anthropic.status_code == 401
    assert anthropic.json()["error"]["type"] == "authentication_error"


async def test_counted_by_endpoint_in_metrics(tmp_path):
    async with sims(tmp_path) as stack, httpx.AsyncClient() as c:
        await c.post(stack.url + "/tokenize", json={"model": MODEL, "prompt": "x"})
        await c.post(stack.url + "/tokenize", json={"model": MODEL, "prompt": "y"})
        await c.post(stack.url + "/detokenize", json={"model": MODEL, "tokens": [999]})
        await c.post(
            stack.url + "/v1/chat/completions",
            json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
        )
        text = (await c.get(stack.url + "/metrics")).text
    counted = {
        (s.labels["endpoint"], s.labels["rule"], s.labels["pool"], s.labels["status"]): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "speclane_requests_total" and s.labels["shadow"] == "false"
    }
    assert counted[("/tokenize", "passthrough", "standard", "ok")] == 2
    assert counted[("/detokenize", "passthrough", "standard", "error")] == 1
    assert counted[("/v1/chat/completions", "default", "spec", "ok")] == 1


async def test_traced_with_a_forward_step_under_the_clients_trace(tmp_path):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    async with serving(echo("spec")) as spec, serving(echo("standard")) as std:
        configured = settings(tmp_path, policy([spec], [std]))
        services = build_services(configured, tracers=provider)
        async with serving(create_app(configured, services)) as url, httpx.AsyncClient() as c:
            await c.post(
                url + "/v1/embeddings",
                json={"model": MODEL, "input": "x"},
                headers={"traceparent": parent},
            )
    spans = exporter.get_finished_spans()
    (server,) = [s for s in spans if s.kind is SpanKind.SERVER]
    assert server.name == "embeddings"
    assert format(server.context.trace_id, "032x") == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert server.attributes["http.response.status_code"] == 200
    children = [s.name for s in spans if s.parent and s.parent.span_id == server.context.span_id]
    assert children == ["parse", "forward"]


async def test_a_client_that_hangs_up_cancels_the_upstream_request(tmp_path):
    hung_up = anyio.Event()

    async def slow(request: Request) -> Response:
        while (await request.receive())["type"] != "http.disconnect":
            pass
        hung_up.set()  # the gateway closed its connection
        return Response(b"{}")

    upstream = Starlette(routes=[Route("/tokenize", slow, methods=["POST"])])
    async with (
        serving(upstream) as spec,
        serving(upstream) as std,
        gateway(settings(tmp_path, policy([spec], [std]))) as (url, _),
    ):
        async with httpx.AsyncClient(timeout=0.3) as c:
            with pytest.raises(httpx.TimeoutException):
                await c.post(url + "/tokenize", json={"model": MODEL, "prompt": "x"})
        with anyio.fail_after(5):
            await hung_up.wait()
