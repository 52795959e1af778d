"""A pool's step time from its engine's own counters, where it has them: every endpoint's
step is observed between two readings of its metrics page, without a request of the
gateway's own (``loadscrape.py`` reads the page; ``steptimes.py`` learns from it). Pure.

vLLM 0.32 (``tests/vllm_fixtures/*/metrics.txt``) counts its engine steps in the histogram
``vllm:iteration_tokens_total`` (one observation per step: the prompt and generated tokens
it scheduled; ``_count`` the steps, ``_sum`` the tokens), its prompt tokens in
``vllm:prompt_tokens_total``, those its prefix cache held in
``vllm:prompt_tokens_cached_total``, and its batch in the gauge
``vllm:num_requests_running``. An engine steps back to back while it runs anything, so
between two readings at which it ran requests its mean step is the time between them over
the steps counted, at about the mean of the two batches, with the prompt tokens it computed
meanwhile (counted less cached) prefilled beside them: a conversation's turn that finds its
history cached computes only its new tokens, and counted whole, an agent's 60k-token
prompt would read as a step's worth of prefill and the decode step as nearly free. Its
per-token time histograms (``vllm:inter_token_latency_seconds``,
``vllm:request_time_per_output_token_seconds``) mix the steps of every request with its
accepted tokens and are not read. Summed over engines and label sets.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

STEPS = "vllm:iteration_tokens_total"
PROMPT = "vllm:prompt_tokens"
CACHED = "vllm:prompt_tokens_cached"
RUNNING = "vllm:num_requests_running"
MIN_STEPS = 3.0  # fewer steps between readings say too little


@dataclass(frozen=True, slots=True)
class EngineReading:
    """One reading of an engine's page: when, its steps and the tokens they scheduled so
    far, its prompt tokens so far, and the requests it runs now; ``cached_tokens``: the
    prompt tokens so far its prefix cache held (0 on a page without the counter)."""

    at: float
    steps: float
    tokens: float
    prompt_tokens: float
    running: float
    cached_tokens: float = 0.0


@dataclass(frozen=True, slots=True)
class EngineStep:
    """An engine's mean step between two readings: ``seconds`` per step, over ``steps``
    steps, at ``batch`` requests running and ``prefill`` prompt tokens per step."""

    seconds: float
    steps: float
    batch: float
    prefill: float


def reading(text: str, at: float) -> EngineReading | None:
    """The counters of one vLLM metrics page; None when it has no step histogram."""
    steps = tokens = prompt = cached = running = 0.0
    seen = False
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == f"{STEPS}_count":
                steps, seen = steps + sample.value, True
            elif sample.name == f"{STEPS}_sum":
                tokens += sample.value
            elif sample.name == f"{PROMPT}_total":
                prompt += sample.value
            elif sample.name == f"{CACHED}_total":
                cached += sample.value
            elif sample.name == RUNNING:
                running += sample.value
    return EngineReading(at, steps, tokens, prompt, running, cached) if seen else None


def between(before: EngineReading, after: EngineReading) -> EngineStep | None:
    """The mean step between two readings of one engine; None unless it ran requests at
    both (it may have idled between otherwise), counted enough steps, and did not restart."""
    dt, steps = after.at - before.at, after.steps - before.steps
    if dt <= 0 or steps < MIN_STEPS or before.running < 1 or after.running < 1:
        return None
    cached = max(after.cached_tokens - before.cached_tokens, 0.0)
    prompt = max(after.prompt_tokens - before.prompt_tokens - cached, 0.0)
    batch = (before.running + after.running) / 2.0
    return EngineStep(dt / steps, steps, batch, prompt / steps)


def since_last(
    readings: dict[str, EngineReading], key: str, current: EngineReading
) -> EngineStep | None:
    """The mean step of engine ``key`` since its last reading in ``readings`` (``between``),
    None at its first; ``current`` is kept there as its last."""
    before, readings[key] = readings.get(key), current
    return between(before, current) if before is not None else None
