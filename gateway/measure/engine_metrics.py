"""vLLM's per-request timings (``--enable-per-request-metrics``) as an outcome's time to first
token and time per output token, for answers that pass through whole, where the gateway sees
no token arrive (step 6), and as its time queued in the engine, for every answer that
carries them (the queue/compute split).

vLLM measures them in the engine (``build_per_request_timing_metrics``): TTFT from scheduling,
so the queue time is added back; ``mean_itl_ms`` is decode time over the tokens after the
first, which is exactly the time per output token. Network and gateway time are not in them.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from gateway.measure.acceptance import Outcome

_MS = 1000.0


def engine_timed(outcome: Outcome, metrics: object) -> Outcome:
    """``outcome`` with TTFT and time per output token from vLLM's ``metrics`` where it has
    none of its own, and with vLLM's queue time."""
    if not isinstance(metrics, Mapping):
        return outcome
    ttft, queue, itl = (
        _number(metrics.get(k)) for k in ("time_to_first_token_ms", "queue_time_ms", "mean_itl_ms")
    )
    if queue is not None:
        outcome = replace(outcome, queue_s=queue / _MS)
    ttft_s, tpot_s = outcome.ttft_s, outcome.tpot_s
    if ttft_s is None and ttft is not None:
        ttft_s = (ttft + (queue or 0.0)) / _MS
    if tpot_s is None and itl is not None:
        tpot_s = itl / _MS
    if (ttft_s, tpot_s) == (outcome.ttft_s, outcome.tpot_s):
        return outcome
    decode_s = outcome.decode_s
    if decode_s is None and tpot_s is not None and outcome.completion_tokens > 1:
        decode_s = tpot_s * (outcome.completion_tokens - 1)  # what the step-time fit needs
    return replace(outcome, ttft_s=ttft_s, tpot_s=tpot_s, decode_s=decode_s)


def _number(value: object) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
        return float(value)
    return None
