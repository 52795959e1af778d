"""The simulator refuses the Messages requests vLLM 0.32's request model refuses, as vLLM's
validation handler answers them (400, vLLM's OpenAI shape, ``Bad Request``, the field's
path in ``param``), and its other errors in Anthropic's shape with vLLM's type name."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from backends.sim.config import SimConfig
from tests.backends.sim.test_sim_matches_real import Serve

pytestmark = pytest.mark.anyio

MODEL = "qwen3-32b"
ASK = [{"role": "user", "content": "Write python to add two numbers."}]
GOOD = {"model": MODEL, "max_tokens": 8, "messages": ASK}
REFUSED = [
    ({"messages": [{"role": "robot", "content": "hi"}]}, "body.messages.0.role"),
    ({"thinking": {"type": "enabled", "budget_tokens": 500}}, "budget_tokens"),
    ({"thinking": {"type": "sometimes"}}, "body.thinking"),
    ({"max_tokens": 0}, "body.max_tokens"),
    ({"max_tokens": 2000, "thinking": {"type": "enabled", "budget_tokens": 2000}}, "body"),
    ({"tool_choice": {"type": "tool"}}, "body.tool_choice"),
    ({"tools": [{"name": "f", "input_schema": "none"}]}, "body.tools.0.input_schema"),
    ({"messages": [{"role": "user", "content": [{"type": "song"}]}]}, "body.messages.0"),
    ({"model": ""}, "body.model"),
]


@pytest.mark.parametrize(("change", "param"), REFUSED)
async def test_what_vllms_messages_model_refuses_is_a_400_in_vllms_shape(
    sim_server: Serve, change: dict[str, Any], param: str
) -> None:
    async with sim_server(SimConfig(zero_latency=True)) as url, httpx.AsyncClient() as c:
        answer = await c.post(url + "/v1/messages", json=GOOD | change)
        if "max_tokens" not in change:  # count_tokens has no max_tokens
            counted = await c.post(url + "/v1/messages/count_tokens", json=GOOD | change)
            assert counted.status_code == 400 and counted.json() == answer.json()
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["type"] == "Bad Request" and error["code"] == 400
    assert "validation error" in error["message"] and param in error["param"]


async def test_what_it_takes_and_its_own_errors(sim_server: Serve) -> None:
    async with sim_server(SimConfig(zero_latency=True)) as url, httpx.AsyncClient() as c:
        thinking = {"type": "enabled", "budget_tokens": 1024}
        fine = await c.post(
            url + "/v1/messages", json=GOOD | {"max_tokens": 2000, "thinking": thinking}
        )
        unknown = await c.post(url + "/v1/messages", json=GOOD | {"model": "nope"})
    assert fine.status_code == 200 and fine.json()["type"] == "message"
    assert unknown.status_code == 404
    assert unknown.json()["type"] == "error"
    assert unknown.json()["error"]["type"] == "NotFoundError"


async def test_a_body_that_is_no_json_object_is_refused_as_vllm_parses_it(
    sim_server: Serve,
) -> None:
    async with sim_server(SimConfig(zero_latency=True)) as url, httpx.AsyncClient() as c:
        answers = [
            await c.post(url + path, content=body)
            for path in ("/v1/messages", "/v1/responses", "/v1/chat/completions")
            for body in (b"{", b"[]")
        ]
    for answer in answers:
        assert answer.status_code == 400
        assert answer.json()["error"]["type"] == "Bad Request"
    assert answers[0].json() == answers[4].json()  # as chat's: one parser in vLLM
