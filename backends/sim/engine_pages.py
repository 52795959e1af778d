"""What a simulated server shows besides answers, in the shape of the engine it plays.

- TensorRT-LLM (``serve/openai_server.py``): ``GET /metrics`` answers a JSON list of the
  iteration stats queued since the last read, and removes them (``get_stats_async``); the
  queue holds at most ``ITERATION_QUEUE`` entries, older ones are lost. Each has ``iter``,
  ``iterLatencyMS``, request counts, ``inflightBatchingStats`` and, on a speculative server,
  ``specDecodingStats`` (``numDraftTokens``, ``numAcceptedTokens``,
  ``numRequestsWithDraftTokens``, ``acceptanceLength``, ``iterLatencyMS``,
  ``draftOverhead``). ``GET /prometheus/metrics`` has the cumulative
  ``trtllm_spec_decode_num_{draft,accepted}_tokens_total`` (``metrics/collector.py``).
- SGLang: ``GET /server_info`` has ``internal_states[0].avg_spec_accept_length``, accepted
  tokens (bonus included) over verify steps since start; ``/metrics`` has the gauges
  ``sglang:spec_accept_length`` and ``sglang:spec_accept_rate`` over the last
  ``LOG_INTERVAL`` decode steps, as SGLang's scheduler logs them.

Pure apart from draining the queue it is given.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

ITERATION_QUEUE = 1000
LOG_INTERVAL = 40


@dataclass(frozen=True, slots=True)
class Iteration:
    """One engine step, as an engine's iteration stats count it."""

    iter: int
    seconds: float
    active: int
    queued: int
    completed: int
    context: int
    generating: int
    context_tokens: int
    drafted: int
    accepted: int
    with_drafts: int


def trtllm_stats(step: Iteration, max_active: int, speculative: bool) -> dict[str, Any]:
    """One entry of TensorRT-LLM's ``/metrics`` list."""
    out: dict[str, Any] = {
        "iter": step.iter,
        "iterLatencyMS": step.seconds * 1000.0,
        "numActiveRequests": step.active,
        "numQueuedRequests": step.queued,
        "numCompletedRequests": step.completed,
        "maxNumActiveRequests": max_active,
        "inflightBatchingStats": {
            "numScheduledRequests": step.context + step.generating,
            "numContextRequests": step.context,
            "numGenRequests": step.generating,
            "numPausedRequests": 0,
            "numCtxTokens": step.context_tokens,
            "microBatchId": 0,
        },
    }
    if speculative:
        with_drafts = step.with_drafts
        out["specDecodingStats"] = {
            "numDraftTokens": step.drafted,
            "numAcceptedTokens": step.accepted,
            "numRequestsWithDraftTokens": with_drafts,
            "acceptanceLength": 1.0 + step.accepted / with_drafts if with_drafts else 0.0,
            "iterLatencyMS": 0.0,
            "draftOverhead": 0.0,
        }
    return out


def drain(queue: deque[Iteration], max_active: int, speculative: bool) -> list[dict[str, Any]]:
    """Every queued iteration, oldest first, removed from the queue."""
    out = []
    while queue:
        out.append(trtllm_stats(queue.popleft(), max_active, speculative))
    return out


def trtllm_families(
    drafted: float, accepted: float, generated: float, running: int, model: str
) -> list[Metric]:
    """``/prometheus/metrics`` of a TensorRT-LLM server (labels as its collector sets)."""
    labels = ["model_name", "engine_type"]
    values = [model, "undefined"]
    out: list[Metric] = []
    for name, doc, value in (
        ("trtllm_spec_decode_num_draft_tokens", "Total number of draft tokens", drafted),
        ("trtllm_spec_decode_num_accepted_tokens", "Total number of accepted tokens", accepted),
        ("trtllm_generation_tokens", "Cumulative number of generation tokens.", generated),
    ):
        family = CounterMetricFamily(name, doc, labels=labels)
        family.add_metric(values, value)
        out.append(family)
    gauge = GaugeMetricFamily(
        "trtllm_num_requests_running", "Number of active requests", labels=labels
    )
    gauge.add_metric(values, running)
    out.append(gauge)
    return out


def sglang_families(
    recent: deque[Iteration], running: int, queued: int, model: str
) -> list[Metric]:
    """SGLang's gauges over the last ``LOG_INTERVAL`` decode steps."""
    labels = ["model_name", "engine_type", "tp_rank", "pp_rank"]
    values = [model, "unified", "0", "0"]
    verify = sum(s.with_drafts for s in recent)
    accepted = sum(s.accepted for s in recent)
    drafted = sum(s.drafted for s in recent)
    out: list[Metric] = []
    for name, doc, value in (
        ("sglang:num_running_reqs", "The number of running requests.", running),
        ("sglang:num_queue_reqs", "The number of requests in the waiting queue.", queued),
        (
            "sglang:spec_accept_length",
            "The average acceptance length of speculative decoding.",
            (accepted + verify) / verify if verify else 0.0,
        ),
        (
            "sglang:spec_accept_rate",
            "The average acceptance rate of speculative decoding "
            "(`accepted tokens / total draft tokens` in batch).",
            accepted / drafted if drafted else 0.0,
        ),
    ):
        family = GaugeMetricFamily(name, doc, labels=labels)
        family.add_metric(values, value)
        out.append(family)
    return out


def sglang_server_info(
    verify_steps: int, accepted: int, model: str, k: int | None
) -> dict[str, Any]:
    """``GET /server_info``: a few server arguments and the mean since start (``k`` None: a
    server that does not speculate, whose speculative arguments are null)."""
    state: dict[str, Any] = {"last_gen_throughput": 0.0, "load": 0}
    if verify_steps:
        state["avg_spec_accept_length"] = (accepted + verify_steps) / verify_steps
    return {
        "model_path": model,
        "served_model_name": model,
        "speculative_algorithm": "EAGLE" if k is not None else None,
        "speculative_num_steps": k,
        "speculative_num_draft_tokens": k + 1 if k is not None else None,
        "stream_interval": 1,
        "dp_size": 1,
        "internal_states": [state],
        "version": "0.5.x-speclane-sim",
    }
