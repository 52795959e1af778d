"""What a client can get wrong or do on purpose, against a real gateway: deep JSON, a
request id that is not one, hanging up before the first byte or in the middle of the body,
and 4xx answers that are OpenAI-shaped, without a stack trace on their spans."""

from __future__ import annotations

import asyncio
import logging

import httpx
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from backends.sim.config import Faults, Mode, SimConfig
from gateway.errors import ApiError
from gateway.measure.telemetry import Telemetry
from tests.fakes import FakeUpstream
from tests.gateways import fake_stack, sim_stack

pytestmark = pytest.mark.anyio

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
POLICY = """
version: 1
pools:
  spec:
    kind: speculative
    model: qwen3-32b
    num_speculative_tokens: 4
    endpoints: ["{spec}"]
    timeouts: {{first_byte_s: 60}}
  standard: {{kind: standard, model: qwen3-32b, endpoints: ["{std}"]}}
ladder: [spec, standard]
rules: [{{name: default, start: spec}}]
"""


async def test_deep_json_is_a_400_at_every_depth(tmp_path):
    fake = FakeUpstream()
    async with fake_stack(tmp_path, fake.app(), fake.app()) as (url, _), httpx.AsyncClient() as c:
        answers = []
        for levels in (200, 254, 300, 1023, 5000):
            deep = "[" * levels + "]" * levels
            body = '{"model": "tiny", "messages": [{"role": "user", "content": "x"}], "x": %s}'
            answers.append(await c.post(url + "/v1/chat/completions", content=body % deep))
    assert [r.status_code for r in answers] == [400] * 5
    assert all(set(r.json()["error"]) == {"message", "type", "param", "code"} for r in answers)
    assert fake.received == []


@pytest.mark.parametrize(
    ("given", "kept"),
    [("req-42.a:b_c", True), ("x" * 129, False), ("x" * 60_000, False), ("a b", False)],
)
async def test_a_request_id_is_echoed_only_when_it_is_a_short_token(tmp_path, given, kept):
    fake = FakeUpstream()
    async with fake_stack(tmp_path, fake.app(), fake.app()) as (url, _), httpx.AsyncClient() as c:
        r = await c.post(url + "/v1/chat/completions", json=CHAT, headers={"x-request-id": given})
    assert r.status_code == 200
    echoed = r.headers["x-request-id"]
    assert (echoed == given) is kept
    assert len(echoed) <= 128 and echoed.replace("-", "").replace(".", "").isascii()


async def test_hanging_up_before_the_first_byte_cancels_the_upstream_at_once(tmp_path):
    hang = SimConfig(mode=Mode.SPECULATIVE, time_scale=0.02, faults=Faults(hang_rate=1.0))
    async with sim_stack(tmp_path, POLICY, hang) as stack:
        for stream in (True, False):
            async with httpx.AsyncClient(timeout=0.3) as c:
                with pytest.raises(httpx.ReadTimeout):
                    body = {**CHAT, "model": "qwen3-32b", "stream": stream}
                    await c.post(stack.url + "/v1/chat/completions", json=body)
        async with httpx.AsyncClient() as c:
            for _ in range(100):  # the pool waits 60 s for a first byte: only a cancel ends it
                state = (await c.get(stack.spec + "/sim/state")).json()
                if state["outcomes"]["cancelled"] == 2:
                    break
                await asyncio.sleep(0.02)
    assert state["outcomes"]["hangs"] == 2 and state["outcomes"]["cancelled"] == 2
    assert stack.services.pools.endpoints["spec"][0].outstanding == 0


async def test_hanging_up_mid_body_is_not_an_error_in_the_log(tmp_path, caplog):
    fake = FakeUpstream()
    async with fake_stack(tmp_path, fake.app(), fake.app()) as (url, _):
        host, port = url.removeprefix("http://").split(":")
        for _ in range(3):
            reader, writer = await asyncio.open_connection(host, int(port))
            head = "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 5000\r\n\r\n"
            writer.write(head.encode() + b'{"model": "tiny", "mess')
            await writer.drain()
            await asyncio.sleep(0.05)
            writer.close()
            await writer.wait_closed()
        async with httpx.AsyncClient() as c:  # still serving
            assert (await c.post(url + "/v1/chat/completions", json=CHAT)).status_code == 200
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []


def test_a_client_error_puts_no_stack_trace_on_its_span():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing = Telemetry.build(tracers=provider).tracing
    for error in (
        ApiError(status=400, message="bad temperature", param="temperature"),
        ValueError("bug"),
    ):
        with pytest.raises(type(error)), tracing.begin({}, "chat").step("parse"):
            raise error
    client, bug = exporter.get_finished_spans()
    assert client.events == () and client.status.is_ok
    assert client.attributes is not None
    assert client.attributes["error.type"] == "invalid_request_error"
    assert [e.name for e in bug.events] == ["exception"] and not bug.status.is_ok
