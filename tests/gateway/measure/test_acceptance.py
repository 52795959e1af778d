"""The acceptance fold: each signal, from real vLLM chunk shapes; what an answer says of its
own speculation read by its engine's module, as the dialects have it read."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.engines import ENGINES
from gateway.measure.acceptance import Fold, Labels, Signal, Status
from tests.fakes import events

SPEC = Labels("tiny", "r", "r / t<=0.3 / ctx<4k", "spec", k=4)
STANDARD = Labels("tiny", "r", "r / t<=0.3 / ctx<4k", "standard", k=None)


def usage(fold: Fold, counts: dict[str, Any], metrics: Any = None, **chunk: Any) -> None:
    """A usage chunk (or any chunk): its usage, and what its engine reads of it."""
    engine, answer = ENGINES.of(fold.labels.engine), {"metrics": metrics, **chunk}
    timings = engine.timings(answer)
    fold.usage(counts, timings.queue_s if timings is not None else None)
    said = engine.evidence(answer)
    if said is not None:
        fold.evidence(said)


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
            usage(fold, chunk["usage"], None if drop_metrics else chunk.get("metrics"))
    return fold


def test_per_request_metrics_win_when_present():
    outcome = fold_stream(SPEC, events("chat-stream-include-usage.sse")).finish(Status.OK, 1.0)
    assert outcome.signal is Signal.PER_REQUEST
    assert (outcome.drafted, outcome.accepted) == (19, 19)
    assert outcome.mean_acceptance_length == 4.8
    assert outcome.acceptance_rate == 1.0
    assert outcome.completion_tokens == 32 and outcome.chunks == 13
    assert outcome.finish_reason == "length"
    # ngram drafted in 5 steps only: decode steps = 32 - 1 - 19 = 12, as 13 chunks say
    assert outcome.steps == 12 == outcome.chunks - 1
    assert outcome.tokens_per_step == pytest.approx(31 / 12)


def test_chunks_give_steps_and_never_drafts():
    fold = fold_stream(SPEC, events("chat-stream-include-usage.sse"), drop_metrics=True)
    outcome = fold.finish(Status.OK, 1.0)
    assert outcome.signal is Signal.CHUNKS
    # 32 tokens in 13 content chunks: 12 decode steps, L = (32 - 1) / (13 - 1)
    assert outcome.steps == 12 and outcome.tokens_per_step == pytest.approx(31 / 12)
    # a chunk-derived draft acceptance would read 0.40 where vLLM's counters say 1.0
    assert outcome.drafted == outcome.accepted == 0 and outcome.acceptance_rate is None


def test_zero_draft_tokens_means_no_drafts_not_a_fall_back_to_chunks():
    fold = Fold(SPEC, 0.0)
    for i in range(5):
        fold.content(i * 0.01)
    metrics = {"speculative_decoding": {"num_draft_tokens": 0, "num_accepted_draft_tokens": 0}}
    usage(fold, {"completion_tokens": 5, "prompt_tokens": 3}, metrics)
    outcome = fold.finish(Status.OK, 1.0)
    assert outcome.signal is Signal.PER_REQUEST and outcome.drafted == 0
    assert outcome.acceptance_rate is None and outcome.tokens_per_step == 1.0


def test_drafts_accepted_past_max_tokens_do_not_make_steps_vanish():
    # real vLLM (draft model, k=4, max_tokens 48): 10 steps each accepted 4 drafts, the last
    # cut to 2 of its 5 tokens; vLLM's count keeps all 40 accepted drafts
    fold = Fold(SPEC, 0.0)
    spec = {"num_draft_tokens": 40, "num_accepted_draft_tokens": 40, "num_spec_steps": 10}
    usage(fold, {"completion_tokens": 48}, {"speculative_decoding": spec})
    outcome = fold.finish(Status.OK, 1.0)
    assert outcome.steps == 10 and outcome.acceptance_rate == 1.0


def test_a_stream_shows_the_steps_the_per_request_figures_cannot():
    # ngram, k=4, max_tokens 16: prefill, 4 steps without a match, 3 steps that drafted and
    # accepted 10 drafts; the last one was cut by 2 tokens, so T - 1 - accepted says 5 steps
    fold = Fold(SPEC, 0.0)
    for i in range(8):  # prefill's chunk and one chunk per step
        fold.content(i * 0.01)
    spec = {"num_draft_tokens": 12, "num_accepted_draft_tokens": 10, "num_spec_steps": 3}
    usage(fold, {"completion_tokens": 16}, {"speculative_decoding": spec})
    outcome = fold.finish(Status.OK, 1.0)
    assert outcome.signal is Signal.PER_REQUEST and outcome.steps == 7


def test_merged_deltas_bias_the_chunk_signal_upward():
    one_per_step = Fold(SPEC, 0.0)
    merged = Fold(SPEC, 0.0)
    for step in range(11):  # 1 prefill token + 10 steps of 2 tokens = 21 tokens
        one_per_step.content(step * 0.01)
        if step % 2 == 0:  # the server merged two steps into one chunk
            merged.content(step * 0.01)
    for fold in (one_per_step, merged):
        fold.usage({"completion_tokens": 21, "prompt_tokens": 5}, None)
    true_length = one_per_step.finish(Status.OK, 1.0).tokens_per_step
    biased_length = merged.finish(Status.OK, 1.0).tokens_per_step
    assert true_length == pytest.approx(2.0)
    assert biased_length is not None and biased_length > true_length


def test_standard_pool_measures_speed_only():
    outcome = fold_stream(STANDARD, events("chat-stream-include-usage.sse")).finish(Status.OK, 1.0)
    assert outcome.signal is Signal.NONE and outcome.acceptance_rate is None
    assert outcome.steps == 31 and outcome.tokens_per_step == 1.0  # one token per step
    assert outcome.ttft_s == pytest.approx(0.02)
    assert outcome.tpot_s == pytest.approx((0.14 - 0.02) / 31)


def test_chunks_held_back_and_read_at_once_do_not_shorten_the_steps():
    """Ten tokens a step apart (10 ms); the reader was busy and read the first seven in one
    read at 70 ms, as late as the seventh was sent. The three after show the step."""
    fold = Fold(STANDARD, 0.0)
    for _ in range(7):
        fold.content(0.07)
    for at in (0.08, 0.09, 0.10):
        fold.content(at)
    fold.usage({"prompt_tokens": 5, "completion_tokens": 10})
    outcome = fold.finish(Status.OK, 0.1)
    assert outcome.tpot_s == pytest.approx(0.01) and outcome.decode_s == pytest.approx(0.09)


def test_a_first_chunk_the_server_merged_does_not_shorten_the_steps():
    """Sixteen tokens, 5 ms a step; the engine's server fell behind and sent the first
    eleven as one chunk (44 characters), then one a chunk (4 characters each): the span
    after the first chunk holds five steps, not fifteen."""
    fold = Fold(STANDARD, 0.0)
    fold.content(0.05, None, 44)
    for i in range(1, 6):
        fold.content(0.05 + 0.005 * i, None, 4)
    fold.usage({"prompt_tokens": 5, "completion_tokens": 16})
    outcome = fold.finish(Status.OK, 0.08)
    assert outcome.tpot_s == pytest.approx(0.005)


def test_a_long_first_token_is_not_taken_for_a_merged_chunk():
    """Ten tokens a step apart, the first of them three times the others' length: the
    span holds nine steps."""
    fold = Fold(STANDARD, 0.0)
    fold.content(0.05, None, 12)
    for i in range(1, 10):
        fold.content(0.05 + 0.005 * i, None, 4)
    fold.usage({"prompt_tokens": 5, "completion_tokens": 10})
    assert fold.finish(Status.OK, 0.1).tpot_s == pytest.approx(0.005)


@pytest.mark.parametrize("first", [10, 1], ids=["in-one-read", "after-the-first"])
def test_a_stream_read_at_once_shows_no_decode_time(first):
    """Sixteen chunks, read in one go or after a first one alone: their arrivals, a few
    microseconds apart, say nothing of the steps (a stalled reader or server held them)."""
    fold = Fold(STANDARD, 0.0)
    for _ in range(first):
        fold.content(0.07)
    for i in range(16 - first):
        fold.content(0.07 + 1e-5 + 1e-6 * (i // 4))  # read in a few reads
    fold.usage({"prompt_tokens": 5, "completion_tokens": 16})
    outcome = fold.finish(Status.OK, 0.1)
    assert outcome.decode_s is None and outcome.tpot_s is None and outcome.ttft_s == 0.07


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
    assert outcome.steps == 10 and outcome.tokens_per_step == 4.9


def test_trtllm_says_its_tokens_per_step_on_the_answer():
    # TensorRT-LLM: generated tokens over decoding iterations, prefill's included
    labels = Labels("m", "r", "s", "spec", k=3, engine="trtllm")
    fold = Fold(labels, started_at=0.0)
    for i in range(6):
        fold.content(0.1 * (i + 1))
    usage(fold, {}, choices=[{"index": 0, "avg_decoded_tokens_per_iter": 2.5}])
    usage(fold, {"completion_tokens": 30})
    outcome = fold.finish(Status.OK, 1.0)
    assert outcome.signal is Signal.PER_REQUEST
    assert outcome.steps == 11 and outcome.drafted == 0  # 30 / 2.5 = 12 iterations, 1 prefill
    fold = Fold(labels, started_at=0.0)
    usage(fold, {}, choices=[{"index": 0, "avg_decoded_tokens_per_iter": True}])  # not a number
    usage(fold, {"completion_tokens": 30})
    assert fold.finish(Status.OK, 1.0).signal is Signal.SPEED


def test_an_engine_without_draft_counts_has_its_zeros_ignored():
    # a fused Neuron step schedules no drafts: a per-request block would say one token a step
    labels = Labels("tiny", "r", "s", "spec", k=4, engine="vllm-neuron")
    zeros = {"speculative_decoding": {"num_draft_tokens": 0, "num_accepted_draft_tokens": 0}}
    fold = Fold(labels, started_at=0.0)
    for i in range(5):
        fold.content(0.1 * (i + 1))
    usage(fold, {"completion_tokens": 21}, zeros)
    outcome = fold.finish(Status.OK, 1.0)
    assert outcome.signal is Signal.CHUNKS and outcome.steps == 4  # 20 tokens in 4 chunks
