"""An answer's own times, measured in the engine (``Engine.timings``, ``gateway/engines/``),
as its outcome's time to first token and time per output token, for answers that pass
through whole, where the gateway sees no token arrive (step 6); its time queued in the
engine is the fold's (``Fold.usage``), for every answer that says it.

The engine's time to its first token counts from scheduling, so the queue time is added
back; its time per token after the first is exactly the time per output token. Network and
gateway time are not in them.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import replace

from gateway.engines import Timings
from gateway.measure.acceptance import Outcome


def engine_timed(outcome: Outcome, timings: Timings | None) -> Outcome:
    """``outcome`` with TTFT and time per output token from the engine's ``timings`` where
    it has none of its own, and with the engine's queue time."""
    if timings is None:
        return outcome
    if timings.queue_s is not None:
        outcome = replace(outcome, queue_s=timings.queue_s)
    ttft_s, tpot_s = outcome.ttft_s, outcome.tpot_s
    if ttft_s is None and timings.first_s is not None:
        ttft_s = timings.first_s + (timings.queue_s or 0.0)
    if tpot_s is None and timings.per_token_s is not None:
        tpot_s = timings.per_token_s
    if (ttft_s, tpot_s) == (outcome.ttft_s, outcome.tpot_s):
        return outcome
    decode_s = outcome.decode_s
    if decode_s is None and tpot_s is not None and outcome.completion_tokens > 1:
        decode_s = tpot_s * (outcome.completion_tokens - 1)  # what the step-time fit needs
    return replace(outcome, ttft_s=ttft_s, tpot_s=tpot_s, decode_s=decode_s)
