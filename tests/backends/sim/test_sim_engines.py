"""``speclane sim --engine``: each engine's stream, whole answer and pages, in the shapes
read in the engines' sources (``policies/engines.py`` names them)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from backends.sim.config import SimConfig
from backends.sim.dialects import SimEngine
from backends.sim.server import create_app

pytestmark = pytest.mark.anyio

CHAT = {
    "model": "qwen3-32b",
    "messages": [{"role": "user", "content": 'Return {"name": "Ada", "age": 36} as JSON.'}],
    "response_format": {"type": "json_object"},
    "temperature": 0,
    "max_tokens": 48,
    "ignore_eos": True,
    "stream": True,
    "stream_options": {"include_usage": True},
}
WHOLE = {k: v for k, v in CHAT.items() if k not in ("stream", "stream_options")}


@asynccontextmanager
async def sim(**kw: object) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(SimConfig(k=4, time_scale=0.002, **kw))  # type: ignore[arg-type]
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://sim") as c,
    ):
        yield c


def events(text: str) -> list[dict]:  # type: ignore[type-arg]
    lines = [e[len("data: ") :].strip() for e in text.split("\n\n") if e.startswith("data: ")]
    return [orjson.loads(line) for line in lines if line != "[DONE]"]


def samples(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[sample.name] = out.get(sample.name, 0.0) + sample.value
    return out


async def test_vllm_neuron_streams_fused_steps_and_counts_no_drafts() -> None:
    async with sim(engine=SimEngine.VLLM_NEURON, timing_metrics=True) as c:
        chunks = events((await c.post("/v1/chat/completions", json=CHAT)).text)
        page = samples((await c.get("/metrics")).text)
    content = [e for e in chunks if e["choices"] and e["choices"][0]["delta"].get("content")]
    assert len(content) < 48  # several tokens per chunk: one chunk per fused step
    assert "metrics" not in chunks[-1]  # vLLM 0.11 under the plugin: nothing per request
    assert chunks[-1]["usage"]["completion_tokens"] == 48
    assert page["vllm:spec_decode_num_draft_tokens_total"] == 0
    assert page["vllm:generation_tokens_total"] == 48


async def test_sglang_streams_its_own_shape_and_shows_gauges_and_server_info() -> None:
    async with sim(engine=SimEngine.SGLANG) as c:
        chunks = events((await c.post("/v1/chat/completions", json=CHAT)).text)
        whole = (await c.post("/v1/chat/completions", json=WHOLE)).json()
        page = samples((await c.get("/metrics")).text)
        info = (await c.get("/server_info")).json()
    role, *content, finish, usage = chunks
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(e["choices"][0]["finish_reason"] is None for e in content)
    assert all("matched_stop" in e["choices"][0] for e in content)
    assert finish["choices"][0]["delta"] == {} and finish["choices"][0]["finish_reason"] == "length"
    assert usage["choices"] == [] and "metrics" not in usage  # nothing speculative anywhere
    assert "metrics" not in whole and whole["metadata"] == {"weight_version": "default"}
    assert "matched_stop" in whole["choices"][0]
    assert 1.0 < page["sglang:spec_accept_length"] <= 5.0
    assert 0.0 < page["sglang:spec_accept_rate"] <= 1.0
    (state,) = info["internal_states"]
    assert 1.0 < state["avg_spec_accept_length"] <= 5.0


async def test_trtllm_says_tokens_per_iteration_and_drains_its_iteration_stats() -> None:
    async with sim(engine=SimEngine.TRTLLM) as c:
        raw = (await c.post("/v1/chat/completions", json=CHAT)).text
        whole = (await c.post("/v1/chat/completions", json=WHOLE)).json()
        first = (await c.get("/metrics")).json()
        second = (await c.get("/metrics")).json()
        page = samples((await c.get("/prometheus/metrics")).text)
    assert raw.startswith("data: ") and raw.split("\n\n")[0].endswith(" ")  # its role line
    chunks = events(raw)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant"}
    last = [e for e in chunks if e["choices"]][-1]["choices"][0]
    assert last["finish_reason"] == "length" and last["avg_decoded_tokens_per_iter"] > 1.0
    assert "logprobs" not in last  # written without null fields
    assert whole["choices"][0]["avg_decoded_tokens_per_iter"] > 1.0 and "metrics" not in whole
    assert first and second == []  # a read takes the iterations it returns
    assert [s["iter"] for s in first] == sorted({s["iter"] for s in first})
    drafted = sum(s["specDecodingStats"]["numDraftTokens"] for s in first)
    accepted = sum(s["specDecodingStats"]["numAcceptedTokens"] for s in first)
    assert drafted == page["trtllm_spec_decode_num_draft_tokens_total"] > 0
    assert accepted == page["trtllm_spec_decode_num_accepted_tokens_total"]
    assert page["trtllm_generation_tokens_total"] == 96


async def test_trtllm_without_prometheus_has_only_the_drained_page() -> None:
    async with sim(engine=SimEngine.TRTLLM, prometheus=False) as c:
        assert (await c.get("/prometheus/metrics")).status_code == 404


async def test_trtllm_acceptance_gate_turns_speculation_off_for_good() -> None:
    creative = CHAT | {
        "messages": [{"role": "user", "content": "Write a surreal poem about rain."}],
        "temperature": 1.0,
        "response_format": {"type": "text"},
        "max_tokens": 24,
    }
    async with sim(
        engine=SimEngine.TRTLLM, acceptance_rate_threshold=0.6, acceptance_rate_window_size=3
    ) as c:
        for _ in range(3):
            await c.post("/v1/chat/completions", json=creative)
        state = (await c.get("/sim/state")).json()
        await c.get("/metrics")  # drop what came before
        await c.post("/v1/chat/completions", json=CHAT)
        after = (await c.get("/metrics")).json()
        final = (await c.get("/sim/state")).json()
    assert state["speculating"] is False and state["speculation_off_at"] is not None
    assert final["speculating"] is False  # a good request does not bring it back
    decoding = [s for s in after if s["inflightBatchingStats"]["numGenRequests"]]
    assert decoding and all(s["specDecodingStats"]["numDraftTokens"] == 0 for s in decoding)


async def test_sglang_counts_per_request_when_asked() -> None:
    asked = CHAT | {"return_spec_tokens_details": True}
    whole_asked = WHOLE | {"return_spec_tokens_details": True}
    async with sim(engine=SimEngine.SGLANG) as c:
        chunks = events((await c.post("/v1/chat/completions", json=asked)).text)
        whole = (await c.post("/v1/chat/completions", json=whole_asked)).json()
    *_, ext, usage = chunks
    details = ext["sglext"]["spec_tokens_details"]
    assert ext["choices"] == [] and "usage" in usage
    assert details["spec_verify_ct"] > 0  # a draft model drafts k in every verify step
    assert details["spec_num_proposed_drafts"] == 4 * details["spec_verify_ct"]
    steps = details["spec_verify_ct"]
    assert details["spec_accept_length"] == (details["spec_num_correct_drafts"] + steps) / steps
    assert whole["sglext"]["spec_tokens_details"]["spec_verify_ct"] > 0
