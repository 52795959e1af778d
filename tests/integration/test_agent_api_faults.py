"""Anthropic's Messages and OpenAI's Responses under bad input and hostile upstreams,
through a real gateway on loopback in front of the simulator (or ``bench/hostile.py``):
bodies of wrong types, missing fields, huge values, invalid JSON and the wrong content type,
odd ``x-api-key`` and ``anthropic-version`` headers, never get a 5xx, and every 4xx is in
the route's API's shape (Anthropic's on ``/v1/messages``, OpenAI's on ``/v1/responses``);
an upstream answering HTML, or a stream that never ends, ends in the route's own error
shape: a 502 or 504 before the first byte, an ``error`` event of the API's after it."""

from __future__ import annotations

import json
import random
from typing import Any

import httpx
import openai
import pytest

from backends.sim.config import SimConfig
from bench.faults import MESSAGES, RESPONSES, error_shaped, fuzz_request, sse_events
from gateway.identity import key_hash
from tests.gateways import sim_policy, sim_stack
from tests.integration.test_hostile_upstreams import hostile, sim, stack

pytestmark = pytest.mark.anyio

MODEL = "qwen3-32b"
KEY = "sk-acme"
TENANTS = f"""
tenants:
  acme: {{{{api_keys: ["{key_hash(KEY)}"]}}}}
"""
GOOD = {
    MESSAGES: {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "Hi."}]},
    RESPONSES: {"model": MODEL, "max_output_tokens": 8, "input": "Hi."},
}
HUGE = "x" * 300_000
# each route's body with one field spoiled: (field, value); None drops the field
SPOILED: dict[str, list[tuple[str, Any]]] = {
    MESSAGES: [
        ("model", None), ("model", 3), ("model", "nope"), ("model", HUGE),
        ("messages", None), ("messages", "hi"), ("messages", [3]), ("messages", []),
        ("messages", [{"role": "user"}]), ("messages", [{"role": 3, "content": "x"}]),
        ("messages", [{"role": "user", "content": {}}]),
        ("messages", [{"role": "user", "content": [{"type": "image", "source": {}}]}]),
        ("messages", [{"role": "user", "content": [{"type": "tool_result"}]}]),
        ("messages", [{"role": "assistant", "content": [{"type": "tool_use", "id": 1}]}]),
        ("messages", [{"role": "user", "content": HUGE}]),
        ("max_tokens", None), ("max_tokens", -1), ("max_tokens", 2**70), ("max_tokens", "8"),
        ("temperature", 1e308), ("temperature", "hot"), ("top_k", -5), ("top_p", [1]),
        ("stream", "yes"), ("stream", True), ("system", 5), ("system", [{"type": 3}]),
        ("system", [{"type": ["x"], "text": "x"}]),
        ("messages", [{"role": "user", "content": [{"type": {"a": 1}, "text": "x"}]}]),
        ("tools", "x"), ("tools", [{"name": 3}]), ("tool_choice", {"type": "tool"}),
        ("stop_sequences", "x"), ("metadata", []), ("metadata", {"user_id": {}}),
        ("thinking", {"type": "enabled", "budget_tokens": "x"}),
    ],
    RESPONSES: [
        ("model", None), ("model", 3), ("model", "nope"), ("model", HUGE),
        ("input", None), ("input", 5), ("input", []), ("input", [3]),
        ("input", [{"role": 3, "content": "x"}]), ("input", [{"type": "function_call_output"}]),
        ("input", [{"role": "user", "content": [{"type": "input_text", "text": 3}]}]),
        ("input", [{"role": "user", "content": [{"type": []}]}]), ("input", [{"type": {}}]),
        ("input", HUGE), ("max_output_tokens", -1), ("max_output_tokens", 2**70),
        ("max_output_tokens", "8"), ("temperature", 1e308), ("stream", "yes"),
        ("stream", True), ("instructions", []), ("tools", "x"),
        ("tools", [{"type": "function"}]), ("tool_choice", 7), ("text", {"format": 3}),
        ("text", {"format": {"type": "json_schema"}}), ("reasoning", "high"),
        ("previous_response_id", 5), ("previous_response_id", "resp_" + "x" * 5000),
        ("previous_response_id", "../../etc"), ("store", "no"), ("user", []),
        ("include", "x"),
    ],
}  # fmt: skip
RAW = [
    b"", b"{", b'{"model": ', b"[1, 2]", b'"text"', b"null", b"\xff\xfe\x00garbage",
    b'{"model": "qwen3-32b", "x": ' + b"[" * 5000 + b"]" * 5000 + b"}",
]  # fmt: skip
HEADERS = [
    {"content-type": "application/json"}, {"content-type": "text/plain"},
    {"content-type": "application/x-www-form-urlencoded"}, {"content-type": "x/\u00e9"},
    {"x-api-key": ""}, {"x-api-key": "sk-who"}, {"x-api-key": "k" * 5000},
    {"x-api-key": "\u00ff\u00fe"}, {"anthropic-version": ""}, {"anthropic-version": "1999"},
    {"anthropic-version": "x" * 3000}, {"anthropic-version": "\u00e9"},
    {"authorization": "Bearer"}, {"authorization": "Basic Zm9v"},
]  # fmt: skip


def requests(route: str) -> list[tuple[dict[str, bytes], bytes]]:
    """Every bad request of the table, then 150 of the fault suite's fuzz for ``route``,
    each with a valid key unless it spoils the key."""
    key = {"x-api-key": KEY}
    made: list[tuple[dict[str, str], bytes]] = []
    for field, value in SPOILED[route]:
        body = {k: v for k, v in GOOD[route].items() if k != field}
        if value is not None:
            body[field] = value
        made.append((key, json.dumps(body).encode()))
    made += [(key, raw) for raw in RAW]
    made += [(key | h, json.dumps(GOOD[route]).encode()) for h in HEADERS]
    encoded = [({k: v.encode() for k, v in h.items()}, raw) for h, raw in made]
    rng = random.Random(22)
    while len(encoded) < len(made) + 150:
        method, path, headers, raw = fuzz_request(rng)
        if method == "POST" and path == route:
            encoded.append(({"x-api-key": KEY.encode()} | headers, raw))
    return encoded


@pytest.mark.parametrize("route", [MESSAGES, RESPONSES])
async def test_bad_requests_get_4xx_in_the_routes_shape_never_5xx(tmp_path, route):
    policy = sim_policy() + TENANTS
    bad: list[str] = []
    statuses: set[int] = set()
    async with (
        sim_stack(tmp_path, policy, SimConfig(time_scale=0.001), require_api_key=True) as s,
        httpx.AsyncClient(timeout=30) as c,
    ):
        for headers, raw in requests(route):
            r = await c.post(s.url + route, headers=headers, content=raw)
            statuses.add(r.status_code)
            if r.status_code >= 500:
                bad.append(f"{r.status_code} for {headers} {raw[:300]!r}: {r.text[:500]}")
            elif r.status_code >= 400 and not error_shaped(route, _json(r.content)):
                bad.append(f"{r.status_code} not in the route's shape: {r.text[:200]}")
    assert bad == [], "\n".join(bad)
    assert {200, 400, 401, 404, 415} <= statuses  # the table reached each of these


def _json(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return None


def final(stream: bytes) -> tuple[str | None, Any]:
    """A stream's last event (past a ``[DONE]``): its name and its data."""
    return [e for e in sse_events(stream) if e[1] != b"[DONE]"][-1]


def body_of(route: str, *, stream: bool) -> dict[str, Any]:
    return GOOD[route] | {"stream": stream}


@pytest.mark.parametrize("route", [MESSAGES, RESPONSES])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_html_with_200_everywhere_is_a_502_in_the_routes_shape(tmp_path, route, stream):
    async with (
        hostile() as (bad, _),
        stack(tmp_path, [f"{bad}/html"], [f"{bad}/html"]) as (url, _),
        httpx.AsyncClient(timeout=60) as c,
    ):
        r = await c.post(url + route, json=body_of(route, stream=stream))
    assert r.status_code == 502
    assert error_shaped(route, r.json()), r.text
    if route == MESSAGES:
        assert r.json()["error"]["type"] == "api_error"
    else:
        assert r.json()["error"]["code"] == "upstream_bad_answer"


@pytest.mark.parametrize("route", [MESSAGES, RESPONSES])
async def test_html_with_200_fails_over_to_a_valid_answer(tmp_path, route):
    async with (
        hostile() as (bad, _),
        stack(tmp_path, [f"{bad}/html"], [sim(2)]) as (url, _),
        httpx.AsyncClient(timeout=60) as c,
    ):
        r = await c.post(url + route, json=body_of(route, stream=True))
    assert r.status_code == 200 and r.headers["x-speclane-pool"] == "standard"
    ends = {"message_stop"} if route == MESSAGES else {"response.completed", "response.incomplete"}
    assert final(r.content)[1]["type"] in ends


@pytest.mark.parametrize("route", [MESSAGES, RESPONSES])
async def test_a_stream_that_never_ends_ends_with_the_apis_error_event(tmp_path, route):
    """Past its first byte, at the pool's ``total_s``: an ``error`` event in the API's
    shape (a Responses one numbered after the last event relayed), never a silent end."""
    async with (
        hostile() as (bad, state),
        stack(tmp_path, [f"{bad}/endless"], [sim(2)], total_s=1.5) as (url, _),
        httpx.AsyncClient(timeout=60) as c,
    ):
        r = await c.post(url + route, json=body_of(route, stream=True))
    assert state.requests == {"endless": 1}
    assert r.status_code == 200
    name, last = final(r.content)
    assert name == "error" and error_shaped(route, last), r.content[-300:]
    if route == MESSAGES:
        assert last["error"]["type"] == "timeout_error"
    else:
        assert last["code"] == "upstream_timeout"


@pytest.mark.parametrize("route", [MESSAGES, RESPONSES])
async def test_a_whole_answer_that_never_ends_is_a_504_in_the_routes_shape(tmp_path, route):
    async with (
        hostile() as (bad, _),
        stack(tmp_path, [f"{bad}/endless"], [sim(2)], total_s=1.5) as (url, _),
        httpx.AsyncClient(timeout=60) as c,
    ):
        r = await c.post(url + route, json=body_of(route, stream=False))
    assert r.status_code == 504
    assert error_shaped(route, r.json()), r.text
    if route == MESSAGES:  # Anthropic's type for a 504
        assert r.json()["error"]["type"] == "timeout_error"


@pytest.mark.parametrize("route", [MESSAGES, RESPONSES])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_the_hostile_upstreams_valid_answers_are_served(tmp_path, route, stream):
    """``bench/hostile.py`` speaks each API: its HTTP/1.0 answers are the route's own."""
    async with (
        hostile() as (bad, _),
        stack(tmp_path, [f"{bad}/http10"], [sim(2)]) as (url, _),
        httpx.AsyncClient(timeout=60) as c,
    ):
        r = await c.post(url + route, json=body_of(route, stream=stream))
    assert r.status_code == 200 and r.headers["x-speclane-pool"] == "spec"
    if stream:
        last = final(r.content)[1]
        assert last["type"] in ("message_stop", "response.completed")
    else:
        assert r.json()["type" if route == MESSAGES else "object"] in ("message", "response")


async def test_the_openai_client_reads_a_cut_responses_stream_as_its_error_event(tmp_path):
    """The ``openai`` client types the gateway's final event as the Responses API's own
    ``error`` event (``ResponseErrorEvent``), after the events relayed before it."""
    async with (
        sim_stack(tmp_path, sim_policy(), SimConfig(time_scale=0.01)) as s,
        httpx.AsyncClient(timeout=30) as c,
        openai.AsyncOpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0) as client,
    ):
        faults = {"faults": {"die_rate": 1.0, "die_after_chunks": 4}}
        assert (await c.post(s.spec + "/sim/control", json=faults)).status_code == 200
        stream = await client.responses.create(
            model=MODEL, input="Write a story.", max_output_tokens=40, stream=True
        )
        events = [event async for event in stream]
    last = events[-1]
    assert isinstance(last, openai.types.responses.ResponseErrorEvent)
    assert last.code == "upstream_stream_broken"
    assert last.sequence_number == events[-2].sequence_number + 1
