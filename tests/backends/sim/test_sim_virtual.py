from __future__ import annotations

import statistics

import pytest

from backends.sim.config import Mode, SimConfig
from backends.sim.model import CostModel, DriftPoint
from backends.sim.virtual import TimedRequest, simulate
from backends.sim.workload import Workload, estimate_prompt_tokens

BODIES: dict[str, dict[str, object]] = {
    "json": {"response_format": {"type": "json_object"}, "temperature": 0},
    "code": {"messages": [{"role": "user", "content": "write python"}], "temperature": 0},
    "chat": {"temperature": 0.7},
    "creative": {"temperature": 1.0},
}


def body(kind: str, max_tokens: int = 128) -> dict[str, object]:
    base = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": max_tokens}
    return base | BODIES[kind]


def tpot(kind: str, mode: Mode, batch: int) -> float:
    requests = [TimedRequest(0.0, body(kind)) for _ in range(batch)]
    results = simulate(requests, SimConfig(mode=mode, max_num_seqs=batch, seed=3))
    return statistics.mean(r.tpot for r in results)


def speedup(kind: str, batch: int) -> float:
    return tpot(kind, Mode.STANDARD, batch) / tpot(kind, Mode.SPECULATIVE, batch)


def test_deterministic() -> None:
    requests = [TimedRequest(i * 0.01, body("code")) for i in range(10)]
    config = SimConfig(seed=5, max_num_seqs=4)
    assert simulate(requests, config) == simulate(requests, config)
    other = simulate(requests, SimConfig(seed=6, max_num_seqs=4))
    assert other != simulate(requests, config)


def test_results_are_sensible() -> None:
    requests = [TimedRequest(0.5, body("code", 64)), TimedRequest(0.0, body("chat", 200))]
    late, early = simulate(requests, SimConfig(seed=1))
    assert (late.index, late.arrival, early.arrival) == (0, 0.5, 0.0)
    assert late.workload is Workload.CODE and early.workload is Workload.CHAT
    assert late.completion_tokens == 64 and late.finish_reason == "length"
    assert 0 < late.ttft < 0.2 and 0 < late.tpot < late.ttft
    assert list(late.token_times) == sorted(late.token_times)
    assert late.e2e == pytest.approx(late.token_times[-1] - 0.5)
    assert late.num_draft_tokens == 4 * late.num_spec_steps
    assert late.steps == late.num_spec_steps + 1
    assert late.mean_acceptance_length == pytest.approx(
        1 + late.num_accepted_draft_tokens / late.num_spec_steps
    )


def test_idle_engine_jumps_to_the_next_arrival() -> None:
    one = body("chat", 1)
    (only,) = simulate([TimedRequest(100.0, one)], SimConfig())
    cost = CostModel()
    prefill = cost.prefill_per_token_s * estimate_prompt_tokens(one)
    assert only.ttft == pytest.approx(cost.target_fixed_s + prefill)
    assert only.tpot == 0.0 and only.steps == 1


def test_queueing_raises_ttft() -> None:
    requests = [TimedRequest(0.0, body("chat", 32)) for _ in range(4)]
    results = simulate(requests, SimConfig(max_num_seqs=2))
    assert results[3].ttft > 2 * results[0].ttft


@pytest.mark.parametrize("kind", ["json", "code"])
def test_speculation_pays_at_batch_1_for_structured_work(kind: str) -> None:
    assert speedup(kind, 1) > 1.8


def test_speculation_loses_for_creative_work() -> None:
    assert 0.8 < speedup("creative", 1) < 0.95


@pytest.mark.parametrize("kind", ["code", "json"])
def test_speculation_loses_at_high_batch(kind: str) -> None:
    assert speedup(kind, 128) < 1.0


def test_drift_applies_to_later_arrivals() -> None:
    config = SimConfig(drift=(DriftPoint(Workload.CODE, 10.0, 0.05),), seed=2)
    before, after = simulate(
        [TimedRequest(0.0, body("code", 200)), TimedRequest(10.0, body("code", 200))], config
    )
    assert before.acceptance > 0.8 and after.acceptance < 0.06
    assert after.num_accepted_draft_tokens < before.num_accepted_draft_tokens
