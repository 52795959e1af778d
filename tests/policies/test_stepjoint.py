"""The doubt two pools' step times share (``policies/stepjoint.py``): where both curves are
extrapolated along the same part (a context neither pool has been seen at), the judge's
doubt of their ratio is smaller than the two doubts added, and still covers the ratio's
real error; where one pool is well seen, little is shared."""

from __future__ import annotations

import math
import random

from policies.economics import Rung, Tally, judge
from policies.stepcurve import CurveFit, ladder, pool_factors, regressors
from policies.stepjoint import joint
from policies.steptime import StepTime

DRAFT_COST = 0.1
KS = (4, None)
TRUE = (0.02, 1e-4, 5e-5, 5e-5, 1.5e-7, 2e-4)  # a standard pool's parts (stepcurve's order)
KNEE = 200.0


def true_step(k: int | None, point: tuple[float, float, float, float]) -> float:
    tokens, prefill, kv, seqs = point
    x = regressors(tokens, prefill, kv, KNEE, seqs)
    return sum(t * f * v for t, f, v in zip(TRUE, pool_factors(k, DRAFT_COST), x, strict=True))


def point(k: int | None, batch: float, context: float) -> tuple[float, float, float, float]:
    return (batch * ((k or 0) + 1), 0.0, batch * context, batch)


def observed(seed: int, contexts: tuple[float, float]) -> tuple[list[CurveFit | None], float]:
    """A speculative pool serving batches 8-24 at mean contexts in ``contexts``, and short
    requests mirrored to a standard pool now and then, each step 10% noisy."""
    rng = random.Random(seed)
    fits: list[CurveFit | None] = [CurveFit(k=k) for k in KS]
    now = 0.0
    for _ in range(120):
        now += 0.5
        spec = point(4, rng.uniform(8, 24), rng.uniform(*contexts))
        seconds = true_step(4, spec) * math.exp(rng.gauss(0, 0.1))
        fits[0].add(now, seconds, tokens=spec[0], seqs=spec[3], kv=spec[2])  # type: ignore[union-attr]
        if rng.random() < 0.1:
            short = point(None, rng.uniform(1, 3), rng.uniform(300, 800))
            seconds = true_step(None, short) * math.exp(rng.gauss(0, 0.1))
            fits[1].add(now, seconds, tokens=short[0], seqs=short[3], kv=short[2])  # type: ignore[union-attr]
    return fits, now


def ratio_doubts(seed: int, contexts: tuple[float, float]) -> tuple[float, float, float, float]:
    """At batch 16 and a 10k context: the log ratio's error, the two doubts added, the doubt
    less what they share, and the correlation."""
    fits, now = observed(seed, contexts)
    curves = ladder(fits, KS, DRAFT_COST, now)
    found = joint(fits, curves, KS, DRAFT_COST, now)
    assert found is not None and curves[0] is not None and curves[1] is not None
    up, down = point(4, 16, 10_000), point(None, 16, 10_000)
    s, d = curves[0].at(16, 10_000), curves[1].at(16, 10_000)
    error = math.log(s.seconds / d.seconds) - math.log(true_step(4, up) / true_step(None, down))
    rho = found.rho(0, up, 1, down)
    added = s.log_var + d.log_var
    return error, added, added - 2 * rho * math.sqrt(s.log_var * d.log_var), rho


def test_curves_extrapolated_alike_share_their_doubt_and_it_still_covers_the_error() -> None:
    rows = [ratio_doubts(seed, (2000, 4500)) for seed in range(30)]
    mse = sum(r[0] ** 2 for r in rows) / len(rows)
    added = sum(r[1] for r in rows) / len(rows)
    shared = sum(r[2] for r in rows) / len(rows)
    assert min(r[3] for r in rows) > 0.3
    assert shared < 0.75 * added
    assert mse < shared  # still a cautious doubt: the judge moves on evidence, not on this


def test_a_pool_seen_at_every_context_shares_little() -> None:
    rows = [ratio_doubts(seed, (300, 12_000)) for seed in range(10)]
    assert max(r[3] for r in rows) < 0.5
    assert all(r[2] > 0.8 * r[1] for r in rows)


def test_correlation_is_symmetric_and_bounded() -> None:
    fits, now = observed(7, (2000, 4500))
    curves = ladder(fits, KS, DRAFT_COST, now)
    found = joint(fits, curves, KS, DRAFT_COST, now)
    assert found is not None
    up, down = point(4, 16, 10_000), point(None, 4, 500)
    assert found.rho(0, up, 1, down) == found.rho(1, down, 0, up)
    assert 0.0 <= found.rho(0, up, 1, down) <= 1.0
    assert found.rho(0, up, 0, up) == 1.0


def test_no_curve_no_joint() -> None:
    assert joint([None, CurveFit(k=None)], [None, None], KS, DRAFT_COST, 0.0) is None


def test_the_judge_takes_the_shared_doubt_out_of_the_ratio() -> None:
    step_up, step_down = StepTime(0.060, 0.008, 100.0), StepTime(0.038, 0.006, 20.0)
    tally = Tally(n=60, tokens=60 * 300.0, steps=60 * 245.0)
    tally = Tally(
        tally.n, tally.tokens, tally.steps, 60 * 300.0**2, 60 * 245.0**2, 60 * 300.0 * 245.0
    )
    spec = Rung("spec", 4, 1.0, step_up, (tally,))
    standard = Rung("standard", None, 1.0, step_down)
    alone = judge(spec, standard, min_samples=3, confidence=0.999)
    assert alone is not None and alone.verdict == 0
    cov = 0.7 * math.sqrt(step_up.log_var * step_down.log_var)
    shared = judge(
        Rung("spec", 4, 1.0, step_up, (tally,), shared=(("standard", cov),)),
        standard,
        min_samples=3,
        confidence=0.999,
    )
    assert shared is not None and shared.verdict == -1
    assert shared.log_var == alone.log_var - 2 * cov
