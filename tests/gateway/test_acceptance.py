"""The acceptance fold: each signal, from real vLLM chunk shapes."""

from __future__ import annotations

import orjson
import pytest

from gateway.acceptance import Fold, Labels, Signal, Status
from tests.fakes import events

SPEC = Labels("tiny", "r", "r / t<=0.3 / ctx<4k", "spec", k=4)
STANDARD = Labels("tiny", "r", "r / t<=0.3 / ctx<4k", "standard", k=None)


def fold_stream(labels: Labels, payloads: list[bytes], *, drop_metrics: bool = False) -> Fold:
    fold = Fold(labels, started_at=0.0)
    for i, data in enumerate(payloads, start=1):
        if data == b"[DONE]":
            break
        chunk = orjson.loads(data)
        if chunk["choices"]:
            delta = chunk["choices"][0]["delta"]
            if delta.get("content"):
                fold.content(i * 0.01, chunk["choices"][0]["finish_reason"])
        else:
            fold.usage(chunk["usage"], None if drop_metrics else chunk.get("metrics"))
    return fold


def test_per_request_metrics_win_when_present():
    outcome = fold_stream(SPEC, events("chat-stream-include-usage.sse")).finish(Status.OK, 1.0)
    assert outcome.signal is Signal.PER_REQUEST
    assert (outcome.drafted, outcome.accepted) == (19, 19)
    assert outcome.mean_acceptance_length == 4.8
    assert outcome.acceptance_rate == 1.0
    assert outcome.completion_tokens == 32 and outcome.chunks == 13
    assert outcome.finish_reason == "length"


def test_chunks_signal_without_metrics():
    fold = fold_stream(SPEC, events("chat-stream-include-usage.sse"), drop_metrics=True)
    outcome = fold.finish(Status.OK, 1.0)
    assert outcome.signal is Signal.CHUNKS
    # 32 tokens in 13 content chunks: L = (32 - 1) / (13 - 1)
    assert outcome.mean_acceptance_length == pytest.approx(31 / 12)
    assert outcome.drafted == 4 * 12 and outcome.accepted == 32 - 13
    assert outcome.acceptance_rate == pytest.approx((31 / 12 - 1) / 4)


def test_merged_deltas_bias_the_chunk_signal_upward():
    one_per_step = Fold(SPEC, 0.0)
    merged = Fold(SPEC, 0.0)
    for step in range(11):  # 1 prefill token + 10 steps of 2 tokens = 21 tokens
        one_per_step.content(step * 0.01)
        if step % 2 == 0:  # the server merged two steps into one chunk
            merged.content(step * 0.01)
    for fold in (one_per_step, merged):
        fold.usage({"completion_tokens": 21, "prompt_tokens": 5}, None)
    true_length = one_per_step.finish(Status.OK, 1.0).mean_acceptance_length
    biased_length = merged.finish(Status.OK, 1.0).mean_acceptance_length
    assert true_length == pytest.approx(2.0)
    assert biased_length is not None and biased_length > true_length


def test_standard_pool_measures_speed_only():
    outcome = fold_stream(STANDARD, events("chat-stream-include-usage.sse")).finish(Status.OK, 1.0)
    assert outcome.signal is Signal.NONE and outcome.acceptance_rate is None
    assert outcome.ttft_s == pytest.approx(0.02)
    assert outcome.tpot_s == pytest.approx((0.14 - 0.02) / 31)


def test_speculative_pool_without_usage_falls_to_speed():
    fold = Fold(SPEC, 0.0)
    fold.content(0.1)
    outcome = fold.finish(Status.CANCELLED, 0.5)
    assert outcome.signal is Signal.SPEED
    assert outcome.status is Status.CANCELLED and outcome.ttft_s == pytest.approx(0.1)
    assert outcome.duration_s == pytest.approx(0.5)


def test_chunk_estimate_is_clamped_to_k_plus_one():
    fold = Fold(SPEC, 0.0)
    fold.content(0.1)
    fold.content(0.2)
    fold.usage({"completion_tokens": 50}, None)  # impossible for k=4: at most 1 + 5
    outcome = fold.finish(Status.OK, 1.0)
    assert outcome.accepted == 4 and outcome.mean_acceptance_length == 5.0
