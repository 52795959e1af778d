"""Pools that take non-streaming requests non-streaming: the answer passes through
untouched, vLLM's per-request metrics are the measurement, failover still works."""

from __future__ import annotations

import time

import httpx
import pytest

from backends.sim.config import Faults, Mode, SimConfig
from tests.gateways import sim_stack

pytestmark = pytest.mark.anyio

POLICY = """
version: 1
pools:
  spec:
    kind: speculative
    model: qwen3-32b
    num_speculative_tokens: 4
    endpoints: ["{spec}"]
    passthrough_non_streaming: true
  standard: {{kind: standard, model: qwen3-32b, endpoints: ["{std}"]}}
ladder: [spec, standard]
rules: [{{name: default, start: spec}}]
"""
BODY = {
    "model": "qwen3-32b",
    "messages": [{"role": "user", "content": "Extract the name as JSON."}],
    "response_format": {"type": "json_object"},
    "temperature": 0,
    "max_tokens": 30,
}


def spec(errors: float = 0.0) -> SimConfig:
    return SimConfig(mode=Mode.SPECULATIVE, time_scale=0.01, faults=Faults(error_rate=errors))


async def test_non_streaming_answers_pass_through_and_are_measured(tmp_path):
    async with sim_stack(tmp_path, POLICY, spec()) as (url, services, _), httpx.AsyncClient() as c:
        whole = await c.post(url + "/v1/chat/completions", json=BODY)
        streamed = await c.post(url + "/v1/chat/completions", json={**BODY, "stream": True})
        summary = services.stats.views.summary(time.time())
        metrics = (await c.get(url + "/metrics")).text
    assert whole.status_code == 200 and whole.headers["x-speclane-pool"] == "spec"
    answer = whole.json()
    assert answer["object"] == "chat.completion"
    spec_metrics = answer["metrics"]["speculative_decoding"]  # vLLM's own fields, untouched
    assert spec_metrics["num_draft_tokens"] > 0 and "acceptance_histogram" in spec_metrics
    assert streamed.text.endswith("data: [DONE]\n\n")
    (window,) = (s["pools"]["spec"] for s in summary.values())
    assert window["measured"] == 2  # the whole answer and the streamed one
    assert 'signal="per_request"' in metrics


async def test_passthrough_fails_over_before_the_answer(tmp_path):
    async with sim_stack(tmp_path, POLICY, spec(errors=1.0)) as stack, httpx.AsyncClient() as c:
        r = await c.post(stack.url + "/v1/chat/completions", json=BODY)
    assert r.status_code == 200 and r.headers["x-speclane-pool"] == "standard"
    assert r.json()["choices"][0]["message"]["content"]
