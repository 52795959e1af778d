from __future__ import annotations

import random

import pytest

from backends.sim.model import (
    DEFAULT_BASE,
    AcceptanceModel,
    CostModel,
    DriftPoint,
    base_acceptance,
    build_profile,
    expected_draft_acceptance_rate,
    expected_tokens_per_step,
    per_token_acceptance,
    sample_accepted,
)
from backends.sim.workload import Workload

K = 4


@pytest.mark.parametrize(
    ("a", "k", "expected"),
    [(0.0, 4, 1.0), (0.5, 4, 1.9375), (0.9, 4, 4.0951), (1.0, 4, 5.0), (0.8, 1, 1.8)],
)
def test_leviathan_expected_tokens(a: float, k: int, expected: float) -> None:
    assert expected_tokens_per_step(a, k) == pytest.approx(expected, abs=1e-4)


@pytest.mark.parametrize("a", [0.1, 0.28, 0.5, 0.65, 0.82, 0.92])
@pytest.mark.parametrize("k", [1, 3, 4, 7])
def test_sampler_matches_leviathan(a: float, k: int) -> None:
    rng = random.Random(f"sampler:{a}:{k}")
    n = 20_000
    mean = sum(sample_accepted(rng, a, k) for _ in range(n)) / n
    assert 1 + mean == pytest.approx(expected_tokens_per_step(a, k), rel=0.03)


def test_sampler_bounds_and_determinism() -> None:
    draws = [sample_accepted(random.Random(s), 0.99, K) for s in range(200)]
    assert min(draws) >= 0 and max(draws) == K
    assert all(sample_accepted(random.Random(s), 0.0, K) == 0 for s in range(50))
    first = [sample_accepted(random.Random("x"), 0.6, K) for _ in range(3)]
    assert len(set(first)) == 1


@pytest.mark.parametrize("rate", [0.05, 0.3, 0.6, 0.9])
def test_per_token_acceptance_inverts_the_rate(rate: float) -> None:
    a = per_token_acceptance(rate, K)
    assert expected_draft_acceptance_rate(a, K) == pytest.approx(rate, abs=1e-9)


def test_temperature_and_context_lower_acceptance() -> None:
    model = AcceptanceModel()
    cold = model.acceptance(0.8, temperature=0.0, prompt_tokens=0)
    warm = model.acceptance(0.8, temperature=0.7, prompt_tokens=0)
    hot = model.acceptance(0.8, temperature=1.0, prompt_tokens=0)
    assert cold == pytest.approx(0.8)
    assert cold > warm > hot == pytest.approx(0.64)
    short = model.acceptance(0.8, temperature=0.0, prompt_tokens=1000)
    long = model.acceptance(0.8, temperature=0.0, prompt_tokens=16000)
    assert 0.8 > short > long
    assert long == pytest.approx(0.8 / (1 + 16000 / 32768))
    assert model.acceptance(1.0, temperature=0.0, prompt_tokens=0) == 0.99
    assert model.acceptance(0.5, temperature=5.0, prompt_tokens=0) == pytest.approx(0.3)


def test_summarisation_draft_acceptance_collapses() -> None:
    """The literature reports 5-8 % draft acceptance for long-document summaries."""
    model = AcceptanceModel()
    a = model.acceptance(DEFAULT_BASE[Workload.SUMMARISE], temperature=0.3, prompt_tokens=8000)
    assert 0.04 <= expected_draft_acceptance_rate(a, K) <= 0.08


def _creative_a() -> float:
    return AcceptanceModel().acceptance(
        DEFAULT_BASE[Workload.CREATIVE], temperature=1.0, prompt_tokens=100
    )


def test_cost_model_speculation_wins_at_high_acceptance_batch_1() -> None:
    assert CostModel().speedup(0.9, K, batch=1) >= 2.0


def test_cost_model_speculation_loses_at_creative_acceptance() -> None:
    a = _creative_a()
    assert 0.2 <= a <= 0.35
    assert 0.88 <= CostModel().speedup(a, K, batch=1) <= 0.91


@pytest.mark.parametrize("batch", [64, 128])
def test_cost_model_speculation_loses_at_high_batch(batch: int) -> None:
    assert CostModel().speedup(0.82, K, batch=batch) < 1.0
    assert CostModel().speedup(0.92, K, batch=128) < 1.0


def test_step_seconds_formula() -> None:
    cost = CostModel(1.0, 0.1, 0.01, 0.5, 0.05)
    assert cost.step_seconds(
        verified_tokens=10, prefill_tokens=100, draft_passes=2, drafting_seqs=2
    ) == pytest.approx(1.0 + 1.0 + 1.0 + 2 * (0.5 + 0.1))
    assert cost.decode_step_seconds(batch=2, k=2, speculative=False) == pytest.approx(1.2)


def test_base_acceptance_precedence() -> None:
    model = AcceptanceModel()
    drift = (DriftPoint(Workload.CODE, 60, 0.1), DriftPoint(Workload.CODE, 120, 0.7))
    assert base_acceptance(Workload.CODE, now_s=10, model=model, drift=drift) == 0.82
    assert base_acceptance(Workload.CODE, now_s=60, model=model, drift=drift) == 0.1
    assert base_acceptance(Workload.CODE, now_s=500, model=model, drift=drift) == 0.7
    assert base_acceptance(Workload.CHAT, now_s=500, model=model, drift=drift) == 0.65
    overrides = {Workload.CODE: 0.3}
    assert (
        base_acceptance(Workload.CODE, now_s=500, model=model, drift=drift, overrides=overrides)
        == 0.3
    )
    custom = AcceptanceModel(base={Workload.CODE: 0.5})
    assert base_acceptance(Workload.CODE, now_s=0, model=custom) == 0.5
    assert base_acceptance(Workload.JSON, now_s=0, model=custom) == 0.92


def _code_body(**extra: object) -> dict[str, object]:
    return {"messages": [{"role": "user", "content": "write python"}], "temperature": 0, **extra}


def test_profile_is_deterministic_per_seed_and_index() -> None:
    one = build_profile(_code_body(), seed=7, index=3, max_tokens=64)
    assert one == build_profile(_code_body(), seed=7, index=3, max_tokens=64)
    sampled = _code_body(temperature=0.7)
    others = {build_profile(sampled, seed=7, index=i, max_tokens=1000) for i in range(20)}
    assert len({p.output_tokens for p in others}) > 5
    assert one.workload is Workload.CODE and one.acceptance == pytest.approx(0.82, abs=0.01)


def test_greedy_text_follows_the_content_on_every_server() -> None:
    profiles = [
        build_profile(_code_body(), seed=seed, index=i, max_tokens=1000)
        for seed, i in ((0, 0), (7, 3), (9, 40))
    ]
    assert len({(p.output_tokens, p.draw("text"), p.text_key) for p in profiles}) == 1
    assert len({p.draw("steps") for p in profiles}) == 3  # acceptance still varies
    broken = build_profile(_code_body(), seed=0, index=0, max_tokens=1000, greedy_mismatch=1.0)
    assert broken.draw("text") != profiles[0].draw("text")


def test_profile_length_and_finish_reason() -> None:
    short = build_profile(_code_body(), seed=0, index=0, max_tokens=5)
    assert (short.output_tokens, short.finish_reason) == (5, "length")
    long = build_profile(_code_body(), seed=0, index=0, max_tokens=10_000)
    assert long.finish_reason == "stop" and 80 <= long.output_tokens <= 320
    tools = [{"type": "function", "function": {"name": "f"}}]
    call = build_profile(
        _code_body(tools=tools, tool_choice="required"), seed=0, index=0, max_tokens=10_000
    )
    assert (call.tool_name, call.finish_reason) == ("f", "tool_calls")


def test_profile_uses_overrides_and_drift() -> None:
    body = _code_body()
    drift = (DriftPoint(Workload.CODE, 60, 0.1),)
    before = build_profile(body, seed=0, index=0, max_tokens=8, now_s=59, drift=drift)
    after = build_profile(body, seed=0, index=0, max_tokens=8, now_s=61, drift=drift)
    assert before.acceptance > 0.8 and after.acceptance == pytest.approx(0.1, abs=0.01)
    forced = build_profile(body, seed=0, index=0, max_tokens=8, overrides={Workload.CODE: 0.2})
    assert forced.acceptance == pytest.approx(0.2, abs=0.01)


def test_ignore_eos_runs_to_max_tokens() -> None:
    p = build_profile(_code_body(ignore_eos=True), seed=0, index=0, max_tokens=5000)
    assert (p.output_tokens, p.finish_reason) == (5000, "length")
