"""A pool's step time as a line in its batch: fitted online, doubted where it has no data
(far from its batches, or long ago), and carried over from the other pools of its ladder."""

from __future__ import annotations

import random

import pytest

from policies.steptime import Line, StepFit, combine, transfer


def ab_line(a: float, b: float, vaa: float, vab: float, vbb: float) -> Line:
    """A belief about a and b alone: no prefill part."""
    return Line(a, b, 0.0, ((vaa, vab, 0.0), (vab, vbb, 0.0), (0.0, 0.0, 0.0)))


SPEC_K = 4


def sim_step(batch: float, k: int | None) -> float:
    """The simulator's CostModel for one decode step (no prefill)."""
    if k is None:
        return 0.025 + 0.0008 * batch
    return 0.025 + 0.0008 * batch * (k + 1) + k * (0.0027 + 0.00005 * batch)


def fed(k: int | None, batches: list[float], noise: float = 0.05, t0: float = 0.0) -> StepFit:
    fit = StepFit(tokens_per_seq=(k or 0) + 1)
    rng = random.Random(len(batches))
    for i, batch in enumerate(batches):
        fit.add(t0 + i * 0.1, batch, sim_step(batch, k) * (1 + rng.gauss(0, noise)))
    return fit


def test_the_line_is_recovered_and_doubted_far_from_its_batches():
    rng = random.Random(1)
    fit = fed(None, [rng.uniform(2, 12) for _ in range(400)], noise=0.02)
    line = fit.line(40.0)
    assert line is not None
    assert line.a == pytest.approx(0.025, rel=0.05) and line.b == pytest.approx(0.0008, rel=0.1)
    near, far = fit.predict(40.0, 6), fit.predict(40.0, 60)
    assert near is not None and far is not None
    assert far.seconds == pytest.approx(sim_step(60, None), rel=0.05)
    assert far.log_var > 10 * near.log_var
    assert StepFit().predict(0.0, 4) is None


def test_high_batches_do_not_bend_the_low_end():
    # seen at batch 2 before a surge and at 60 during it: an affine fit still says batch 2
    fit = fed(SPEC_K, [2.0] * 100 + [60.0] * 400, noise=0.03)
    low = fit.predict(50.0, 1.85)
    assert low is not None and low.seconds == pytest.approx(sim_step(1.85, SPEC_K), rel=0.05)


def test_a_pool_that_is_no_longer_fed_grows_uncertain():
    fit = fed(None, [1.0] * 20)
    fresh = fit.predict(2.0, 4)
    stale = fit.predict(2.0 + 1200, 4)  # four half-lives later, nothing new
    assert fresh is not None and fresh.learned
    assert stale is None  # its own observations weigh under the minimum now
    prior = transfer(ab_line(0.036, 0.0042, 1e-8, 0.0, 1e-10), SPEC_K, None, 0.1)
    with_prior_fresh, with_prior_stale = fit.predict(2.0, 4, prior), fit.predict(1202, 4, prior)
    assert with_prior_fresh is not None and with_prior_stale is not None
    assert not with_prior_stale.learned
    assert with_prior_stale.log_var > 3 * with_prior_fresh.log_var


def test_a_standard_pool_seen_only_at_batch_one_takes_its_slope_from_the_speculative_pool():
    spec = fed(SPEC_K, [random.Random(i).uniform(2, 60) for i in range(300)], noise=0.05)
    standard = fed(None, [1.0] * 4)
    spec_line = spec.line(30.0)
    assert spec_line is not None
    prior = transfer(spec_line, SPEC_K, None, 0.1)
    at_31 = standard.predict(30.0, 31, prior)
    assert at_31 is not None
    assert at_31.seconds == pytest.approx(sim_step(31, None), rel=0.1)  # not ~26 ms
    alone = standard.predict(30.0, 31)  # the generic prior knows less
    assert alone is not None and alone.log_var > at_31.log_var
    # the standard pool's own data at many batches overrule a prior that is off by 2x
    wrong = Line(prior.a, prior.b * 2, prior.c, prior.cov)
    wide = fed(None, [random.Random(i).uniform(1, 60) for i in range(400)], noise=0.05)
    corrected = wide.predict(40.0, 31, wrong)
    assert corrected is not None
    assert corrected.seconds == pytest.approx(sim_step(31, None), rel=0.05)


def test_transfer_scales_the_fixed_part_by_passes_and_the_slope_by_verified_tokens():
    standard = Line(0.025, 0.0008)
    spec = transfer(standard, None, SPEC_K, 0.108)
    assert spec.a == pytest.approx(0.025 * (1 + 4 * 0.108))
    assert spec.b == pytest.approx(0.0008 * 5)
    assert spec.cov[0][1] > 0  # one common factor: knowing one part says something of the other
    back = transfer(spec, SPEC_K, 3, 0.108)
    assert back.b == pytest.approx(0.0008 * 4)


def test_parts_stay_non_negative_and_priors_combine_by_precision():
    fit = StepFit()
    for i in range(50):  # steps that get cheaper with the batch: noise, not physics
        fit.add(i, 1 + i % 10, 0.03 - 0.0005 * (i % 10))
    line = fit.line(50.0)
    assert line is not None and line.b >= 0 and line.a > 0
    sure = ab_line(0.03, 0.001, 1e-8, 0.0, 1e-10)
    vague = ab_line(0.05, 0.003, 1e-4, 0.0, 1e-6)
    both = combine([sure, vague])
    assert both is not None and both.a == pytest.approx(0.03, rel=0.01)
    assert combine([]) is None


def sim_step_with_prefill(batch: float, prefill: float, k: int | None) -> float:
    """The simulator's CostModel for a step that also prefills ``prefill`` prompt tokens."""
    return sim_step(batch, k) + 0.00015 * prefill


def test_prefills_sharing_the_steps_are_told_apart_from_the_decode_step():
    # a standard pool that carries long prompts: the more of them share a request's steps,
    # the longer its steps; more of them come with more load (a surge)
    rng = random.Random(7)
    fit = StepFit()
    naive = StepFit()
    for i in range(600):
        batch = rng.uniform(2, 30)
        prefill = max(rng.gauss(8 * batch, 40), 0.0)  # prompt tokens per step beside it
        seconds = sim_step_with_prefill(batch, prefill, None) * (1 + rng.gauss(0, 0.03))
        fit.add(i * 0.2, batch, seconds, prefill=prefill)
        naive.add(i * 0.2, batch, seconds)
    line, blind = fit.line(120.0), naive.line(120.0)
    assert line is not None and blind is not None
    assert line.b == pytest.approx(0.0008, rel=0.15)
    assert line.c == pytest.approx(0.00015, rel=0.15)
    decode = line.at(25)  # what a sequence pays to decode at batch 25
    assert decode.seconds == pytest.approx(sim_step(25, None), rel=0.05)
    # a fit blind to the prefills reads their cost as a per-sequence cost: twice the slope
    assert blind.b > 2 * 0.0008


def test_a_prefill_part_the_data_cannot_tell_stays_near_its_prior():
    # every observation carries the same prefill: the fit cannot tell it from the fixed part,
    # and the decode step it reports is the observed step less what the prior says of it
    fit = StepFit()
    for i in range(300):
        batch = 2 + i % 20
        fit.add(i * 0.1, batch, sim_step_with_prefill(batch, 50.0, None), prefill=50.0)
    line = fit.line(30.0)
    assert line is not None
    observed = sim_step_with_prefill(10, 50.0, None)
    assert line.at(10, 50.0).seconds == pytest.approx(observed, rel=0.02)
    assert sim_step(10, None) * 0.9 < line.at(10).seconds <= observed
