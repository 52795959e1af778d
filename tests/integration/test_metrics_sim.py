"""The monitoring set against the simulator, read as an operator's Prometheus would: /metrics
of a running gateway parsed with prometheus-client's own parser.

Structured answers are checked against what the request asked for, by pool; the token
counters add up to what the pool itself counted; shadow mirrors stay out of the
client-facing histograms; an upstream 400 moves a series.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from backends.sim.config import Mode, SimConfig
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
    cost_per_hour: 12
  standard: {{kind: standard, model: qwen3-32b, endpoints: ["{std}"], cost_per_hour: 8}}
ladder: [spec, standard]
# no exploration: these tests count what each pool served, and an explored request (served
# by the standard pool to learn its step time, drawn at random) would move one
guardrail: {{probe_fraction: 0}}
rules:
  - name: structured
    match: {{response_format: [json_object, json_schema]}}
    start: spec
  - name: tools
    match: {{tools: present}}
    start: spec
  - name: creative
    match: {{temperature: {{min: 0.9}}}}
    start: shadow
    shadow_fraction: 1.0
  - {{name: default, start: spec}}
"""
PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
ASK = [{"role": "user", "content": "Extract the person as JSON: Ada, 36."}]
SCHEMA = {
    "model": "qwen3-32b",
    "messages": ASK,
    "temperature": 0,
    "max_tokens": 200,
    "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}},
}
TOOL = {
    "model": "qwen3-32b",
    "messages": [{"role": "user", "content": "Who is Ada?"}],
    "temperature": 0,
    "max_tokens": 200,
    "tools": [{"type": "function", "function": {"name": "person", "parameters": PERSON}}],
    "tool_choice": "required",
}
CHAT = {
    "model": "qwen3-32b",
    "messages": [{"role": "user", "content": "How was your day?"}],
    "temperature": 0.2,
    "max_tokens": 24,
}
Samples = dict[str, list[tuple[dict[str, str], float]]]


def spec_sim() -> SimConfig:
    return SimConfig(
        mode=Mode.SPECULATIVE,
        k=4,
        served_model_names=("qwen3-32b",),
        time_scale=0.02,
        timing_metrics=True,
    )


async def scrape(c: httpx.AsyncClient, url: str) -> Samples:
    out: Samples = defaultdict(list)
    text = (await c.get(url + "/metrics")).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[sample.name].append((sample.labels, sample.value))
    return out


def total(samples: Samples, name: str, **where: str) -> float:
    return sum(
        v
        for labels, v in samples.get(name, [])
        if all(labels.get(k) == x for k, x in where.items())
    )


async def post(c: httpx.AsyncClient, url: str, body: dict, stream: bool = False) -> httpx.Response:
    response = await c.post(url + "/v1/chat/completions", json=body | {"stream": stream})
    if stream and response.status_code == 200:
        assert b"[DONE]" in response.content
    return response


async def test_structured_answers_are_checked_by_pool(tmp_path):
    async with (
        sim_stack(tmp_path, POLICY, spec_sim()) as (url, _, spec),
        httpx.AsyncClient(timeout=30) as c,
    ):
        for stream in (False, True, False, True):
            assert (await post(c, url, SCHEMA, stream)).status_code == 200
            assert (await post(c, url, TOOL, stream)).status_code == 200
        for stream in (False, True):  # cut by max_tokens: the request's budget, not the model
            assert (await post(c, url, SCHEMA | {"max_tokens": 6}, stream)).status_code == 200
        await c.post(spec + "/sim/control", json={"faults": {"broken_structure": 1.0}})
        for stream in (False, True, True):
            assert (await post(c, url, SCHEMA, stream)).status_code == 200
        samples = await scrape(c, url)

    def checked(kind: str, result: str) -> float:
        name = "speclane_structured_outputs_total"
        return total(samples, name, pool="spec", kind=kind, result=result)

    assert checked("json_schema", "valid") == 4
    assert checked("tool_call", "valid") == 4
    assert checked("json_schema", "truncated") == 2
    assert checked("json_schema", "invalid_json") == 3
    assert total(samples, "speclane_structured_outputs_total") == 13


async def test_the_metric_set_adds_up(tmp_path):
    async with (
        sim_stack(tmp_path, POLICY, spec_sim()) as (url, services, spec),
        httpx.AsyncClient(timeout=30) as c,
    ):
        # the guardrail may send a share of the default rule's requests to standard to learn
        # its step time (served there, or mirrored there): how many is a draw, so each
        # answer's headers say where it went and the counts below follow them
        answers = [await post(c, url, CHAT, stream) for stream in (True, False) * 4]
        assert [r.status_code for r in answers] == [200] * 8
        creative = CHAT | {"temperature": 1.0}
        for _ in range(3):  # answered by standard, mirrored to spec
            response = await post(c, url, creative)
            assert response.status_code == 200
            assert response.headers["x-speclane-pool"] == "standard"
        too_many = CHAT | {"logprobs": True, "top_logprobs": 50}  # above vLLM's --max-logprobs
        refused = [await post(c, url, too_many, stream) for stream in (True, False, True)]
        assert [r.status_code for r in refused] == [400] * 3
        while services.shadow.in_flight:  # the mirrors finish
            await asyncio.sleep(0.01)
        state = (await c.get(spec + "/sim/state")).json()
        samples = await scrape(c, url)

    # token-weighted acceptance from counters the pool's own counters agree with
    counters = state["counters"]
    assert (
        total(samples, "speclane_draft_tokens_total", pool="spec") == (counters["num_draft_tokens"])
    )
    assert (
        total(samples, "speclane_accepted_draft_tokens_total", pool="spec")
        == (counters["num_accepted_tokens"])
    )
    steps = total(samples, "speclane_decode_steps_total", pool="spec")
    tokens = total(samples, "speclane_decode_tokens_total", pool="spec")
    assert 1.0 < tokens / steps <= 5.0
    assert (
        total(samples, "speclane_output_tokens_total", pool="spec")
        == (counters["generation_tokens"])
    )
    assert total(samples, "speclane_serving_seconds_total", pool="spec") > 0
    assert total(samples, "speclane_pool_cost_per_hour", pool="spec") == 12

    # shadow mirrors count as requests and tokens, not in client-facing latency
    for response in answers + refused:  # spec, unless the guardrail said why not
        reason = response.headers["x-speclane-reason"]
        pool = response.headers["x-speclane-pool"]
        assert pool == "spec" or "served by standard to learn" in reason, reason
    on_spec = sum(r.headers["x-speclane-pool"] == "spec" for r in answers)
    assert total(samples, "speclane_requests_total", pool="spec", shadow="true") == 3
    client_spec = total(samples, "speclane_requests_total", pool="spec", shadow="false")
    assert client_spec == on_spec
    assert total(samples, "speclane_request_duration_seconds_count", pool="spec") == on_spec
    assert total(samples, "speclane_ttft_seconds_count", pool="spec") == on_spec
    on_standard = 3 + 8 - on_spec
    assert total(samples, "speclane_request_duration_seconds_count", pool="standard") == on_standard
    for phase in ("admission", "upstream_wait", "queue"):
        count = total(samples, "speclane_request_phase_seconds_count", pool="spec", phase=phase)
        assert count == on_spec, phase
    # decode time is measured between a stream's first and last chunks: none when a busy
    # machine hands the gateway every chunk of a short answer in one read
    decode = total(samples, "speclane_request_phase_seconds_count", pool="spec", phase="decode")
    assert 0 < decode <= on_spec

    rejected_on_spec = sum(r.headers["x-speclane-pool"] == "spec" for r in refused)
    assert total(samples, "speclane_upstream_rejections_total", pool="spec", status="400") == (
        rejected_on_spec
    )
    assert total(samples, "speclane_guardrail_slices") >= 2
    phases = samples["speclane_guardrail_phase"]
    assert {labels["rule"] for labels, _ in phases} >= {"default", "creative"}
    assert samples["process_cpu_seconds_total"] and samples["python_gc_collections_total"]
    names = {k for values in samples.values() for labels, _ in values for k in labels}
    assert not names & {"tenant", "user", "api_key", "request_id"}
