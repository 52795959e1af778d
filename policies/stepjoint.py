"""How far the step-time doubts of a ladder's pools move together. Pure; time is an argument.

Each pool's curve (``policies/stepcurve.py``) is learned from its own steps under a prior
that the ladder's other pools carry over: one target model, the same parts in tokens, a
speculative pool adding its draft's. So where one pool is seen and another is not (a long
context served only on the speculative pool, say), the second pool's part for it is the
first's carried over, and both curves miss by the same factor. The judge compares two pools'
costs by the ratio of their steps (``policies/economics.py``), whose doubt is the two doubts
less twice what they share: counted as independent, a slice at a context no pool has
observed closely could never be judged, however many of its requests agree.

What they share comes from the same structure taken jointly: the parts of a standard pool
of the target (``phi``, under the generic prior, ``prior_curve``) and, for each pool, its
parts as ``phi`` carried over (``pool_factors``) times a factor common to them all
(``COMMON_SD``) and one for each (``TRANSFER_SD``). Given every pool's observations (the
same weighted sums its curve is fitted from, at the ladder's knee), the posterior of all
pools' parts together is one Gaussian; its cross-covariance at two steps, over the two
variances there, is their correlation. The judge scales each pool's own doubt by it
(``Joint.rho``), so the curves themselves, and each pool's doubt alone, are as before.

Worked in parts relative to their prior means (every part of the order of one), so the
system is well scaled however many orders of magnitude the parts span.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from policies.linalg import Mat, Vec, dot, inverse
from policies.stepcurve import (
    COMMON_SD,
    TRANSFER_SD,
    Curve,
    CurveFit,
    N,
    pool_factors,
    prior_curve,
    regressors,
)
from policies.steptime import NOISE_SD

TINY = 1e-12


@dataclass(frozen=True, slots=True)
class Joint:
    """The joint posterior covariance of a ladder's pools' parts (relative to ``scales``, a
    pool's parts' prior means), at ``knee``."""

    knee: float
    scales: tuple[Vec, ...]
    cov: Mat

    def rho(self, i: int, step_i: Vec, j: int, step_j: Vec) -> float:
        """The correlation of pool ``i``'s step ``step_i`` and pool ``j``'s ``step_j``
        (``(tokens, prefill, kv, seqs)`` each), in [0, 1]: a negative one would only add
        doubt the marginal doubts already hold."""
        if i == j:
            return 1.0
        x, y = self._relative(i, step_i), self._relative(j, step_j)
        cross = self._form(i, x, j, y)
        var_i, var_j = self._form(i, x, i, x), self._form(j, y, j, y)
        if var_i <= 0 or var_j <= 0:
            return 0.0
        return min(max(cross / math.sqrt(var_i * var_j), 0.0), 1.0)

    def _relative(self, i: int, step: Vec) -> Vec:
        tokens, prefill, kv, seqs = step
        x = regressors(tokens, prefill, kv, self.knee, seqs)
        return tuple(v * s for v, s in zip(x, self.scales[i], strict=True))

    def _form(self, i: int, x: Vec, j: int, y: Vec) -> float:
        rows = self.cov[i * N : (i + 1) * N]
        return dot(x, [dot(row[j * N : (j + 1) * N], y) for row in rows])


def joint(
    fits: Sequence[CurveFit | None],
    curves: Sequence[Curve | None],
    ks: Sequence[int | None],
    draft_cost: float,
    now: float,
) -> Joint | None:
    """The joint posterior of the ladder's pools at the knee of ``curves`` (the ladder's
    fitted curves, whose means scale the parts); None when no pool has a curve."""
    known = [(i, c) for i, c in enumerate(curves) if c is not None]
    if not known:
        return None
    knee = known[0][1].knee
    phi = _standard_means(known, ks, draft_cost)
    scales = tuple(
        tuple(max(m * f, TINY) for m, f in zip(phi, pool_factors(k, draft_cost), strict=True))
        for k in ks
    )
    shared = _relative_prior(knee, phi)
    n = len(ks)
    prior = [[0.0] * (N * n) for _ in range(N * n)]
    for a in range(n):
        for b in range(n):
            for p in range(N):
                for q in range(N):
                    own = COMMON_SD**2 + (TRANSFER_SD**2 if p == q else 0.0)
                    prior[a * N + p][b * N + q] = shared[p][q] + (own if a == b else 0.0)
    lam = [list(row) for row in inverse(prior)]
    for a, fit in enumerate(fits):
        _add_observations(lam, a, fit, knee, scales[a], now)
    return Joint(knee, scales, inverse(lam))


def _standard_means(
    known: Sequence[tuple[int, Curve]], ks: Sequence[int | None], draft_cost: float
) -> Vec:
    """A standard pool's parts as the best-observed curve says, carried back."""
    i, curve = max(known, key=lambda item: (item[1].observations, -item[0]))
    factors = pool_factors(ks[i], draft_cost)
    return tuple(max(m / f, TINY) for m, f in zip(curve.mean, factors, strict=True))


def _relative_prior(knee: float, phi: Vec) -> Mat:
    """The generic prior's covariance in parts relative to ``phi``."""
    cov = prior_curve(knee, phi, None).cov
    return tuple(tuple(cov[p][q] / (phi[p] * phi[q]) for q in range(N)) for p in range(N))


def _add_observations(
    lam: list[list[float]], a: int, fit: CurveFit | None, knee: float, scale: Vec, now: float
) -> None:
    """Pool ``a``'s observations' precision, in relative parts, added to ``lam``."""
    if fit is None or knee not in fit.knees or fit.weight(now) <= 0:
        return
    xx, _, _ = fit.sums(fit.knees.index(knee), now)
    noise = NOISE_SD**2
    for p in range(N):
        for q in range(N):
            lam[a * N + p][a * N + q] += xx[p][q] * scale[p] * scale[q] / noise
