"""Chunked prefill within the per-step token budget, and step outputs merged when the API
server's processing outlasts the step: in the scheduler, in the real-time engine and server,
and in the virtual-time cluster, which must agree."""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Callable
from functools import partial
from typing import Any

import httpx
import orjson
import pytest

from backends.sim.cluster import Cluster, Served
from backends.sim.config import Mode, SimConfig
from backends.sim.engine import Engine, Scheduler, Sequence, Step, StepEvent, merge_factor
from backends.sim.model import CostModel, Method, build_profile
from backends.sim.pacing import timings
from backends.sim.prefix import prompt_hashes
from tests.backends.sim.conftest import FakeTime
from tests.backends.sim.test_sim_engine import profile

K = 4
Server = Callable[[SimConfig], contextlib.AbstractAsyncContextManager[str]]


def used(step: Step) -> int:
    """Tokens the step scheduled: its prompt tokens, and 1 + drafts per decoding sequence."""
    return step.prefill_tokens + sum(1 + e.drafted for _, e in step.events if e.start > 0)


def run(s: Scheduler) -> list[Step]:
    steps = []
    while s.has_work():
        steps.append(s.step())
    return steps


def test_every_step_keeps_to_the_budget_with_a_draft_slot_per_sequence() -> None:
    s = Scheduler(speculative=True, k=K, max_num_seqs=8, max_num_batched_tokens=64)
    assert s.draft_slots == 1  # each scheduled sequence also takes a slot for the draft model
    seqs = [Sequence(profile(30, prompt=45, index=i), K) for i in range(6)]
    for seq in seqs:
        s.submit(seq)
    steps = run(s)
    assert all(used(step) + len(step.events) <= 64 for step in steps)
    assert max(used(step) + len(step.events) for step in steps) == 64  # prefills fill the rest
    assert all(seq.finished for seq in seqs)
    assert s.counters.prompt_tokens == 6 * 45 == sum(step.prefill_tokens for step in steps)
    assert Scheduler(speculative=False, k=K, max_num_seqs=8).draft_slots == 0
    assert Scheduler(speculative=True, k=K, max_num_seqs=8, method=Method.NGRAM).draft_slots == 0


def test_a_long_prompt_is_prefilled_over_several_steps_beside_the_decodes() -> None:
    s = Scheduler(speculative=False, k=K, max_num_seqs=8, max_num_batched_tokens=100)
    short = Sequence(profile(50, prompt=10), K)
    s.submit(short)
    s.step()
    long = Sequence(profile(5, prompt=250, index=1), K)
    s.submit(long)
    steps = []
    while not long.emitted:
        steps.append(s.step())
    # the decode goes first (1 token), the prompt gets the rest: 99 + 99 + 52
    assert [step.prefill_tokens for step in steps] == [99, 99, 52]
    assert [dict(step.events)[short].tokens for step in steps] == [1, 1, 1]
    assert [dict(step.events)[long] for step in steps] == [
        StepEvent(0, 0, 0, 0, False),
        StepEvent(0, 0, 0, 0, False),
        StepEvent(0, 1, 0, 0, False),
    ]
    assert steps[0].admitted == (long,) and not steps[1].admitted
    assert long.prefilled == 250 and long.steps == 1 and s.num_running == 2
    cost = CostModel()
    assert steps[0].seconds == pytest.approx(
        cost.target_fixed_s + cost.target_per_token_s + 99 * cost.prefill_per_token_s
    )
    assert [e.tokens for _, e in steps[0].outputs] == [1]  # a prefill chunk sends nothing


def test_admission_stops_at_the_budget_and_the_seats() -> None:
    s = Scheduler(speculative=False, k=K, max_num_seqs=3, max_num_batched_tokens=100)
    seqs = [Sequence(profile(4, prompt=60, index=i), K) for i in range(5)]
    for seq in seqs:
        s.submit(seq)
    first = s.step()
    assert first.admitted == tuple(seqs[:2]) and first.prefill_tokens == 100  # 60 + 40
    assert (s.num_running, s.num_waiting) == (2, 3)
    second = s.step()  # seqs[1] finishes its prompt (20), one decode (1), seqs[2] gets 60
    assert second.admitted == (seqs[2],) and s.num_running == 3
    assert used(second) == 1 + 20 + 60
    run(s)
    assert all(seq.finished for seq in seqs)


async def finish(seqs: list[Sequence]) -> None:
    while not all(seq.finished for seq in seqs):
        await asyncio.sleep(0)


@pytest.mark.anyio
async def test_first_token_after_the_last_chunk_and_the_timing_metrics() -> None:
    fake = FakeTime()
    s = Scheduler(speculative=False, k=K, max_num_seqs=1, max_num_batched_tokens=100)
    engine = Engine(s, time_scale=1.0, clock=fake.clock, sleep=fake.sleep)
    got: list[tuple[float, StepEvent]] = []
    first = Sequence(profile(3, prompt=250), K, sink=lambda e: got.append((fake.now, e)))
    queued = Sequence(profile(2, prompt=10, index=1), K)
    engine.submit(first)
    engine.submit(queued)
    await finish([first, queued])
    await engine.aclose()
    prefill = sum(fake.sleeps[:3])  # 100 + 100 + 50 prompt tokens
    assert first.times.scheduled == 100.0
    assert first.times.first_token == pytest.approx(100.0 + prefill)
    assert got[0] == (first.times.first_token, StepEvent(0, 1, 0, 0, False))
    metrics = timings(first.times, 3)
    assert metrics["time_to_first_token_ms"] == pytest.approx(prefill * 1000)
    assert metrics["queue_time_ms"] == 0.0
    # one seat: the second waits for the first to finish (3 prefill steps, 2 decodes)
    assert queued.times.scheduled == pytest.approx(100.0 + sum(fake.sleeps[:5]))
    assert timings(queued.times, 2)["queue_time_ms"] == pytest.approx(sum(fake.sleeps[:5]) * 1000)
    assert queued.times.first_token == pytest.approx(100.0 + sum(fake.sleeps[:6]))


def test_merge_factor() -> None:
    assert merge_factor(64, 0.08, 0.0) == 1  # 0 turns merging off
    assert merge_factor(1, 0.026, 150e-6) == 1  # idle: processing keeps up
    assert merge_factor(200, 0.04, 150e-6) == 1  # 30 ms of processing in a 40 ms step
    assert merge_factor(400, 0.04, 150e-6) == 2
    assert merge_factor(1000, 0.04, 150e-6) == 4


def outputs_by_seq(steps: list[Step]) -> dict[Sequence, list[tuple[StepEvent, int]]]:
    """Each sequence's outputs and the merge factor of the step that sent each."""
    out: dict[Sequence, list[tuple[StepEvent, int]]] = {}
    for step in steps:
        for seq, event in step.outputs:
            out.setdefault(seq, []).append((event, step.merge))
    return out


def test_outputs_merge_under_load_and_not_when_idle() -> None:
    busy = Scheduler(speculative=True, k=K, max_num_seqs=64, stream_cost_s=0.01)
    seqs = [Sequence(profile(80, prompt=20, index=i), K) for i in range(40)]
    for seq in seqs:
        busy.submit(seq)
    steps = run(busy)
    assert max(step.merge for step in steps) > 1
    for seq, outputs in outputs_by_seq(steps).items():
        events = [event for event, _ in outputs]
        assert events[0] == StepEvent(0, 1, 0, 0, False)  # the first token goes at once
        assert events[-1].finished and sum(e.tokens for e in events) == 80
        assert [e.start for e in events] == [
            sum(e.tokens for e in events[:i]) for i in range(len(events))
        ]
        assert len(events) < seq.steps  # fewer chunks than steps that gave it tokens
        assert sum(e.drafted for e in events) == seq.tally.num_draft_tokens
        # between the first and the last, an output leaves once its step's factor has queued up
        assert all(event.tokens >= merge for event, merge in outputs[1:-1])
    assert all(seq.tally.num_spec_steps == seq.steps - 1 for seq in seqs)  # engine steps

    idle = Scheduler(speculative=True, k=K, max_num_seqs=64, stream_cost_s=150e-6)
    alone = Sequence(profile(80, prompt=20), K)
    idle.submit(alone)
    steps = run(idle)
    assert all(step.merge == 1 and step.outputs == step.events for step in steps)


BODY = {"messages": [{"role": "user", "content": "write python " * 200}], "temperature": 0}
SHORT = {"messages": [{"role": "user", "content": "write python"}], "temperature": 0}


def heard(fake: FakeTime, into: list[tuple[float, StepEvent]], event: StepEvent) -> None:
    into.append((fake.now, event))


@pytest.mark.anyio
async def test_the_real_time_engine_and_the_cluster_agree() -> None:
    config = SimConfig(seed=3, max_num_seqs=16, max_num_batched_tokens=300, stream_cost_s=0.015)
    bodies = [BODY if i % 3 == 0 else SHORT for i in range(14)]
    cluster = Cluster({"spec": [config]})
    for i, body in enumerate(bodies):
        cluster.submit(i, "spec", body, 0.0, 48)
    served: dict[int, Served] = {}
    started: dict[int, float] = {}
    while (at := cluster.next_event()) is not None:
        served.update((s.key, s) for s in cluster.advance())
        started.update((s.key, at) for s in cluster.started)

    fake = FakeTime(0.0)
    engine = Engine(
        Scheduler.for_config(config), time_scale=1.0, clock=fake.clock, sleep=fake.sleep
    )
    chunks: dict[int, list[tuple[float, StepEvent]]] = {i: [] for i in range(len(bodies))}
    seqs = []
    for i, body in enumerate(bodies):
        p = build_profile(body, seed=config.seed, index=i, max_tokens=48, model=config.acceptance)
        hashes = prompt_hashes(body, config.block_size)  # cached as the cluster caches them
        seqs.append(Sequence(p, config.k, sink=partial(heard, fake, chunks[i]), hashes=hashes))
        engine.submit(seqs[-1])
    while not all(got and got[-1][1].finished for got in chunks.values()):
        await asyncio.sleep(0)
    await engine.aclose()

    assert any(seq.prefilled > 0 and seq.steps > 1 for seq in seqs)
    assert any(len(chunks[i]) < seq.steps for i, seq in enumerate(seqs))  # merged somewhere
    for i, seq in enumerate(seqs):
        record, got = served[i], chunks[i]
        assert record.chunks == len(got) and record.steps == seq.steps
        assert record.completion_tokens == sum(e.tokens for _, e in got) == seq.emitted
        assert record.num_spec_steps == seq.tally.num_spec_steps
        assert record.first == pytest.approx(got[0][0])
        assert record.first == pytest.approx(seq.times.first_token)
        assert record.last == pytest.approx(got[-1][0])
        assert started[i] == record.first


async def contents(c: httpx.AsyncClient, body: dict[str, Any]) -> tuple[list[Any], Any]:
    out: list[Any] = []
    async with c.stream("POST", "/v1/chat/completions", json=body) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                out.append(orjson.loads(line[6:]))
    usage = out.pop()
    return [x for x in out[1:] if x["choices"]], usage


@pytest.mark.anyio
async def test_the_server_streams_merged_chunks_when_its_output_path_falls_behind(
    sim_server: Server,
) -> None:
    body = SHORT | {
        "model": "tiny",
        "max_tokens": 41,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    # standard decoding, one token a step of 25.8 ms; 100 ms of processing per output: 4 steps
    step_s = CostModel().decode_step_seconds(batch=1, k=K, speculative=False)
    assert merge_factor(1, step_s, 0.1) == 4
    slow = SimConfig(
        mode=Mode.STANDARD, served_model_names=("tiny",), time_scale=0.01, stream_cost_s=0.1
    )
    async with sim_server(slow) as url, httpx.AsyncClient(base_url=url, timeout=10) as c:
        chunks, usage = await contents(c, body)
    assert usage["usage"]["completion_tokens"] == 41
    assert len(chunks) == 1 + math.ceil(40 / 4)
    idle = SimConfig(served_model_names=("tiny",), time_scale=0.01)
    async with sim_server(idle) as url, httpx.AsyncClient(base_url=url, timeout=10) as c:
        chunks, usage = await contents(c, body)
    spec = usage["metrics"]["speculative_decoding"]
    assert len(chunks) == spec["num_spec_steps"] + 1  # idle at the default cost: no merging
