"""Requests as clients write them, through the gateway on real sockets, answered as the
simulator answers them directly: a JSON null where vLLM reads a field as left out (a client
that writes every field it has, set or not)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from backends.sim.config import SimConfig
from tests.gateways import sim_policy, sim_stack

pytestmark = pytest.mark.anyio

USER = [{"role": "user", "content": "hi"}]
NULLS = [
    ("/v1/chat/completions", {"messages": USER, "max_tokens": 4, "stream": None}),
    ("/v1/chat/completions", {"messages": USER, "max_tokens": 4, "n": None}),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 4, "stream": None}),
    ("/v1/messages", {"messages": USER, "max_tokens": 4, "stream": None}),
    ("/v1/responses", {"input": "hi", "max_output_tokens": 4, "stream": None}),
]


@pytest.mark.parametrize(("path", "fields"), NULLS)
async def test_a_null_vllm_reads_as_left_out_is_read_so(tmp_path, path, fields):
    body: dict[str, Any] = {"model": "qwen3-32b", **fields}
    config = SimConfig(served_model_names=("qwen3-32b",), time_scale=0.01)
    async with sim_stack(tmp_path, sim_policy(), config) as stack, httpx.AsyncClient() as c:
        direct = await c.post(stack.spec + path, json=body)
        via = await c.post(stack.url + path, json=body)
    assert direct.status_code == 200
    assert via.status_code == 200, via.text
    assert via.headers["content-type"] == direct.headers["content-type"] == "application/json"
    assert via.json().keys() == direct.json().keys()


async def test_a_null_n_on_completions_stays_refused_as_vllm_refuses_it(tmp_path):
    body = {"model": "qwen3-32b", "prompt": "hi", "max_tokens": 4, "n": None}
    config = SimConfig(served_model_names=("qwen3-32b",), time_scale=0.01)
    async with sim_stack(tmp_path, sim_policy(), config) as stack, httpx.AsyncClient() as c:
        direct = await c.post(stack.spec + "/v1/completions", json=body)
        via = await c.post(stack.url + "/v1/completions", json=body)
    assert direct.status_code == via.status_code == 400
    assert via.json()["error"]["param"] == "n"
