"""A pool's engine step time as a function of what the step computes, learned online: the
tokens it verifies, the KV-cache tokens it reads and the prompt tokens prefilled beside
them, with a knee. Pure; time is an argument.

An engine step reads the weights once (a floor), then each verified token adds a little
while the step is memory-bound and more once its tokens pass a knee and compute dominates,
attention reads every running sequence's cache, and prompt tokens chunked into the step add
their own part::

    seconds = a + b * V + c * P + d * KV + e * max(0, V - knee)

``V`` = tokens verified in the step (batch * (k + 1) on a speculative pool of k draft
tokens, the batch on a standard one), ``P`` = prompt tokens prefilled in it, ``KV`` = cached
tokens read (batch * context). Measured on one H200 (``bench/gpu/results/h200-8b-32b/``),
that shape holds for an 8B and a 32B target alike; a line in the batch alone misses by
10-18%, and judges a long-context slice on a step learned from short requests.

A slice is judged at its own context and the batch it would join (``Curve.at``): ``batch``
sequences of ``context`` cached tokens each, no prefill (a decode step).

Priors, physical, not fitted to any table (each checked against both measured shapes in
``tests/policies/test_stepcurve_measured.py``, fitted on one and checked on the other):

- the knee is the accelerator's ridge point, where a token's compute on the weights takes
  as long as reading them: peak FLOP/s over memory bandwidth, in tokens (bf16: 2 FLOP and 2
  bytes a parameter), whatever the model's size: ~200 tokens on an H200 (989 TFLOP/s, 4.8
  TB/s), ~300 on an H100 (``RIDGE_TOKENS``, within a factor ``KNEE_SD`` in log);
- past the knee a token costs the floor over the knee (compute at the ridge), so ``e`` is
  ``a / knee - b``;
- below it a token costs a fraction of that (``LOW_SHARE``: the H200's 8B and 32B targets
  show 0.46-0.54);
- a cached token's read costs ``KV_SHARE`` of the floor: KV bytes per token over weight
  bytes (Llama-3-8B 8.2e-6, a 32B 4.0e-6);
- a prompt token prefilled beside costs what a verified one does below the knee.

Between pools of one ladder the prior is structural (``transfer``): one target model, the
same curve in tokens; a speculative pool adds k draft passes, each ``draft_cost`` of the
target's fixed, per-sequence and KV parts (a draft model reads its own weights and cache),
and the draft prefills each prompt once. So a standard pool seen at batch 8 says what a
k=4 pool costs at batch 8 (40 tokens, nearly free while memory-bound), which a per-sequence
slope scaled by k + 1 does not. The knee is the ladder's, chosen jointly (``ladder``).

The observations' noise is estimated from how far they lie from a curve the prior hardly
holds (its deviations ``WIDER`` times as wide), then the curve is fitted under the prior
itself with that noise. Estimated from the residuals of the fit under the prior, the
prior's own error would read as noise, and the steps would weigh least exactly where they
contradict it: on the affine simulator, whose token costs 13 times the prior's, a pool's
step at a surge's batch was learned 15-30% low for over a minute after the surge began
(``bench/RESULTS.md``, "A prior the steps contradict", under "Decision quality on three
cost models").

Observations are kept as running sums weighted by ``1 / seconds^2`` (relative noise), less
where prefill beside them blurs what the decode step cost (``prefill_weight``), that
decay with a half-life, at a fixed set of candidate knees: O(len(KNEES)) per observation.
At question time each knee's posterior is fitted, and the knee with the best evidence
(residuals in units of ``NOISE_SD``, plus its prior's log) is chosen: a knee no data shows
stays at the ridge (equal evidence: the lower knee). The knees are fitted likeliest first
(by their prior), every term of a knee's evidence is >= 0, so a knee stops being fitted as
soon as its sum cannot beat the best so far, and the chosen knee's fits are kept, not fitted
again: the curves are those of fitting every pool at every knee, in fewer fits. A knee whose
evidence is not a number (only from sums that overflowed) is never chosen.

Explained for operators in docs/guardrail.md ("The economic guardrail") and
docs/measuring.md ("Windows and step times").
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from policies.decaying import Decaying
from policies.linalg import Mat, Vec, apply, diagonal, dot, inverse, non_negative, precision, solve
from policies.steptime import MIN_OBSERVATIONS, NOISE_SD, NOISE_WEIGHT, StepTime

RIDGE_TOKENS = 200.0
KNEE_SD = 0.7
KNEES = (32.0, 64.0, 96.0, 128.0, 192.0, 256.0, 384.0, 512.0, 768.0, 1024.0)
LOW_SHARE = 0.5
KV_SHARE = 6e-6
KV_MIN_SEQS = 16.0
SEQ_SHARE = 1.0 / 150.0
GENERIC_SD = 1.0  # the generic prior: each part within a factor of e
SLOPE_SD = 0.5  # the slope past the knee: compute at the ridge, within ~1.6x
TRANSFER_SD = 0.15  # another pool's part, through the structural relation
COMMON_SD = 0.5  # another pool of the model on other hardware: all parts together
N = 6  # a, s, b, c, d, e
WIDER = 5.0  # the prior's deviations, loosened, where the noise is estimated

Sums = tuple[Mat, Vec, float]  # a knee's weighted sums: xx, xy and yy


def regressors(tokens: float, prefill: float, kv: float, knee: float, seqs: float) -> Vec:
    """The step's regressors at ``knee``: (1, S, V, P, KV', max(0, V - knee)), the cache
    read ``KV'`` at the rate of at least ``KV_MIN_SEQS`` sequences."""
    v, seqs = max(tokens, 1.0), max(seqs, 1.0)
    kv = max(kv, 0.0) * max(1.0, KV_MIN_SEQS / seqs)
    return (1.0, seqs, v, max(prefill, 0.0), kv, max(v - knee, 0.0))


def shares(knee: float) -> Vec:
    """Each part of the generic prior per unit of the floor ``a``."""
    low = LOW_SHARE / RIDGE_TOKENS
    return (1.0, SEQ_SHARE, low, low, KV_SHARE, max(1.0 / knee - low, 0.0))


def prefill_weight(tokens: float, prefill: float) -> float:
    """The weight of an observed step with ``prefill`` prompt tokens per step beside
    ``tokens`` verified ones, relative to a pure decode step's. A request's prefill is
    attributed to the steps decoding when its prompt's prefill ended, not to the steps it ran
    in (the chunks of a long prompt run over several steps before that moment), and a chunk
    takes its step past the knee, so the prefill part of an observed step is known only to
    about its own size: its share of the step (a prompt token at the compute rate,
    ``1 / RIDGE_TOKENS`` of the floor, as a chunk of a long prompt costs) adds its square to
    the observation's relative variance, ``NOISE_SD`` squared. Left at full weight, steps
    mostly prefill would put that doubt on the part they are correlated with: the cache read
    (a prompt still prefilling is not yet cached), learned low, so a long-context slice would
    look cheaper on the pool that carries prefill beside it."""
    p = max(prefill, 0.0) / RIDGE_TOKENS
    share = p / (1.0 + LOW_SHARE * max(tokens, 0.0) / RIDGE_TOKENS + p)
    return NOISE_SD**2 / (NOISE_SD**2 + share * share)


def pool_factors(k: int | None, draft_cost: float) -> Vec:
    """A pool's parts relative to a standard pool of its target (module docstring)."""
    k = k or 0
    r = draft_cost
    return (1.0 + k * r, 1.0 + k * r, 1.0, 1.0 + r * (k > 0), 1.0 + k * r, 1.0)


@dataclass(frozen=True, slots=True)
class Curve:
    """A belief about one pool's step (the means of a..e at ``knee``, their covariance) and
    the weight of the pool's own (decayed) observations in it."""

    knee: float
    mean: Vec
    cov: Mat
    observations: float = 0.0
    k: int | None = None

    def seconds(self, tokens: float, prefill: float, kv: float, seqs: float) -> StepTime:
        x = regressors(tokens, prefill, kv, self.knee, seqs)
        seconds = max(dot(self.mean, x), 1e-9)
        var = max(dot(x, apply(self.cov, x)), 0.0)
        learned = self.observations >= MIN_OBSERVATIONS
        return StepTime(seconds, var / (seconds * seconds), self.observations, learned)

    def at(self, batch: float, context: float = 0.0, prefill: float = 0.0) -> StepTime:
        """A step of ``batch`` sequences of ``context`` cached tokens each on this pool."""
        return self.seconds(*decode_step(batch, context, self.k, prefill))


def decode_step(
    batch: float, context: float, k: int | None, prefill: float = 0.0
) -> tuple[float, float, float, float]:
    """What a step of ``batch`` sequences of ``context`` cached tokens each computes on a
    pool of ``k`` draft tokens: (tokens verified, prompt tokens beside, cached tokens read,
    sequences), as ``Curve.seconds`` takes them."""
    b = max(batch, 1.0)
    return b * ((k or 0) + 1), prefill, b * max(context, 0.0), b


@dataclass(slots=True)
class CurveFit(Decaying):
    """Decaying weighted sums of one pool's observations at each candidate knee."""

    k: int | None = None
    knees: tuple[float, ...] = KNEES
    xx: list[list[float]] = field(default_factory=list)
    xy: list[list[float]] = field(default_factory=list)
    above: list[float] = field(default_factory=list)
    yy: float = 0.0
    context_sum: float = 0.0

    def __post_init__(self) -> None:
        self.xx = [[0.0] * (N * N) for _ in self.knees]
        self.xy = [[0.0] * N for _ in self.knees]
        self.above = [0.0] * len(self.knees)

    def add(
        self,
        now: float,
        seconds: float,
        *,
        tokens: float,
        seqs: float,
        kv: float = 0.0,
        prefill: float = 0.0,
        weight: float = 1.0,
    ) -> None:
        """One step observed: ``seconds`` for ``tokens`` verified over ``seqs`` sequences,
        ``kv`` cached tokens read and ``prefill`` prompt tokens beside them."""
        if seconds <= 0 or weight <= 0 or not math.isfinite(seconds):
            return
        self._decay(now)
        omega = weight / (seconds * seconds)
        self.w += weight
        self.yy += omega * seconds * seconds
        for j, knee in enumerate(self.knees):
            x = regressors(tokens, prefill, kv, knee, seqs)
            sums, products = self.xx[j], self.xy[j]
            for i in range(N):
                products[i] += omega * x[i] * seconds
                for m in range(N):
                    sums[i * N + m] += omega * x[i] * x[m]
            if x[5] > 0:
                self.above[j] += weight

    def _scale(self, f: float) -> None:
        self.yy *= f
        for sums in (*self.xx, *self.xy, self.above):
            sums[:] = [v * f for v in sums]

    def sums(self, j: int, now: float) -> Sums:
        f = self._factor(now)
        flat = [v * f for v in self.xx[j]]
        xx = tuple(tuple(flat[i * N : (i + 1) * N]) for i in range(N))
        return xx, tuple(v * f for v in self.xy[j]), self.yy * f

    def generic(self, j: int, now: float, draft_cost: float) -> Curve | None:
        """The loose physical prior through the data's mean at knee ``j``."""
        return self._generic(j, self.sums(j, now), draft_cost)

    def _generic(self, j: int, sums: Sums, draft_cost: float) -> Curve | None:
        xx, xy, _ = sums
        if xx[0][0] <= 0:
            return None
        factors = pool_factors(self.k, draft_cost)
        unit = tuple(s * f for s, f in zip(shares(self.knees[j]), factors, strict=True))
        scale = dot(unit, xx[0]) / xx[0][0]
        a = (xy[0] / xx[0][0]) / max(scale, 1e-12)
        return prior_curve(self.knees[j], tuple(a * u for u in unit), self.k)

    def fitted(self, j: int, now: float, prior: Curve, *, cov: bool = True) -> tuple[Curve, float]:
        """The posterior at knee ``j`` under ``prior``, and its weighted residuals (without
        ``cov``, the posterior's covariance is left out: a knee scored, not chosen yet)."""
        xx, xy, yy = self.sums(j, now)
        return _fit(prior, self.weight(now), xx, xy, yy, cov)


def prior_curve(knee: float, mean: Vec, k: int | None) -> Curve:
    sds = (GENERIC_SD,) * 5 + (SLOPE_SD,)
    variances = [(sd * max(m, 1e-12)) ** 2 for sd, m in zip(sds, mean, strict=True)]
    variances[5] += (GENERIC_SD * mean[2]) ** 2  # e = a / knee - b: b's doubt is e's too
    return Curve(knee, mean, diagonal(variances), 0.0, k)


def transfer(source: Curve, k_to: int | None, draft_cost: float) -> Curve:
    """What ``source`` says about a pool of the same model with ``k_to`` draft tokens (the
    parts scaled by ``pool_factors``), on top of its own doubt a factor common to every part
    (``COMMON_SD``) and ``TRANSFER_SD`` for each alone."""
    f_from, f_to = pool_factors(source.k, draft_cost), pool_factors(k_to, draft_cost)
    f = tuple(t / s for t, s in zip(f_to, f_from, strict=True))
    mean = tuple(m * g for m, g in zip(source.mean, f, strict=True))
    cov = tuple(
        tuple(
            source.cov[i][j] * f[i] * f[j]
            + COMMON_SD**2 * mean[i] * mean[j]
            + (TRANSFER_SD**2 * mean[i] ** 2 if i == j else 0.0)
            for j in range(N)
        )
        for i in range(N)
    )
    return Curve(source.knee, mean, cov, 0.0, k_to)


def combine(priors: Iterable[Curve]) -> Curve | None:
    """Independent beliefs about one pool's curve (one knee), weighted by precision."""
    items = list(priors)
    if len(items) <= 1:
        return items[0] if items else None
    total = [[0.0] * N for _ in range(N)]
    r = [0.0] * N
    for c in items:
        q = precision(c.cov)
        qm = apply(q, c.mean)
        for i in range(N):
            r[i] += qm[i]
            for j in range(N):
                total[i][j] += q[i][j]
    mean = tuple(solve([list(row) for row in total], r))
    return Curve(items[0].knee, mean, inverse(total), 0.0, items[0].k)


def ladder(
    fits: Sequence[CurveFit | None], ks: Sequence[int | None], draft_cost: float, now: float
) -> list[Curve | None]:
    """Every pool's curve of one ladder (one target model) at the knee the ladder's
    observations support best: each pool's own fit under its physical prior, then each
    pool's posterior under the others' fits carried over (``transfer``). None for a pool
    when no pool of the ladder has observations."""
    knees = next((f.knees for f in fits if f is not None), KNEES)
    learned = [
        (i, fit)
        for i, fit in enumerate(fits)
        if fit is not None and fit.weight(now) >= MIN_OBSERVATIONS
    ]
    odds = [(math.log(knee / RIDGE_TOKENS) / KNEE_SD) ** 2 for knee in knees]
    best: tuple[float, int, dict[int, _Scored]] | None = None
    for j in sorted(range(len(knees)), key=lambda j: (odds[j], j)):  # likeliest first
        found = _score(j, odds[j], learned, draft_cost, now, None if best is None else best[:2])
        if found is not None and (best is None or (found[0], j) < best[:2]):
            best = (found[0], j, found[1])
    if best is None:
        return [None] * len(fits)
    _, j, chosen = best
    own = {i: Curve(p.knee, beta, inverse(lam), n, p.k) for i, (p, n, beta, lam) in chosen.items()}
    out: list[Curve | None] = []
    for i, fit in enumerate(fits):
        carried = combine(transfer(c, ks[i], draft_cost) for m, c in own.items() if m != i)
        if fit is None or fit.weight(now) <= 0:
            out.append(carried)
        elif carried is None and i in own:
            out.append(own[i])  # under its generic prior, as scored
        else:
            prior = carried if carried is not None else fit.generic(j, now, draft_cost)
            out.append(None if prior is None else fit.fitted(j, now, prior)[0])
    return out


_Scored = tuple[Curve, float, Vec, list[list[float]]]  # prior, weight, mean, precision


def _score(
    j: int,
    score: float,
    learned: Sequence[tuple[int, CurveFit]],
    draft_cost: float,
    now: float,
    bound: tuple[float, int] | None,
) -> tuple[float, dict[int, _Scored]] | None:
    """Knee ``j``'s evidence: ``score`` (its prior's log) plus each learned pool's residuals
    under its generic prior, in units of ``NOISE_SD``, and those pools' posteriors there.
    None when no pool has a prior or the evidence is not a number, and as soon as the knee
    cannot beat ``bound`` (the best score so far and its knee; equal scores go to the lower
    knee): every term is >= 0, and floating-point addition of a term >= 0 never lowers a sum
    either."""
    own: dict[int, _Scored] = {}
    for i, fit in learned:
        if bound is not None and (score, j) > bound:
            return None
        sums = fit.sums(j, now)
        prior = fit._generic(j, sums, draft_cost)
        if prior is None:
            continue
        n = fit.weight(now)
        beta, lam, rss = _solved(prior, n, *sums)
        own[i] = (prior, n, beta, lam)
        score += rss / NOISE_SD**2
    return (score, own) if own and not math.isnan(score) else None


def _fit(
    prior: Curve, n: float, xx: Mat, xy: Vec, yy: float, cov: bool = True
) -> tuple[Curve, float]:
    """The posterior under ``prior`` and the weighted relative residual sum of squares
    (``_solved``); without ``cov`` the posterior's covariance is left out."""
    beta, lam, rss = _solved(prior, n, xx, xy, yy)
    return Curve(prior.knee, beta, inverse(lam) if cov else prior.cov, n, prior.k), rss


def _solved(
    prior: Curve, n: float, xx: Mat, xy: Vec, yy: float
) -> tuple[Vec, list[list[float]], float]:
    """The posterior mean under ``prior``, every part kept >= 0, its precision, and the
    weighted relative residual sum of squares. The observations' noise is pooled from the
    residuals of a first pass under the prior loosened ``WIDER`` times (module docstring)."""
    p0 = precision(prior.cov)
    p0m = apply(p0, prior.mean)
    _, _, rss = _pass(p0, p0m, xx, xy, yy, WIDER**-2, NOISE_SD**2)
    noise = (NOISE_WEIGHT * NOISE_SD**2 + rss) / (NOISE_WEIGHT + n)
    return _pass(p0, p0m, xx, xy, yy, 1.0, noise)


def _pass(
    p0: Mat, p0m: Vec, xx: Mat, xy: Vec, yy: float, loose: float, noise: float
) -> tuple[Vec, list[list[float]], float]:
    """One fit: the prior's precision ``p0`` (and ``p0m``, it times the prior's mean) scaled
    by ``loose``, the observations' sums at relative ``noise``."""
    lam = [
        [loose * p + x / noise for p, x in zip(prow, xrow, strict=True)]
        for prow, xrow in zip(p0, xx, strict=True)
    ]
    r = [loose * p0m[i] + xy[i] / noise for i in range(N)]
    beta = non_negative(lam, r)
    rss = max(yy - 2 * dot(beta, xy) + dot(beta, apply(xx, beta)), 0.0)
    return beta, lam, rss
