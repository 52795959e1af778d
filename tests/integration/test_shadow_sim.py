"""Shadow mirrors against the simulator: the client's answer and latency are the same with
and without mirrors, mirrors are measured and labelled, bounds drop them, and the greedy
canary catches a speculative server whose output diverges."""

from __future__ import annotations

import asyncio
import statistics
import time

import httpx
import pytest

from backends.sim.config import Faults, Mode, SimConfig
from backends.sim.server import create_app as sim_app
from tests.gateways import gateway, settings, sim_stack
from tests.servers import serving

pytestmark = pytest.mark.anyio

POLICY = """
version: 1
pools:
  spec: {{kind: speculative, model: qwen3-32b, num_speculative_tokens: 4, endpoints: ["{spec}"]}}
  standard: {{kind: standard, model: qwen3-32b, endpoints: ["{std}"]}}
ladder: [spec, standard]
rules:
  - name: mirrored
    match: {{endpoint: [mirrored]}}
    start: shadow
    shadow_fraction: 1.0
  - name: plain
    match: {{endpoint: [plain]}}
    start: standard
  - {{name: default, start: spec}}
"""
AUTH = {"authorization": "Bearer t"}


def body(i: int) -> dict:
    return {
        "model": "qwen3-32b",
        "messages": [{"role": "user", "content": f"Tell me about topic {i}."}],
        "temperature": 0,
        "max_tokens": 24,
    }


def spec(mismatch: float = 0.0) -> SimConfig:
    return SimConfig(
        mode=Mode.SPECULATIVE, time_scale=0.05, faults=Faults(greedy_mismatch=mismatch)
    )


async def timed(c: httpx.AsyncClient, url: str, i: int, endpoint: str) -> tuple[float, str, str]:
    start = time.perf_counter()
    r = await c.post(
        url + "/v1/chat/completions", json=body(i), headers={"x-speclane-endpoint": endpoint}
    )
    assert r.status_code == 200
    text = r.json()["choices"][0]["message"]["content"]
    return time.perf_counter() - start, text, r.headers["x-speclane-pool"]


async def test_mirrors_change_neither_answers_nor_latency(tmp_path):
    async with (
        sim_stack(tmp_path, POLICY, spec(), admin_token="t") as (url, services, _),
        httpx.AsyncClient() as c,
    ):
        mirrored, plain = [], []
        for i in range(30):  # interleaved, so drift on the machine hits both alike
            mirrored.append(await timed(c, url, i, "mirrored"))
            plain.append(await timed(c, url, i, "plain"))
        for _ in range(100):
            if not services.shadow.in_flight:
                break
            await asyncio.sleep(0.02)
        stats = (await c.get(url + "/admin/stats", headers=AUTH)).json()["slices"]
        metrics = (await c.get(url + "/metrics")).text
    assert [t for _, t, _ in mirrored] == [t for _, t, _ in plain]
    assert {p for _, _, p in mirrored} == {p for _, _, p in plain} == {"standard"}
    ratio = statistics.median(d for d, _, _ in mirrored) / statistics.median(d for d, _, _ in plain)
    assert ratio < 1.3, ratio
    (shadow_slice,) = (s for s in stats.values() if s["rule"] == "mirrored")
    assert shadow_slice["pools"]["spec"]["measured"] == 30
    assert shadow_slice["pools"]["standard"]["requests"] == 30
    assert 'shadow="true"' in metrics
    canary = services.shadow.canary.counts
    assert sum(c.compared for c in canary.values()) == 30
    assert all(c.rate == 1.0 for c in canary.values())


async def test_canary_raises_a_guardrail_event_when_greedy_output_differs(tmp_path):
    stack = sim_stack(tmp_path, POLICY, spec(mismatch=1.0), admin_token="t", canary_min_samples=5)
    async with stack as (url, _, _), httpx.AsyncClient() as c:
        for i in range(8):
            await timed(c, url, i, "mirrored")
        for _ in range(100):
            events = (await c.get(url + "/admin/guardrail", headers=AUTH)).json()["events"]
            if events:
                break
            await asyncio.sleep(0.02)
    assert len(events) == 1
    assert events[0]["reason"].startswith("canary: greedy output differs")
    assert events[0]["numbers"]["exact_match_rate"] == 0.0


async def test_budget_and_concurrency_bounds_drop_mirrors(tmp_path):
    stack = sim_stack(tmp_path, POLICY, spec(), shadow_tokens_per_minute=60)
    async with stack as (url, _, _), httpx.AsyncClient() as c:
        for i in range(5):
            await timed(c, url, i, "mirrored")
        metrics = (await c.get(url + "/metrics")).text
    started = [line for line in metrics.splitlines() if 'result="started"' in line]
    dropped = [line for line in metrics.splitlines() if 'result="dropped_budget"' in line]
    assert started and started[0].endswith(" 1.0")  # ~12 prompt + 24 output tokens fit once
    assert dropped and dropped[0].endswith(" 4.0")


async def _mirrors_done(services) -> None:
    for _ in range(200):
        if not services.shadow.in_flight:
            return
        await asyncio.sleep(0.02)


async def test_a_continued_stored_response_is_not_mirrored(tmp_path):
    """A Responses request that continues a stored response goes to the endpoint holding it;
    no other endpoint knows that response, so a mirror to the speculative pool could only
    get a 404: it is not sent."""
    mirrored = {"x-speclane-endpoint": "mirrored"}
    turn = {"model": "qwen3-32b", "input": "Tell me a story.", "max_output_tokens": 8}
    async with sim_stack(tmp_path, POLICY, spec()) as (url, services, _), httpx.AsyncClient() as c:
        first = await c.post(url + "/v1/responses", json=turn, headers=mirrored)
        await _mirrors_done(services)
        later = turn | {"previous_response_id": first.json()["id"]}
        answers = [await c.post(url + "/v1/responses", json=later, headers=mirrored)]
        answers.append(await c.post(url + "/v1/responses", json=later | {"stream": True}))
        await _mirrors_done(services)
        metrics = (await c.get(url + "/metrics")).text
    assert first.status_code == 200
    assert "mirrored to spec" in first.headers["x-speclane-reason"]
    for answer in answers:
        assert answer.status_code == 200
        assert answer.headers["x-speclane-reason"].startswith("pinned: response resp_")
    counts = {
        line.split('result="')[1].split('"')[0]: line.rsplit(" ", 1)[1]
        for line in metrics.splitlines()
        if line.startswith("speclane_shadow_mirrors_total{")
    }
    assert counts == {"started": "1.0"}


async def test_mirrors_of_responses_requests_are_not_stored_upstream(tmp_path):
    """vLLM keeps every stored response in its server's memory; a mirror's answer reaches
    nobody, so the mirror asks for it not to be stored (nor run in the background, which
    vLLM allows only with store)."""
    spec_app = sim_app(spec())
    std_app = sim_app(SimConfig(mode=Mode.STANDARD, time_scale=0.05))
    turn = {"model": "qwen3-32b", "input": "Tell me a story.", "max_output_tokens": 8}
    async with serving(spec_app) as spec_url, serving(std_app) as std_url:
        text = POLICY.format(spec=spec_url, std=std_url)
        async with gateway(settings(tmp_path, text)) as (url, services), httpx.AsyncClient() as c:
            headers = {"x-speclane-endpoint": "mirrored"}
            for extra in ({}, {"stream": True}, {"background": True}):
                answer = await c.post(url + "/v1/responses", json=turn | extra, headers=headers)
                assert answer.status_code == 200
            await _mirrors_done(services)
            metrics = (await c.get(url + "/metrics")).text
    assert 'speclane_shadow_mirrors_total{pool="spec",result="started"} 3.0' in metrics
    assert 'result="failed"' not in metrics
    assert len(std_app.state.stored) == 3  # the client's own answers, continued from there
    assert len(spec_app.state.stored) == 0
