"""``ladder`` stops scoring a knee once it cannot win and keeps the chosen knee's fits: its
curves are exactly those of fitting every pool at every knee, for knees with and without
support in the data, one pool or several, pools without observations among them."""

from __future__ import annotations

import math
import random

import pytest

from policies.stepcurve import (
    KNEE_SD,
    RIDGE_TOKENS,
    Curve,
    CurveFit,
    combine,
    ladder,
    transfer,
)
from policies.steptime import MIN_OBSERVATIONS, NOISE_SD

DRAFT_COST = 0.1


def every_knee(
    fits: list[CurveFit | None], ks: tuple[int | None, ...], now: float
) -> list[Curve | None]:
    """The ladder's definition, every pool fitted at every knee."""
    knees = next(f.knees for f in fits if f is not None)
    learned = [(i, f) for i, f in enumerate(fits) if f is not None]
    learned = [(i, f) for i, f in learned if f.weight(now) >= MIN_OBSERVATIONS]
    best: tuple[float, int] | None = None
    for j, knee in enumerate(knees):
        score = (math.log(knee / RIDGE_TOKENS) / KNEE_SD) ** 2
        scored = False
        for _, fit in learned:
            prior = fit.generic(j, now, DRAFT_COST)
            if prior is not None:
                scored = True
                score += fit.fitted(j, now, prior, cov=False)[1] / NOISE_SD**2
        if scored and (best is None or score < best[0]):
            best = (score, j)
    if best is None:
        return [None] * len(fits)
    j = best[1]
    own = {}
    for i, fit in learned:
        prior = fit.generic(j, now, DRAFT_COST)
        if prior is not None:
            own[i] = fit.fitted(j, now, prior)[0]
    out: list[Curve | None] = []
    for i, fit in enumerate(fits):
        carried = combine(transfer(c, ks[i], DRAFT_COST) for m, c in own.items() if m != i)
        if fit is None or fit.weight(now) <= 0:
            out.append(carried)
            continue
        prior = carried if carried is not None else fit.generic(j, now, DRAFT_COST)
        out.append(None if prior is None else fit.fitted(j, now, prior)[0])
    return out


def step_s(tokens: float, kv: float, knee: float) -> float:
    return 0.02 + 1e-4 * tokens + 4e-4 * max(tokens - knee, 0.0) + 1.2e-7 * kv


@pytest.mark.parametrize("ks", [(4, None), (7, 3, None), (None, 4)])
@pytest.mark.parametrize("knee", [math.inf, 150.0, 600.0])
def test_the_pruned_ladder_is_the_ladder_of_every_knee(
    ks: tuple[int | None, ...], knee: float
) -> None:
    rng = random.Random(f"{ks}{knee}")
    fits: list[CurveFit | None] = [CurveFit(k=k) for k in ks]
    fits[-1] = None if len(ks) == 3 else fits[-1]  # a pool never observed
    now = 0.0
    for _ in range(60):
        now += rng.expovariate(1.0)
        for fit, k in zip(fits, ks, strict=True):
            if fit is None or rng.random() < 0.4:
                continue
            batch = rng.choice([1, 2, 4, 8, 16, 32, 64, 128])
            tokens, kv = batch * ((k or 0) + 1), batch * rng.choice([500.0, 20000.0])
            seconds = step_s(tokens, kv, knee) * rng.lognormvariate(0.0, 0.05)
            fit.add(now, seconds, tokens=tokens, seqs=batch, kv=kv, prefill=rng.choice([0, 300]))
        asked = now + rng.random()
        assert ladder(fits, ks, DRAFT_COST, asked) == every_knee(fits, ks, asked)
