"""Which non-streaming requests pass through whole, what is asked of a stream, and vLLM's
engine timings as an outcome's: table-driven, no I/O."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.engines import vllm
from gateway.forward.passthrough import (
    PerRequestReports,
    one_answer,
    passes_through,
    stream_cannot_carry,
    stream_options,
)
from gateway.measure.acceptance import Labels, Outcome, Signal, Status
from gateway.measure.engine_metrics import engine_timed
from policies.model import Pool, PoolKind

TOOL = {"type": "function", "function": {"name": "f"}}


@pytest.mark.parametrize(
    ("payload", "why"),
    [
        ({}, None),
        ({"logprobs": True, "top_logprobs": 5, "return_token_ids": True}, None),
        ({"n": 2}, "several answers"),
        ({"best_of": 3}, "several answers"),
        ({"prompt": ["a", "b"]}, "several answers"),
        ({"prompt": [1, 2, 3]}, None),
        ({"prompt": ["one"]}, None),
        ({"prompt_logprobs": 0}, "prompt_logprobs"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"echo": True}, "echo"),
        ({"use_beam_search": True}, "use_beam_search"),
        ({"tools": [TOOL]}, "tool calls"),
        ({"tools": [TOOL], "tool_choice": "none"}, None),
    ],
)
def test_what_a_stream_cannot_carry(payload: dict[str, Any], why: str | None) -> None:
    assert stream_cannot_carry(payload) == why
    assert one_answer(payload) is (why != "several answers")


@pytest.mark.parametrize(
    ("asked", "sent"),
    [
        (None, {"include_usage": True}),
        ({"include_usage": False}, {"include_usage": True}),
        ({"continuous_usage_stats": True}, {"include_usage": True}),
        (
            {"include_usage": True, "continuous_usage_stats": True},
            {"include_usage": True, "continuous_usage_stats": True},
        ),
    ],
)
def test_stream_options_keep_what_the_client_asked(asked: Any, sent: dict[str, Any]) -> None:
    payload = {} if asked is None else {"stream_options": asked}
    assert stream_options(payload) == sent


def pool(kind: PoolKind, passthrough: bool | None = None) -> Pool:
    k = 4 if kind is PoolKind.SPECULATIVE else None
    return Pool(
        kind=kind,
        model="m",
        endpoints=["http://x"],
        num_speculative_tokens=k,
        passthrough_non_streaming=passthrough,
    )


def test_who_passes_through() -> None:
    reports = PerRequestReports()
    spec, standard = pool(PoolKind.SPECULATIVE), pool(PoolKind.STANDARD)
    assert passes_through("std", standard, reports, {})
    assert not passes_through("spec", spec, reports, {})  # nothing known yet
    reports.saw("spec", True)  # e.g. vLLM's metrics.speculative_decoding
    assert passes_through("spec", spec, reports, {})
    reports.saw("spec", False)  # e.g. restarted without --per-request-spec-decode-metrics
    assert not passes_through("spec", spec, reports, {})
    assert passes_through("spec", spec, reports, {"n": 2})  # whatever the pool
    assert passes_through("s", pool(PoolKind.SPECULATIVE, True), reports, {})
    assert not passes_through("s", pool(PoolKind.STANDARD, False), reports, {})
    assert passes_through("s", pool(PoolKind.STANDARD, False), reports, {"echo": True})


def outcome(ttft: float | None = None, tpot: float | None = None) -> Outcome:
    return Outcome(
        labels=Labels(model="m", rule="r", slice="s", pool="p", k=4),
        status=Status.OK,
        started_at=0.0,
        duration_s=1.0,
        ttft_s=ttft,
        tpot_s=tpot,
        prompt_tokens=1,
        completion_tokens=10,
        chunks=0,
        signal=Signal.PER_REQUEST,
    )


def test_engine_timings_stand_in_where_the_gateway_saw_no_tokens() -> None:
    metrics = {"time_to_first_token_ms": 80.0, "queue_time_ms": 20.0, "mean_itl_ms": 12.5}
    timings = vllm.timings({"metrics": metrics})
    timed = engine_timed(outcome(), timings)
    assert (timed.ttft_s, timed.tpot_s) == pytest.approx((0.1, 0.0125))
    kept = engine_timed(outcome(0.3, 0.02), timings)
    assert (kept.ttft_s, kept.tpot_s) == (0.3, 0.02)
    assert engine_timed(outcome(), vllm.timings({"metrics": None})) == outcome()
    nulls = {"time_to_first_token_ms": None, "mean_itl_ms": None}
    assert engine_timed(outcome(), vllm.timings({"metrics": nulls})) == outcome()
