"""Errors in OpenAI's shape, failover before the first byte, a final error event after it,
and cancellation reaching the upstream: against fake upstreams on real sockets."""

from __future__ import annotations

import asyncio
import json
import time

import anthropic
import httpx
import openai
import pytest

from tests.fakes import Behaviour, FakeUpstream
from tests.gateways import fake_stack

pytestmark = pytest.mark.anyio

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}


def client(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=url + "/v1", api_key="k", max_retries=0)


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        (b"{not json", 400, None),
        (b"[1, 2]", 400, None),
        (b'{"messages": [{"role": "user", "content": "x"}]}', 400, "model"),
        (b'{"model": "tiny", "messages": []}', 400, "messages"),
        (b'{"model": "tiny", "messages": [{"content": "x"}]}', 400, "messages.0.role"),
        (
            b'{"model": "tiny", "messages": [{"role": "user"}], "temperature": 7}',
            400,
            "temperature",
        ),
        (b'{"model": "tiny", "messages": [{"role": "user"}], "max_tokens": 0}', 400, "max_tokens"),
        (b'{"model": "nope", "messages": [{"role": "user", "content": "x"}]}', 404, "model"),
    ],
)
async def test_bad_requests_get_openai_errors(tmp_path, body, status, param):
    fake = FakeUpstream()
    async with fake_stack(tmp_path, fake.app(), fake.app()) as (url, _), httpx.AsyncClient() as c:
        response = await c.post(url + "/v1/chat/completions", content=body)
    assert response.status_code == status
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param
    assert fake.received == []


@pytest.mark.parametrize(
    ("content_type", "status"),
    [
        ("text/plain;charset=UTF-8", 415),
        ("application/x-www-form-urlencoded", 415),
        ("multipart/form-data; boundary=x", 415),
        ("application/json; charset=utf-8", 200),
        ("application/vnd.api+json", 200),
        (None, 200),
    ],
)
async def test_a_body_sent_as_anything_but_json_is_415(tmp_path, content_type, status):
    """What a web page can make a browser post without asking first never reaches an engine,
    on OpenAI's routes and Anthropic's alike, each in its own shape."""
    fake = FakeUpstream()
    headers = {"content-type": content_type} if content_type else {}
    raw = json.dumps(CHAT).encode()
    messages = json.dumps({**CHAT, "max_tokens": 8}).encode()
    async with fake_stack(tmp_path, fake.app(), fake.app()) as (url, _), httpx.AsyncClient() as c:
        chat = await c.post(url + "/v1/chat/completions", content=raw, headers=headers)
        anthropic_ = await c.post(url + "/v1/messages", content=messages, headers=headers)
    assert chat.status_code == status
    if status == 415:
        assert chat.json()["error"]["code"] == "unsupported_media_type"
        assert anthropic_.status_code == 415
        assert anthropic_.json()["type"] == "error"
        assert anthropic_.json()["error"]["type"] == "invalid_request_error"
        assert fake.received == []


async def test_openai_client_sees_typed_errors(tmp_path):
    fake = FakeUpstream()
    async with fake_stack(tmp_path, fake.app(), fake.app()) as (url, _):
        api = client(url)
        with pytest.raises(openai.NotFoundError) as missing:
            await api.chat.completions.create(model="nope", messages=CHAT["messages"])
        with pytest.raises(openai.BadRequestError) as bad:
            await api.chat.completions.create(model="tiny", messages=[], temperature=3)
        await api.close()
    assert missing.value.code == "model_not_found"
    assert bad.value.status_code == 400


async def test_body_over_the_limit_is_413(tmp_path):
    fake = FakeUpstream()
    async with (
        fake_stack(tmp_path, fake.app(), fake.app(), max_body_bytes=2048) as (url, _),
        httpx.AsyncClient() as c,
    ):
        big = {**CHAT, "messages": [{"role": "user", "content": "x" * 5000}]}
        response = await c.post(url + "/v1/chat/completions", json=big)
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"


async def test_upstream_4xx_is_passed_through_without_failover(tmp_path):
    spec = FakeUpstream(Behaviour(status=400, error_body=b'{"error":{"message":"bad logprobs"}}'))
    std = FakeUpstream()
    async with fake_stack(tmp_path, spec.app(), std.app()) as (url, _), httpx.AsyncClient() as c:
        response = await c.post(url + "/v1/chat/completions", json=CHAT)
    assert response.status_code == 400
    assert response.json()["error"]["message"] == "bad logprobs"
    assert std.received == []


async def test_5xx_before_first_byte_fails_over_down_the_ladder(tmp_path):
    spec = FakeUpstream(Behaviour(status=500))
    std = FakeUpstream()
    async with fake_stack(tmp_path, spec.app(), std.app()) as (url, _), httpx.AsyncClient() as c:
        response = await c.post(url + "/v1/chat/completions", json=CHAT)
    assert response.status_code == 200
    assert response.headers["x-speclane-pool"] == "standard"
    assert len(spec.received) == 1 and len(std.received) == 1


async def test_dead_endpoint_fails_over_and_is_ejected(tmp_path, closed_port):
    dead = f"http://127.0.0.1:{closed_port()}"
    std = FakeUpstream()
    text = """
version: 1
pools:
  spec: {{kind: speculative, model: tiny, num_speculative_tokens: 4, endpoints: [DEAD]}}
  standard: {{kind: standard, model: tiny, endpoints: ["{std}"]}}
ladder: [spec, standard]
rules: [{{name: default, start: spec}}]
""".replace("DEAD", dead)
    async with (
        fake_stack(tmp_path, std.app(), std.app(), text) as (url, services),
        httpx.AsyncClient() as c,
    ):
        for _ in range(6):
            response = await c.post(url + "/v1/chat/completions", json=CHAT)
            assert response.status_code == 200
            assert response.headers["x-speclane-pool"] == "standard"
        ready = (await c.get(url + "/readyz")).json()
    assert ready["pools"]["spec"]["endpoints"][0]["health"] == "ejected"
    assert ready["pools"]["spec"]["healthy"] is False
    assert ready["ready"] is True  # the model can still be served by its standard pool


async def test_sdk_clients_get_the_503_within_seconds_when_nothing_serves(tmp_path, closed_port):
    """The ``openai`` and ``anthropic`` clients sleep on ``Retry-After`` before each of their
    two retries: with every endpoint ejected the gateway tells them a second, not the time
    until an ejection ends (18-30 s, so 39-50 s until the client saw the 503)."""
    text = """
version: 1
pools:
  spec: {{kind: speculative, model: tiny, num_speculative_tokens: 4, endpoints: [DEAD]}}
  standard: {{kind: standard, model: tiny, endpoints: [DEAD]}}
ladder: [spec, standard]
rules: [{{name: default, start: spec}}]
""".replace("DEAD", f"http://127.0.0.1:{closed_port()}")  # nothing listens there
    unused = FakeUpstream()
    async with (
        fake_stack(tmp_path, unused.app(), unused.app(), text) as (url, _),
        httpx.AsyncClient() as c,
        openai.AsyncOpenAI(base_url=url + "/v1", api_key="k") as chat_client,
        anthropic.AsyncAnthropic(base_url=url, api_key="k") as messages_client,
    ):
        for _ in range(6):  # enough failures in a row to eject every endpoint
            await c.post(url + "/v1/chat/completions", json=CHAT)
        assert not (await c.get(url + "/readyz")).json()["upstreams_ok"]
        start = time.monotonic()
        with pytest.raises(openai.InternalServerError) as chat:
            await chat_client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "hi"}]
            )
        with pytest.raises(anthropic.InternalServerError) as messages:
            await messages_client.messages.create(
                model="tiny", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
            )
        took = time.monotonic() - start
    for error in (chat.value, messages.value):
        assert error.status_code == 503 and error.response.headers["retry-after"] == "1"
    assert took < 15, f"{took:.1f} s for two clients' three tries each"


async def test_no_healthy_upstream_is_503_and_timeouts_are_504(tmp_path):
    down = FakeUpstream(Behaviour(status=503))
    async with fake_stack(tmp_path, down.app(), down.app()) as (url, _), httpx.AsyncClient() as c:
        first = await c.post(url + "/v1/chat/completions", json=CHAT)
        for _ in range(5):  # enough failures in a row to eject every endpoint
            response = await c.post(url + "/v1/chat/completions", json=CHAT)
        ready = await c.get(url + "/readyz")
        metrics = (await c.get(url + "/metrics")).text
    assert first.status_code == 503 and first.headers["retry-after"] == "1"
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "no_healthy_upstream"
    # every endpoint ejected, and still a second: the next request tries them all anyway
    assert response.headers["retry-after"] == "1"
    assert len(down.received) == 12  # all ejected, and still every request tried both
    # still ready: answering 503s beats a Service with no ready pods refusing connections
    assert ready.status_code == 200 and ready.json()["upstreams_ok"] is False
    assert 'code="no_healthy_upstream"' in metrics and 'status="503"' in metrics

    slow = FakeUpstream(Behaviour(delay_s=3))
    text = """
version: 1
pools:
  spec:
    kind: speculative
    model: tiny
    num_speculative_tokens: 4
    endpoints: ["{spec}"]
    timeouts: {{first_byte_s: 0.2}}
  standard:
    kind: standard
    model: tiny
    endpoints: ["{std}"]
    timeouts: {{first_byte_s: 0.2}}
ladder: [spec, standard]
rules: [{{name: default, start: spec}}]
"""
    async with (
        fake_stack(tmp_path, slow.app(), slow.app(), text) as (url, _),
        httpx.AsyncClient() as c,
    ):
        response = await c.post(url + "/v1/chat/completions", json=CHAT)
    assert response.status_code == 504
    assert response.json()["error"]["code"] == "upstream_timeout"


async def test_failure_after_first_byte_ends_with_an_error_event(tmp_path):
    spec = FakeUpstream(Behaviour(die_after=5))
    std = FakeUpstream()
    async with fake_stack(tmp_path, spec.app(), std.app()) as (url, _):
        api = client(url)
        stream = await api.chat.completions.create(
            model="tiny", messages=CHAT["messages"], stream=True
        )
        seen = 0
        with pytest.raises(openai.APIError) as failed:
            async for _ in stream:
                seen += 1
        await api.close()
    assert seen == 5
    assert "broke" in str(failed.value)
    assert std.received == []  # too late to fail over: the client already had tokens


async def test_non_streaming_failure_mid_stream_is_retried_once_elsewhere(tmp_path):
    spec = FakeUpstream(Behaviour(die_after=5))
    std = FakeUpstream()
    async with fake_stack(tmp_path, spec.app(), std.app()) as (url, _), httpx.AsyncClient() as c:
        response = await c.post(url + "/v1/chat/completions", json=CHAT)
    assert response.status_code == 200
    assert response.headers["x-speclane-pool"] == "standard"
    assert response.json()["choices"][0]["message"]["content"]
    assert len(spec.received) == 1 and len(std.received) == 1


async def test_a_non_streaming_answer_that_always_breaks_is_502_not_a_truncated_answer(
    tmp_path,
):
    spec = FakeUpstream(Behaviour(die_after=5))
    async with (
        fake_stack(tmp_path, spec.app(), spec.app()) as (url, services),
        httpx.AsyncClient() as c,
    ):
        response = await c.post(url + "/v1/chat/completions", json=CHAT)
    assert response.status_code == 502
    assert response.json()["error"]["code"] == "upstream_stream_broken"
    assert len(spec.received) == 1 + services.settings.break_retries  # the budget, no more


async def test_client_disconnect_cancels_the_upstream_stream(tmp_path):
    spec = FakeUpstream(Behaviour(chunk_delay_s=0.2))
    async with fake_stack(tmp_path, spec.app(), spec.app()) as (url, services):
        async with (
            httpx.AsyncClient() as c,
            c.stream("POST", url + "/v1/chat/completions", json={**CHAT, "stream": True}) as r,
        ):
            async for _ in r.aiter_bytes():
                break  # read the first bytes, then hang up
        for _ in range(100):
            if spec.cancelled:
                break
            await asyncio.sleep(0.02)
        endpoint = services.pools.endpoints["spec"][0]
        assert endpoint.outstanding == 0
    assert spec.cancelled == 1 and spec.finished == 0


async def test_non_streaming_client_disconnect_cancels_the_upstream(tmp_path):
    spec = FakeUpstream(Behaviour(chunk_delay_s=0.2))
    async with fake_stack(tmp_path, spec.app(), spec.app()) as (url, _):
        async with httpx.AsyncClient(timeout=0.5) as c:
            with pytest.raises(httpx.ReadTimeout):
                await c.post(url + "/v1/chat/completions", json=CHAT)
        for _ in range(100):
            if spec.cancelled:
                break
            await asyncio.sleep(0.02)
    assert spec.cancelled == 1 and spec.finished == 0
