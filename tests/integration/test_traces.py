"""One request, one trace: a server span under the client's trace context, a child per
pipeline step, GenAI attributes, and the trace context arriving at the upstream (the
simulator records each ``traceparent`` it gets, as vLLM's ``llm_request`` span reads it)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import openai
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from backends.sim.config import Mode, SimConfig
from backends.sim.server import create_app as sim_app
from gateway.server.app import build_services, create_app
from tests.gateways import policy_yaml, settings
from tests.servers import serving

pytestmark = pytest.mark.anyio

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
STEPS = ["parse", "classify", "decide", "forward", "relay"]


@asynccontextmanager
async def traced(
    tmp: Path, *, export: bool
) -> AsyncIterator[tuple[str, str, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    sim = SimConfig(mode=Mode.SPECULATIVE, served_model_names=("tiny",), time_scale=0.02)
    std = SimConfig(mode=Mode.STANDARD, served_model_names=("tiny",), time_scale=0.02)
    async with serving(sim_app(sim)) as spec_url, serving(sim_app(std)) as std_url:
        configured = settings(tmp, policy_yaml([spec_url], [std_url]))
        services = build_services(configured, tracers=provider if export else None)
        async with serving(create_app(configured, services)) as url:
            yield url, spec_url, exporter


def tree(exporter: InMemorySpanExporter) -> tuple[ReadableSpan, list[ReadableSpan]]:
    spans = exporter.get_finished_spans()
    (server,) = [s for s in spans if s.kind is SpanKind.SERVER]
    children = sorted(
        (s for s in spans if s.parent is not None and s.parent.span_id == server.context.span_id),
        key=lambda s: s.start_time or 0,
    )
    return server, children


async def traceparents(c: httpx.AsyncClient, sim: str) -> list[str]:
    return list((await c.get(sim + "/sim/state")).json()["traceparents"])


@pytest.mark.parametrize("stream", [True, False])
async def test_one_request_is_one_trace_joined_by_the_upstream(tmp_path, stream):
    header = f"00-{TRACE}-{CLIENT_SPAN}-01"
    async with traced(tmp_path, export=True) as (url, sim, exporter), httpx.AsyncClient() as c:
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="k", http_client=c)
        asked = {
            "model": "tiny",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 16,
            "temperature": 0.2,
            "extra_headers": {"traceparent": header, "tracestate": "vendor=1"},
        }
        if stream:
            async for _ in await client.chat.completions.create(stream=True, **asked):
                pass
        else:
            await client.chat.completions.create(**asked)
        sent = await traceparents(c, sim)
    server, children = tree(exporter)
    assert server.name == "chat tiny"
    assert f"{server.context.trace_id:032x}" == TRACE
    assert server.parent is not None and f"{server.parent.span_id:016x}" == CLIENT_SPAN
    assert [s.name for s in children] == STEPS
    assert all(s.context.trace_id == server.context.trace_id for s in children)
    attributes = dict(server.attributes or {})
    assert attributes["gen_ai.operation.name"] == "chat"
    assert attributes["gen_ai.request.model"] == "tiny"
    assert attributes["gen_ai.request.max_tokens"] == 16
    assert attributes["gen_ai.usage.output_tokens"] > 0
    assert attributes["gen_ai.usage.input_tokens"] > 0
    assert attributes["gen_ai.response.finish_reasons"] in (("length",), ("stop",))
    assert attributes["speclane.rule"] == "default" and attributes["speclane.pool"] == "spec"
    assert attributes["speclane.signal"] == "per_request"
    assert 0 <= attributes["speclane.draft_acceptance_rate"] <= 1
    assert attributes["http.response.status_code"] == 200
    # vLLM's span would be a child of the forward span, in the client's trace
    forward = next(s for s in children if s.name == "forward")
    assert forward.kind is SpanKind.CLIENT
    assert sent == [f"00-{TRACE}-{forward.context.span_id:016x}-01"]


async def test_a_bad_request_ends_its_trace_without_a_stack_trace(tmp_path):
    async with traced(tmp_path, export=True) as (url, _, exporter), httpx.AsyncClient() as c:
        bad = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "n": "x"}
        assert (await c.post(url + "/v1/chat/completions", json=bad)).status_code == 400
    server, children = tree(exporter)
    assert [s.name for s in children] == ["parse"]
    for span in (server, *children):
        assert span.events == () and span.status.is_ok
        assert (span.attributes or {})["error.type"] == "invalid_request_error"
    assert (server.attributes or {})["http.response.status_code"] == 400


async def test_without_an_exporter_the_clients_context_still_reaches_the_upstream(tmp_path):
    header = f"00-{TRACE}-{CLIENT_SPAN}-01"
    async with traced(tmp_path, export=False) as (url, sim, exporter), httpx.AsyncClient() as c:
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        headers = {"traceparent": header}
        assert (await c.post(url + "/v1/chat/completions", json=body)).status_code == 200
        response = await c.post(url + "/v1/chat/completions", json=body, headers=headers)
        assert response.status_code == 200
        assert await traceparents(c, sim) == [header]
    assert exporter.get_finished_spans() == ()
