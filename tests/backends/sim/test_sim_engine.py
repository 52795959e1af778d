from __future__ import annotations

import asyncio

import pytest

from backends.sim.engine import Engine, Scheduler, Sequence, StepEvent
from backends.sim.model import CostModel, RequestProfile
from backends.sim.workload import Workload
from tests.backends.sim.conftest import FakeTime

K = 4


def profile(
    tokens: int = 40, *, a: float = 0.8, index: int = 0, prompt: int = 10
) -> RequestProfile:
    return RequestProfile(
        workload=Workload.CODE,
        prompt_tokens=prompt,
        max_tokens=tokens,
        output_tokens=tokens,
        finish_reason="length",
        acceptance=a,
        seed_key=f"test:{index}",
    )


def scheduler(*, speculative: bool = True, max_num_seqs: int = 8) -> Scheduler:
    return Scheduler(speculative=speculative, k=K, max_num_seqs=max_num_seqs)


def drain(s: Scheduler) -> list[list[tuple[Sequence, StepEvent]]]:
    steps = []
    while s.has_work():
        steps.append(list(s.step().events))
    return steps


def test_first_token_is_prefill_then_speculative_steps() -> None:
    s = scheduler()
    seq = Sequence(profile(40), K)
    s.submit(seq)
    events = [e for step in drain(s) for _, e in step]
    assert events[0] == StepEvent(0, 1, 0, 0, False)
    assert all(e.drafted == K and 1 <= e.tokens <= K + 1 for e in events[1:])
    assert sum(e.tokens for e in events) == 40 and events[-1].finished
    assert [e.start for e in events] == [
        sum(x.tokens for x in events[:i]) for i in range(len(events))
    ]
    tally = seq.tally
    assert tally.num_spec_steps == len(events) - 1
    assert tally.num_draft_tokens == K * tally.num_spec_steps
    assert tally.num_accepted_draft_tokens == sum(e.accepted for e in events)
    assert sum(tally.histogram) == tally.num_spec_steps
    assert (
        tally.mean_acceptance_length == 1 + tally.num_accepted_draft_tokens / tally.num_spec_steps
    )


def test_standard_mode_emits_one_token_per_step() -> None:
    s = scheduler(speculative=False)
    seq = Sequence(profile(12), K)
    s.submit(seq)
    steps = drain(s)
    assert len(steps) == 12 and all(e.tokens == 1 and e.drafted == 0 for ((_, e),) in steps)
    assert seq.tally.num_spec_steps == 0 and s.counters.num_drafts == 0
    assert seq.tally.mean_acceptance_length == 1.0 and seq.tally.draft_acceptance_rate == 0.0


def test_batch_limit_queues_the_rest() -> None:
    s = scheduler(max_num_seqs=2)
    seqs = [Sequence(profile(5, index=i), K) for i in range(5)]
    for seq in seqs:
        s.submit(seq)
    assert (s.num_running, s.num_waiting) == (0, 5)
    first = s.step()
    assert (s.num_running, s.num_waiting) == (2, 3)
    assert [seq for seq, _ in first.events] == seqs[:2]
    while s.num_waiting == 3:
        s.step()
    assert s.num_running <= 2
    drain(s)
    assert all(seq.finished for seq in seqs)


def test_one_event_per_running_sequence_per_step() -> None:
    s = scheduler()
    for i in range(3):
        s.submit(Sequence(profile(30, index=i), K))
    for step in drain(s):
        seqs = [seq for seq, _ in step]
        assert len(seqs) == len(set(map(id, seqs)))


def test_cancel_removes_running_and_waiting() -> None:
    s = scheduler(max_num_seqs=1)
    a, b = Sequence(profile(50), K), Sequence(profile(50, index=1), K)
    s.submit(a)
    s.submit(b)
    s.step()
    s.cancel(b)
    assert (s.num_running, s.num_waiting) == (1, 0)
    s.cancel(a)
    assert not s.has_work() and a.cancelled and not a.finished


def test_counters_add_up() -> None:
    s = scheduler()
    seqs = [Sequence(profile(30, index=i, prompt=7), K) for i in range(3)]
    for seq in seqs:
        s.submit(seq)
    drain(s)
    c = s.counters
    assert c.prompt_tokens == 21 and c.generation_tokens == 90
    assert c.num_drafts == sum(q.tally.num_spec_steps for q in seqs)
    assert c.num_accepted_tokens == sum(q.tally.num_accepted_draft_tokens for q in seqs)
    assert c.accepted_per_pos[0] >= c.accepted_per_pos[-1]
    assert sum(c.accepted_per_pos) == c.num_accepted_tokens


def test_step_cost_grows_with_batch_and_speculation() -> None:
    cost = CostModel()

    def first_decode_cost(speculative: bool, n: int) -> float:
        s = Scheduler(speculative=speculative, k=K, max_num_seqs=256, cost=cost)
        for i in range(n):
            s.submit(Sequence(profile(50, index=i, prompt=0), K))
        s.step()
        return s.step().seconds

    assert first_decode_cost(True, 64) > first_decode_cost(True, 1)
    assert first_decode_cost(True, 8) > first_decode_cost(False, 8)
    assert first_decode_cost(False, 1) == pytest.approx(
        cost.target_fixed_s + cost.target_per_token_s
    )


def test_run_alone_matches_batched_steps() -> None:
    s = scheduler()
    alone = s.run_alone(Sequence(profile(33), K))
    batched = scheduler()
    batched.submit(Sequence(profile(33), K))
    assert alone == [e for step in drain(batched) for _, e in step]


@pytest.mark.anyio
async def test_engine_sleeps_scaled_step_costs_and_delivers_after() -> None:
    fake = FakeTime()
    s = scheduler()
    engine = Engine(s, time_scale=0.5, clock=fake.clock, sleep=fake.sleep)
    got: list[tuple[float, StepEvent]] = []
    seq = Sequence(profile(20), K, sink=lambda e: got.append((fake.now, e)))
    engine.submit(seq)
    while not (got and got[-1][1].finished):
        await _tick()
    assert sum(e.tokens for _, e in got) == 20
    assert fake.sleeps and all(x > 0 for x in fake.sleeps)
    assert got[0][0] == pytest.approx(100.0 + fake.sleeps[0])
    assert len(got) == len(fake.sleeps)
    await engine.aclose()


@pytest.mark.anyio
async def test_engine_cancel_stops_delivery_and_aclose_stops_the_loop() -> None:
    fake = FakeTime()
    engine = Engine(scheduler(), time_scale=1.0, clock=fake.clock, sleep=fake.sleep)
    got: list[StepEvent] = []
    seq = Sequence(profile(10_000), K, sink=got.append)
    engine.submit(seq)
    for _ in range(5):
        await _tick()
    assert 0 < len(got) < 10
    engine.cancel(seq)
    seen = len(got)
    for _ in range(5):
        await _tick()
    assert len(got) == seen and not engine.scheduler.has_work() and not seq.finished
    other = Sequence(profile(10_000, index=1), K, sink=got.append)
    engine.submit(other)
    await _tick()
    await engine.aclose()
    assert engine.scheduler.num_running == 1  # the loop is gone; nothing advances it


async def _tick() -> None:
    await asyncio.sleep(0)
