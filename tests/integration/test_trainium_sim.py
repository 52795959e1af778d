"""The Trainium path end to end: the gateway in front of a Neuron-shaped pool pair (vLLM's
Neuron plugin, simulated: draft and verify fused, no draft counters, nothing per request,
several tokens per chunk, k compiled into the server). The guardrail judges time per output
token alone, moves the structured slice to standard when speculation gets slower than it,
and back when it is faster again."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from backends.sim.config import Mode, SimConfig
from backends.sim.dialects import SimEngine
from tests.gateways import sim_stack

pytestmark = pytest.mark.anyio

# max_cooldown_s compressed with the rest of the time (tests/integration/test_guardrail_sim.py)
POLICY = """
version: 1
pools:
  spec-k7: {{kind: speculative, model: qwen3-32b, num_speculative_tokens: 7,
            engine: vllm-neuron, method: draft_model, endpoints: ["{spec}"]}}
  standard: {{kind: standard, model: qwen3-32b, engine: vllm-neuron, endpoints: ["{std}"]}}
ladder: [spec-k7, standard]
guardrail: {{window_s: 60, cooldown_s: 0.5, probe_fraction: 0.5, max_cooldown_s: 2}}
rules:
  - name: structured
    match: {{response_format: [json_object, json_schema]}}
    start: spec-k7
  - {{name: default, start: standard}}
"""
JSON = {
    "model": "qwen3-32b",
    "messages": [{"role": "user", "content": 'Return {"name": "Ada", "age": 36} as JSON.'}],
    "response_format": {"type": "json_object"},
    "temperature": 0,
    "max_tokens": 64,
    "stream": True,
}
CHAT = {
    "model": "qwen3-32b",
    "messages": [{"role": "user", "content": "How was your day?"}],
    "temperature": 0.2,
    "max_tokens": 64,
    "stream": True,
}


async def send(c: httpx.AsyncClient, url: str, body: dict) -> str:  # type: ignore[type-arg]
    async with c.stream("POST", url + "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        await r.aread()
        return r.headers["x-speclane-pool"]


async def test_neuron_pair_falls_back_by_speed_and_comes_back(tmp_path) -> None:
    sim = SimConfig(mode=Mode.SPECULATIVE, k=7, time_scale=0.1, engine=SimEngine.VLLM_NEURON)
    async with (
        sim_stack(tmp_path, POLICY, sim, admin_token="t") as (url, services, spec),
        httpx.AsyncClient(timeout=10) as c,
    ):
        assert {await send(c, url, CHAT) for _ in range(8)} == {"standard"}
        assert {await send(c, url, JSON) for _ in range(6)} == {"spec-k7"}
        ready = (await c.get(url + "/readyz")).json()["pools"]["spec-k7"]
        assert ready["signal"] == "chunks" and ready["drafts_visible"] is False
        assert ready["signals_seen"]["counts"] == {"chunks": 6}  # several tokens a chunk
        await services.scraper.scrape()
        assert "spec-k7" not in services.scraper.latest  # no drafts to difference, ever

        await c.post(spec + "/sim/control", json={"acceptance": {"json": 0.02}})
        served: list[str] = []
        # judged by time per token in wall time: a busy machine needs more requests to be sure
        while len(served) < 80 and (not served or served[-1] == "spec-k7"):
            served.append(await send(c, url, JSON))
        assert served[-1] == "standard", served
        fall = services.stats.events[-1]
        assert "cheaper below" in fall.reason and fall.numbers["cost_ratio"] > 1

        await c.post(spec + "/sim/control", json={"acceptance": {"json": None}})
        for sent in range(1, 200):  # probes bring it back once speculation is faster again
            await send(c, url, JSON)
            state = services.stats.guards.get(fall.slice)
            if state is None or state.offset == 0:
                break
            if sent % 10 == 0:
                await asyncio.sleep(0.5)  # let a cooldown pass in wall time
        assert state is None or state.offset == 0, services.stats.events
        back = services.stats.events[-1]
        assert "cheaper above" in back.reason and back.numbers["cost_ratio"] < 1
        assert all(e.numbers.get("tokens_per_step_below") == 1.0 for e in (fall, back))
