"""A request without ``temperature`` is read as the served model's default, from the
policy's ``defaults`` (what vLLM applies from the model's generation_config.json), and the
reason header says it was assumed; one that sets it is read as it says."""

from __future__ import annotations

import httpx
import pytest

from backends.sim.config import SimConfig
from tests.gateways import sim_stack

pytestmark = pytest.mark.anyio

POLICY = """
version: 1
pools:
  spec: {{kind: speculative, model: qwen3-32b, num_speculative_tokens: 4, endpoints: ["{spec}"]}}
  standard: {{kind: standard, model: qwen3-32b, endpoints: ["{std}"]}}
ladder: [spec, standard]
defaults: {{temperature: 0.6}}
rules:
  - {{name: creative, match: {{temperature: {{min: 0.9}}}}, start: standard}}
  - {{name: default, start: spec}}
"""
HELLO = [{"role": "user", "content": "Hello"}]


async def test_a_request_without_temperature_is_read_at_the_policys_default(tmp_path):
    async with (
        sim_stack(tmp_path, POLICY, SimConfig(time_scale=0.01)) as stack,
        httpx.AsyncClient(timeout=30) as c,
    ):
        ask = {"model": "qwen3-32b", "messages": HELLO, "max_tokens": 4}
        plain = await c.post(stack.url + "/v1/chat/completions", json=ask)
        hot = await c.post(stack.url + "/v1/chat/completions", json={**ask, "temperature": 1})
    assert plain.status_code == 200 and plain.headers["x-speclane-rule"] == "default"
    assert plain.headers["x-speclane-reason"].endswith(
        "; temperature 0.6 assumed (not in the request: the served model's default)"
    )
    assert hot.headers["x-speclane-rule"] == "creative"
    assert "assumed" not in hot.headers["x-speclane-reason"]
