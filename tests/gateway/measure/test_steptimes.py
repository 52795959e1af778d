"""Exploration's budget: per pool, split over the slices above it, only while needed."""

from __future__ import annotations

import pytest

from gateway.measure.steptimes import EXPLORE_PER_MINUTE, NEED_FRESH_S, StepTimes

BUDGET = EXPLORE_PER_MINUTE / 60.0


def test_nothing_is_explored_until_some_judgement_hinges_on_the_pool():
    steps = StepTimes()
    assert steps.explore_share("standard", "busy", 10.0, False, 0.05, 0.0) == 0.0
    # a quiet slice needs the pool: the busy slice above it gives most of the observations
    quiet = steps.explore_share("standard", "quiet", 0.05, True, 0.05, 1.0)
    busy = steps.explore_share("standard", "busy", 10.0, False, 0.05, 2.0)
    assert busy == pytest.approx(BUDGET / 10.05, abs=0.001)
    assert quiet == pytest.approx(busy, abs=0.001)  # one share for all, the pool's budget
    # the cap: never more than the slice's own probe_fraction
    alone = StepTimes()
    assert alone.explore_share("standard", "quiet", 0.05, True, 0.05, 0.0) == 0.05
    # the need lapses when no slice has said so for NEED_FRESH_S
    assert steps.explore_share("standard", "busy", 10.0, False, 0.05, 3.0 + NEED_FRESH_S) == 0.0


def _served(pool: str, k: int | None, batch: float, context: int, seconds: float):
    from gateway.measure.acceptance import Labels, Outcome, Signal, Status

    labels = Labels(model="m", rule="r", slice="s", pool=pool, k=k, endpoint=f"http://{pool}")
    steps = 100
    return Outcome(
        labels=labels,
        status=Status.OK,
        started_at=0.0,
        duration_s=seconds * steps + 0.1,
        ttft_s=0.1,
        tpot_s=seconds,
        prompt_tokens=context,
        completion_tokens=2,
        chunks=steps + 1,
        signal=Signal.PER_REQUEST,
        steps=steps,
        decode_s=seconds * steps,
        load=batch,
        kv=batch * context,
        batch=batch,
    )


def test_a_slice_is_judged_at_its_own_context():
    """One pool's steps at short and long contexts (the 32B curve's cache read, 8.9e-8 s a
    token): a slice of long prompts is judged on the long step, a short one on the short
    step, at the same batch; an unnamed context is the pools' mean."""
    from backends.sim.model import GPU_32B
    from policies.compiled import load_policy

    policy = load_policy(
        "version: 1\n"
        "pools:\n"
        "  spec: {kind: speculative, model: m, num_speculative_tokens: 4,"
        " endpoints: ['http://spec']}\n"
        "  std: {kind: standard, model: m, endpoints: ['http://std']}\n"
        "ladder: [spec, std]\n"
        "rules: [{name: all, start: spec}]\n"
    )
    ladder = policy.ladders["m"]
    steps = StepTimes()
    now = 0.0
    for batch in (2, 4, 8, 16, 32):
        for context in (300, 12000):
            for pool, k in (("spec", 4), ("std", None)):
                now += 0.1
                seconds = GPU_32B.decode_step_seconds(
                    batch=batch, k=k or 0, speculative=k is not None, context=context
                )
                steps.learn(_served(pool, k, batch, context, seconds), now)
    for context in (300, 12000):
        for i, (k, speculative) in enumerate(((4, True), (0, False))):
            got = steps.at(ladder, i, 16.0, 0.1, now, context)
            assert got is not None
            want = GPU_32B.decode_step_seconds(
                batch=16, k=k, speculative=speculative, context=context
            )
            assert got.seconds == pytest.approx(want, rel=0.1)
    long_, short = steps.at(ladder, 1, 16, 0.1, now, 12000), steps.at(ladder, 1, 16, 0.1, now, 300)
    assert long_ is not None and short is not None and long_.seconds > 1.3 * short.seconds
