"""A pool's step time from its engine's counters: vLLM 0.32's step histogram, prompt
counter and running gauge, read from a recorded page and between two readings."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.measure.enginesteps import EngineReading, between, reading

FIXTURES = Path(__file__).parents[2] / "vllm_fixtures"


@pytest.mark.parametrize("server", ["standard", "ngram", "draft"])
def test_vllm_0_32_pages_carry_the_steps_and_the_batch(server: str) -> None:
    page = (FIXTURES / server / "metrics.txt").read_text()
    got = reading(page, 5.0)
    assert got is not None and got.at == 5.0
    assert got.steps > 0 and got.tokens >= got.steps  # every step scheduled a token or more
    assert got.prompt_tokens > 0 and got.running >= 0
    assert 0 <= got.cached_tokens <= got.prompt_tokens  # vllm:prompt_tokens_cached_total


def test_a_page_without_the_histogram_says_nothing() -> None:
    assert reading('vllm:num_requests_running{engine="0"} 3.0\n', 0.0) is None


def test_the_mean_step_between_two_busy_readings() -> None:
    before = EngineReading(10.0, 1000.0, 9000.0, 50_000.0, 12.0)
    after = EngineReading(12.0, 1080.0, 10_000.0, 58_000.0, 16.0)
    step = between(before, after)
    assert step is not None
    assert step.seconds == pytest.approx(2.0 / 80) and step.steps == 80
    assert step.batch == 14.0 and step.prefill == pytest.approx(100.0)
    idle = EngineReading(14.0, 1080.0, 10_000.0, 58_000.0, 0.0)
    assert between(after, idle) is None  # idle: steps do not fill the time
    restarted = EngineReading(16.0, 5.0, 40.0, 100.0, 2.0)
    assert between(after, restarted) is None  # the counters went down


def test_prompt_tokens_the_cache_held_are_not_prefill_beside_the_steps() -> None:
    """A conversation's turn that finds its history cached computes only its new tokens:
    60k of 62k prompt tokens cached leave 2k prefilled beside 80 steps."""
    before = EngineReading(10.0, 1000.0, 9000.0, 50_000.0, 12.0, 40_000.0)
    after = EngineReading(12.0, 1080.0, 10_000.0, 112_000.0, 16.0, 100_000.0)
    step = between(before, after)
    assert step is not None and step.prefill == pytest.approx(2_000.0 / 80)
    page = (
        'vllm:iteration_tokens_total_count{engine="0"} 80.0\n'
        'vllm:iteration_tokens_total_sum{engine="0"} 900.0\n'
        'vllm:prompt_tokens_total{engine="0"} 62000.0\n'
        'vllm:prompt_tokens_cached_total{engine="0"} 60000.0\n'
        'vllm:num_requests_running{engine="0"} 4.0\n'
    )
    got = reading(page, 1.0)
    assert got is not None and got.cached_tokens == 60_000.0 and got.prompt_tokens == 62_000.0
