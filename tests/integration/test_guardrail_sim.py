"""The guardrail end to end: gateway in front of the simulated vLLM, whose code workload
collapses mid-run and later recovers. The code slice falls back within min_samples, the chat
slice is untouched, and probing brings the code slice back."""

from __future__ import annotations

import time

import httpx
import pytest

from backends.sim.config import Mode, SimConfig
from tests.gateways import sim_stack

pytestmark = pytest.mark.anyio

MIN_SAMPLES = 8
POLICY = """
version: 1
pools:
  spec: {{kind: speculative, model: qwen3-32b, num_speculative_tokens: 4, endpoints: ["{spec}"]}}
  standard: {{kind: standard, model: qwen3-32b, endpoints: ["{std}"]}}
ladder: [spec, standard]
guardrail:
  min_acceptance: 0.4
  recover_above: 0.5
  min_samples: {min_samples}
  window_s: 60
  cooldown_s: 0.5
  probe_fraction: 0.5
rules:
  - name: code
    match: {{endpoint: [code-assist]}}
    start: spec
  - {{name: default, start: spec}}
"""
CODE = {
    "model": "qwen3-32b",
    "messages": [{"role": "user", "content": "Complete this python function:\ndef add(a, b):"}],
    "temperature": 0,
    "max_tokens": 24,
}
CHAT = {
    "model": "qwen3-32b",
    "messages": [{"role": "user", "content": "How was your day?"}],
    "temperature": 0.2,
    "max_tokens": 24,
}


SIM = SimConfig(mode=Mode.SPECULATIVE, k=4, served_model_names=("qwen3-32b",), time_scale=0.01)


async def send(c: httpx.AsyncClient, url: str, body: dict, **headers: str) -> str:
    r = await c.post(url + "/v1/chat/completions", json=body, headers=headers)
    assert r.status_code == 200, r.text
    return r.headers["x-speclane-pool"]


async def code(c: httpx.AsyncClient, url: str) -> str:
    return await send(c, url, CODE, **{"x-speclane-endpoint": "code-assist"})


async def test_collapse_falls_back_within_min_samples_and_probing_recovers(tmp_path):
    policy = POLICY.replace("{min_samples}", str(MIN_SAMPLES))
    async with (
        sim_stack(tmp_path, policy, SIM, admin_token="t") as (url, services, spec),
        httpx.AsyncClient(timeout=10) as c,
    ):
        healthy = [await code(c, url) for _ in range(MIN_SAMPLES + 4)]
        assert set(healthy) == {"spec"}
        assert not services.stats.guards

        await c.post(spec + "/sim/control", json={"acceptance": {"code": 0.05}})
        served = []
        while len(served) < 4 * MIN_SAMPLES and (not served or served[-1] == "spec"):
            served.append(await code(c, url))
        slow = served.index("standard") if "standard" in served else len(served)
        assert slow <= MIN_SAMPLES + 1, served
        assert [await send(c, url, CHAT) for _ in range(5)] == ["spec"] * 5

        auth = {"authorization": "Bearer t"}
        events = (await c.get(url + "/admin/guardrail", headers=auth)).json()
        fall = events["events"][-1]
        assert fall["slice"].startswith("code / ") and fall["to"]["offset"] == 1
        assert fall["numbers"]["acceptance"] < 0.4

        await c.post(spec + "/sim/control", json={"acceptance": {"code": None}})
        deadline = time.monotonic() + 20
        recovered = False
        key = fall["slice"]
        while time.monotonic() < deadline and not recovered:
            await code(c, url)
            state = services.stats.guards[key]
            recovered = state.offset == 0 and state.phase == "on"
        assert recovered
        assert [await code(c, url) for _ in range(3)] == ["spec"] * 3
        phases = [(e.before.phase, e.after.phase) for e in services.stats.events]
    assert phases == [("on", "fallen_back"), ("fallen_back", "probing"), ("probing", "on")]
