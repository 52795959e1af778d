"""The n-gram proposer and vLLM's per-request timing metrics: steps without a match draft
nothing, and chunks, per-request metrics and counters relate as on real vLLM."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import httpx
import orjson
import pytest

from backends.sim.config import Mode, SimConfig
from backends.sim.engine import Scheduler, Sequence
from backends.sim.model import Method, RequestProfile
from backends.sim.workload import Workload
from tests.backends.sim.conftest import FIXTURES, sse_events

Server = Callable[[SimConfig], contextlib.AbstractAsyncContextManager[str]]
K = 4
NGRAM = SimConfig(served_model_names=("tiny",), time_scale=0.01, method=Method.NGRAM, seed=5)
BODY = {
    "model": "tiny",
    "messages": [{"role": "user", "content": "write python"}],
    "temperature": 0,
    "max_tokens": 120,
    "ignore_eos": True,
    "stream_options": {"include_usage": True},
}


def profile(tokens: int, index: int, match: float = 0.4) -> RequestProfile:
    return RequestProfile(
        workload=Workload.CODE,
        prompt_tokens=10,
        max_tokens=tokens,
        output_tokens=tokens,
        finish_reason="length",
        acceptance=0.8,
        seed_key=f"ngram:{index}",
        ngram_match=match,
    )


def test_ngram_steps_without_a_match_draft_nothing_and_count_nowhere() -> None:
    s = Scheduler(speculative=True, k=K, max_num_seqs=8, method=Method.NGRAM)
    seqs = [Sequence(profile(200, i), K) for i in range(6)]
    for seq in seqs:
        s.submit(seq)
    events: dict[int, list[Any]] = {id(q): [] for q in seqs}
    while s.has_work():
        for seq, event in s.step().events:
            events[id(seq)].append(event)
    lengths = []
    for seq in seqs:
        steps = events[id(seq)][1:]  # after the prefill token
        drafting = [e for e in steps if e.drafted]
        assert all(e.tokens == 1 and e.accepted == 0 for e in steps if not e.drafted)
        assert 0 < len(drafting) < len(steps)
        tally = seq.tally
        assert tally.num_spec_steps == len(drafting) == sum(tally.histogram)
        assert tally.num_draft_tokens == sum(e.drafted for e in drafting) <= K * len(drafting)
        lengths += [e.drafted for e in drafting]
    assert min(lengths) < K == max(lengths)  # a copied span may run out before k
    c = s.counters
    assert c.num_drafts == sum(q.tally.num_spec_steps for q in seqs)
    assert c.num_draft_tokens == sum(q.tally.num_draft_tokens for q in seqs)
    assert c.num_accepted_tokens == sum(q.tally.num_accepted_draft_tokens for q in seqs)


def test_ngram_step_costs_no_draft_passes() -> None:
    def second_step(method: Method) -> float:
        s = Scheduler(speculative=True, k=K, max_num_seqs=8, method=method)
        s.submit(Sequence(profile(50, 0, match=0.0), K))
        s.step()
        return s.step().seconds

    standard = Scheduler(speculative=False, k=K, max_num_seqs=8)
    standard.submit(Sequence(profile(50, 0), K))
    standard.step()
    assert second_step(Method.NGRAM) == standard.step().seconds  # nothing matched, nothing paid
    assert second_step(Method.DRAFT_MODEL) > second_step(Method.NGRAM)


def test_the_real_fixture_relates_chunks_tokens_and_acceptance() -> None:
    """vLLM 0.32, ngram k=4: 32 tokens in 13 content chunks, 5 speculative steps, 19 drafted
    and 19 accepted. Each chunk is one step, and each step gave 1 + accepted tokens."""
    raw = (FIXTURES / "chat-stream-include-usage.sse").read_bytes()
    events = [orjson.loads(e) for e in sse_events(raw) if e != b"[DONE]"]
    contents = [e for e in events[1:] if e["choices"]]
    spec = events[-1]["metrics"]["speculative_decoding"]
    tokens = events[-1]["usage"]["completion_tokens"]
    assert (len(contents), tokens, spec["num_spec_steps"]) == (13, 32, 5)
    assert tokens == len(contents) + spec["num_accepted_draft_tokens"]
    assert spec["num_draft_tokens"] < K * spec["num_spec_steps"]


@pytest.mark.anyio
async def test_ngram_sim_stream_relates_like_vllm(sim_server: Server) -> None:
    async with sim_server(NGRAM) as url, httpx.AsyncClient(base_url=url) as c:
        before = await _counters(c)
        raw = (await c.post("/v1/chat/completions", json=BODY | {"stream": True})).content
        after = await _counters(c)
    events = [orjson.loads(e) for e in sse_events(raw) if e != b"[DONE]"]
    contents = [e for e in events[1:] if e["choices"]]
    usage = events[-1]
    spec = usage["metrics"]["speculative_decoding"]
    tokens = usage["usage"]["completion_tokens"]
    # one chunk per step; a step gives 1 + accepted tokens, the last one maybe fewer
    assert tokens <= len(contents) + spec["num_accepted_draft_tokens"] < tokens + K + 1
    assert spec["num_spec_steps"] < len(contents) - 1  # some steps drafted nothing
    assert spec["num_draft_tokens"] <= K * spec["num_spec_steps"]
    assert after["num_drafts"] - before["num_drafts"] == spec["num_spec_steps"]
    assert after["num_draft_tokens"] - before["num_draft_tokens"] == spec["num_draft_tokens"]
    assert (
        after["num_accepted_tokens"] - before["num_accepted_tokens"]
        == (spec["num_accepted_draft_tokens"])
    )


async def _counters(c: httpx.AsyncClient) -> dict[str, float]:
    text = (await c.get("/metrics")).text
    out = {}
    for name in ("num_drafts", "num_draft_tokens", "num_accepted_tokens"):
        line = next(x for x in text.splitlines() if x.startswith(f"vllm:spec_decode_{name}_total"))
        out[name] = float(line.rsplit(" ", 1)[1])
    return out


@pytest.mark.anyio
@pytest.mark.parametrize("mode", [Mode.SPECULATIVE, Mode.STANDARD])
async def test_timing_metrics_like_enable_per_request_metrics(
    sim_server: Server, mode: Mode
) -> None:
    config = SimConfig(
        served_model_names=("tiny",), time_scale=0.02, mode=mode, timing_metrics=True
    )
    whole_body = {k: v for k, v in BODY.items() if k != "stream_options"} | {"max_tokens": 30}
    async with sim_server(config) as url, httpx.AsyncClient(base_url=url) as c:
        whole = (await c.post("/v1/chat/completions", json=whole_body)).json()
        raw = (await c.post("/v1/chat/completions", json=BODY | {"stream": True})).content
    metrics = whole["metrics"]
    assert metrics["time_to_first_token_ms"] > 0 and metrics["queue_time_ms"] >= 0
    assert metrics["mean_itl_ms"] == pytest.approx(metrics["generation_time_ms"] / 29)
    assert metrics["tokens_per_second"] > 0
    assert (metrics["speculative_decoding"] is None) is (mode is Mode.STANDARD)
    streamed = orjson.loads(sse_events(raw)[-2])["metrics"]
    assert streamed["mean_itl_ms"] > 0
    assert ("speculative_decoding" in streamed) is (mode is Mode.SPECULATIVE)
    assert None not in streamed.values()  # streamed chunks leave nulls out


@pytest.mark.anyio
@pytest.mark.parametrize("zero_latency", [False, True])
async def test_several_choices_like_vllm(sim_server: Server, zero_latency: bool) -> None:
    """n > 1: a role chunk per choice, each choice's chunks under its index, usage over all
    of them, and no per-request metrics (vLLM's describe a single sequence)."""
    config = SimConfig(served_model_names=("tiny",), time_scale=0.01, zero_latency=zero_latency)
    body = BODY | {"n": 3, "temperature": 0.8, "max_tokens": 20}
    whole_body = {k: v for k, v in body.items() if k != "stream_options"}
    async with sim_server(config) as url, httpx.AsyncClient(base_url=url) as c:
        raw = (await c.post("/v1/chat/completions", json=body | {"stream": True})).content
        whole = (await c.post("/v1/chat/completions", json=whole_body)).json()
    events = [orjson.loads(e) for e in sse_events(raw) if e != b"[DONE]"]
    roles = [e for e in events[:3] if e["choices"][0]["delta"].get("role")]
    assert [e["choices"][0]["index"] for e in roles] == [0, 1, 2]
    contents = [e for e in events[3:] if e["choices"]]
    finished = [e["choices"][0]["index"] for e in contents if e["choices"][0]["finish_reason"]]
    assert sorted(finished) == [0, 1, 2]
    usage = events[-1]
    assert usage["usage"]["completion_tokens"] == 60 and "metrics" not in usage
    texts = {i: "" for i in range(3)}
    for e in contents:
        texts[e["choices"][0]["index"]] += e["choices"][0]["delta"]["content"]
    assert len(set(texts.values())) == 3  # sampled: three different answers
    assert [c["index"] for c in whole["choices"]] == [0, 1, 2]
    assert whole["usage"]["completion_tokens"] == 60 and whole["metrics"] is None
