"""A pool's engine step time as a function of its batch, learned online. Pure; time is an
argument. The guardrail judges on ``policies/stepcurve.py`` (the tokens, cache and prefill a
step computes, with a knee); this line stays what ``/admin`` shows of a pool, and the
shapes the H200 table is compared with (``bench/gpu/learners.py``).

An engine step reads the weights once and then does work for every sequence in the batch,
and for every prompt token it prefills: ``seconds = a + b * batch + c * prefill``, a fixed
part, a per-sequence part and a part per prompt token prefilled in the step, all >= 0 (the
simulator's ``CostModel`` is exactly that; a GPU is flat while memory-bound and then
linear, which a line fitted over the batches seen follows).

Every finished request with a known decode time and step count is one observation: its
seconds per engine step, at the mean number of requests in flight on its endpoint while it
ran (its batch, as the gateway sees it) and the prompt tokens other requests prefilled on
that endpoint while it decoded, per step (``prefill``). Engines schedule prefills into the
same steps as decodes (vLLM's chunked prefill), so a pool that carries long prompts shows
long steps to every sequence decoding beside them. That time is the prefilling requests'
own cost, paid wherever they run; it is not what a sequence costs to decode. So the fit
separates it, and a pool is judged by its decode step (``at``, prefill 0): a pool that
alone carries long summaries is not thereby dearer for the chat it could take.

Observations are kept as running sums weighted by ``1 / seconds^2`` (their noise is
relative: a step at batch 60 is as noisy in percent as one at batch 1) that decay with a
half-life, so the fit follows the pool as its traffic changes and costs O(1) per
observation. The decay applies at the time of the question too: a pool that stopped being
fed loses weight, and its prediction grows less certain.

The fit is Bayesian (``Line``): a Gaussian prior on (a, b, c), the data's evidence, and the
residual noise (pooled with ``NOISE_SD`` over ``NOISE_WEIGHT`` pseudo-observations). The
prediction's variance grows with the distance from the batches observed and with
staleness. The prior is structural (``transfer``): pools of one ladder serve one target
model, so another pool's line says what this one should be: the fixed part scales with the
passes of a step (the target's, plus k draft passes of ``draft_cost`` each), the
per-sequence part with the tokens each sequence verifies (k + 1 on a speculative pool, 1 on
a standard one), and the prefill part with the passes over a prompt (a draft model reads it
once too). So a standard pool
seen only at batch 1 extrapolates with the speculative pool's measured slope, and the data
overrule the prior where they exist. Without another pool, a loose generic prior
(``KAPPA``, ``PREFILL_KAPPA``) stands in.

``HingeFit`` is an alternative shape, not the default: a floor, then a slope past a knee
(a GPU's memory-bound then compute-bound step), kept with the same O(1) decaying sums at a
fixed set of candidate knees, the best-supported one chosen at question time. On step times
measured on an H200 (``bench/RESULTS.md``, "Real hardware") it stays within ~5-8% over the
batches a pool was seen at, where the line is off by up to 10-18%; above them neither shape
can see a knee that no observation shows.

Physical priors, not fitted to any test: ``KAPPA`` (a sequence adds 2% of a step's fixed
time per token it verifies: a memory-bound accelerator adds less, the simulator 3%),
``PREFILL_KAPPA`` (a prompt token costs 0.4% of a step's fixed time: the fixed part reads
the weights once, at the accelerator's memory bandwidth, and a prompt token is compute on
them, so the ratio is bandwidth over peak FLOP/s, 0.0034 byte/FLOP on an H100, 0.006 in the
simulator), ``COMMON_SD`` (another pool of the same model may run on other hardware or
settings: every part of its line within a factor ~1.6 of what the relation says,
together), ``TRANSFER_SD`` (the relation itself holds within ~15% for each part: the
draft's cost and the attention share vary), ``NOISE_SD`` (one request's mean step time is
within ~15% of the line: batch changes during its life).

Explained for operators, with its numbers, in docs/guardrail.md ("The economic guardrail").
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from policies.decaying import Decaying
from policies.linalg import Mat, apply, diagonal, dot, inverse, non_negative, precision, solve

MIN_OBSERVATIONS = 3.0
KAPPA = 0.02
PREFILL_KAPPA = 0.004
GENERIC_SD = 1.0  # the generic prior: each part known within a factor of e
TRANSFER_SD = 0.15
COMMON_SD = 0.5
NOISE_SD = 0.15
NOISE_WEIGHT = 3.0

Vector = tuple[float, float, float]
_ZERO: Mat = ((0.0, 0.0, 0.0), (0.0, 0.0, 0.0), (0.0, 0.0, 0.0))
_PAIRS = ((0, 0), (0, 1), (0, 2), (1, 1), (1, 2), (2, 2))  # the upper triangle, row by row


@dataclass(frozen=True, slots=True)
class StepTime:
    """A predicted step time: seconds, and the variance of its logarithm. ``learned``: the
    pool's own observations weigh at least ``MIN_OBSERVATIONS`` now."""

    seconds: float
    log_var: float
    observations: float
    learned: bool = True


@dataclass(frozen=True, slots=True)
class Line:
    """A belief about ``seconds = a + b * batch + c * prefill``: the means of a, b and c,
    their covariance (in that order), and the weight of the pool's own (decayed)
    observations in it."""

    a: float
    b: float
    c: float = 0.0
    cov: Mat = _ZERO
    observations: float = 0.0

    @property
    def mean(self) -> Vector:
        return (self.a, self.b, self.c)

    def at(self, batch: float, prefill: float = 0.0) -> StepTime:
        """The step at ``batch`` sequences with ``prefill`` prompt tokens in it (0: a decode
        step, what a sequence pays to decode)."""
        return self.at_point(max(batch, 1.0), prefill)

    def at_point(self, x1: float, prefill: float = 0.0) -> StepTime:
        """The step at the regressors as they are (``HingeFit``'s past-the-knee batch)."""
        x = (1.0, x1, max(prefill, 0.0))
        seconds = max(dot(self.mean, x), 1e-9)
        var = max(dot(x, apply(self.cov, x)), 0.0)
        learned = self.observations >= MIN_OBSERVATIONS
        return StepTime(seconds, var / (seconds * seconds), self.observations, learned)


@dataclass(slots=True)
class StepFit(Decaying):
    """Decaying sums of one pool's (batch, prefill, seconds per step) observations, each
    weighted by ``1 / seconds^2``; ``w`` is their plain (decayed) count. ``xx`` holds the
    weighted sums of the regressors' products (1, batch, prefill) and ``xy`` of their
    products with the seconds."""

    tokens_per_seq: int = 1
    xx: list[float] = field(default_factory=lambda: [0.0] * len(_PAIRS))
    xy: list[float] = field(default_factory=lambda: [0.0] * 3)

    def add(
        self, now: float, batch: float, seconds: float, weight: float = 1.0, prefill: float = 0.0
    ) -> None:
        if seconds <= 0 or weight <= 0:
            return
        self._decay(now)
        x = (1.0, max(batch, 1.0), max(prefill, 0.0))
        omega = weight / (seconds * seconds)
        self.w += weight
        for n, (i, j) in enumerate(_PAIRS):
            self.xx[n] += omega * x[i] * x[j]
        for i in range(3):
            self.xy[i] += omega * x[i] * seconds

    def _scale(self, f: float) -> None:
        self.xx[:] = [v * f for v in self.xx]
        self.xy[:] = [v * f for v in self.xy]

    def mean_batch(self, now: float) -> float | None:
        """The batch the observations were taken at (weighted); None under the minimum."""
        if self.weight(now) < MIN_OBSERVATIONS or self.xx[0] <= 0:
            return None
        return self.xx[1] / self.xx[0]

    def mean_prefill(self, now: float) -> float | None:
        """The prompt tokens per step the observations were taken at (weighted)."""
        if self.weight(now) < MIN_OBSERVATIONS or self.xx[0] <= 0:
            return None
        return self.xx[2] / self.xx[0]

    def line(self, now: float, prior: Line | None = None) -> Line | None:
        """The posterior line at ``now`` under ``prior`` (None: the generic prior, which
        needs observations). None without observations or prior."""
        f = self._factor(now)
        n = self.w * f
        xx = _symmetric([v * f for v in self.xx])
        xy = (self.xy[0] * f, self.xy[1] * f, self.xy[2] * f)
        if prior is None:
            if n <= 0 or xx[0][0] <= 0:
                return None
            s = xx[0][0]
            mean_x, mean_y = (xx[0][1] / s, xx[0][2] / s), xy[0] / s
            prior = _generic(mean_x, mean_y, KAPPA * self.tokens_per_seq)
        if n <= 0:
            return prior
        return _fit(prior, n, xx, xy)[0]

    def predict(self, now: float, batch: float, prior: Line | None = None) -> StepTime | None:
        """Seconds per decode step at ``batch``: from the pool's own observations (at least
        ``MIN_OBSERVATIONS`` of them, decayed) when ``prior`` is None, else from both."""
        if prior is None and self.weight(now) < MIN_OBSERVATIONS:
            return None
        line = self.line(now, prior)
        return None if line is None else line.at(batch)


def _fit(prior: Line, n: float, xx: Mat, xy: Vector) -> tuple[Line, float]:
    """The posterior under ``prior``, its noise pooled from the residuals of a first pass,
    and the weighted residual sum of squares (relative residuals)."""
    noise = NOISE_SD**2
    line, rss = prior, 0.0
    for _ in range(2):
        line = _posterior(prior, n, xx, xy, noise)
        beta = line.mean
        rss = max(n - 2 * dot(beta, xy) + dot(beta, apply(xx, beta)), 0.0)
        noise = (NOISE_WEIGHT * NOISE_SD**2 + rss) / (NOISE_WEIGHT + n)
    return line, rss


def _generic(x: tuple[float, float], y: float, per_seq: float) -> Line:
    """A loose prior through the data's mean (x: batch and prefill, y: seconds) with slope
    ``per_seq`` and ``PREFILL_KAPPA`` of the fixed part per sequence and per prompt token."""
    a = y / (1.0 + per_seq * x[0] + PREFILL_KAPPA * x[1])
    mean = (a, per_seq * a, PREFILL_KAPPA * a)
    return Line(*mean, cov=diagonal([(GENERIC_SD * m) ** 2 for m in mean]))


def _posterior(prior: Line, n: float, xx: Mat, xy: Vector, noise: float) -> Line:
    """Gaussian update of ``prior`` with the weighted sums; every part kept >= 0 (the
    constrained optimum in the posterior's own metric)."""
    p0 = precision(prior.cov)
    lam = _symmetric([p0[i][j] + xx[i][j] / noise for i, j in _PAIRS])
    r = _add(apply(p0, prior.mean), tuple(v / noise for v in xy))
    a, b, c = non_negative(lam, r)
    return Line(a, b, c, cov=inverse(lam), observations=n)


def transfer(source: Line, k_from: int | None, k_to: int | None, draft_cost: float) -> Line:
    """What ``source`` (a pool with ``k_from`` draft tokens, None: standard) says about a
    pool of the same model with ``k_to``: the fixed part scaled by the passes of a decode
    step, the per-sequence part by the tokens each sequence verifies, the prefill part by the
    passes over a prompt (the target's, and the draft model's once, not k times). On top of the
    source's own doubt: a factor common to every part (``COMMON_SD``: other hardware,
    another configuration), so that the pool's own data at one batch pin it and the slope
    follows, and ``TRANSFER_SD`` for each part alone (the structural relation itself)."""
    k_a, k_b = k_from or 0, k_to or 0
    fa = (1.0 + k_b * draft_cost) / (1.0 + k_a * draft_cost)
    fb = (k_b + 1.0) / (k_a + 1.0)
    fc = (1.0 + (k_b > 0) * draft_cost) / (1.0 + (k_a > 0) * draft_cost)
    f = (fa, fb, fc)
    mean = (source.a * fa, source.b * fb, source.c * fc)
    part, common = TRANSFER_SD**2, COMMON_SD**2
    cov = _symmetric(
        [
            source.cov[i][j] * f[i] * f[j]
            + common * mean[i] * mean[j]
            + (part * mean[i] * mean[i] if i == j else 0.0)
            for i, j in _PAIRS
        ]
    )
    return Line(*mean, cov=cov)


def combine(priors: Iterable[Line]) -> Line | None:
    """Several independent beliefs about one line, weighted by their precision matrices."""
    items = list(priors)
    if not items:
        return None
    if len(items) == 1:
        return items[0]
    total = [0.0] * len(_PAIRS)
    r: Vector = (0.0, 0.0, 0.0)
    for line in items:
        q = precision(line.cov)
        total = [t + q[i][j] for t, (i, j) in zip(total, _PAIRS, strict=True)]
        r = _add(r, apply(q, line.mean))
    together = _symmetric(total)
    a, b, c = solve([list(row) for row in together], list(r))
    return Line(a, b, c, cov=inverse(together))


# --- an alternative shape: a floor, then a slope past a knee ---------------------------------

HINGE_KNEES = (0.0, 4.0, 8.0, 12.0, 16.0, 24.0, 32.0, 48.0, 64.0, 96.0, 128.0, 192.0, 256.0)


@dataclass(frozen=True, slots=True)
class Hinge:
    """A belief about ``seconds = a + b * max(0, batch - knee) + c * prefill``: ``line``
    holds a, b and c in that coordinate (knee 0 is ``Line`` itself)."""

    knee: float
    line: Line

    def at(self, batch: float, prefill: float = 0.0) -> StepTime:
        return self.line.at_point(max(max(batch, 1.0) - self.knee, 0.0), prefill)


@dataclass(slots=True)
class HingeFit(Decaying):
    """``StepFit``'s observations, fitted as a floor and a slope past a knee as well as a
    line: a GPU's step is flat while reading the weights dominates (memory-bound) and grows
    with the tokens once compute does, which a line through both stretches fits badly at
    both ends. Not the guardrail's default.

    For each knee of ``knees`` (batches; 0 is the line) it keeps the same decaying weighted
    sums as ``StepFit`` in the coordinate ``max(0, batch - knee)``, and the weight seen above
    the knee: O(len(knees)) per observation, a constant. ``hinge`` fits every knee that has at
    least ``MIN_OBSERVATIONS`` of weight on both sides and picks the one with the lowest
    Bayesian information criterion (residuals in units of ``NOISE_SD``, a knee counting as a
    parameter), so a knee must earn its place and flat or straight data stays a line. A prior
    ``Line`` from another pool (``transfer``) applies to the line only: the knees start from
    the generic prior."""

    tokens_per_seq: int = 1
    knees: tuple[float, ...] = HINGE_KNEES
    xx: list[list[float]] = field(default_factory=list)
    xy: list[list[float]] = field(default_factory=list)
    above: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        n = len(self.knees)
        self.xx = [[0.0] * len(_PAIRS) for _ in range(n)]
        self.xy = [[0.0] * 3 for _ in range(n)]
        self.above = [0.0] * n

    def add(
        self, now: float, batch: float, seconds: float, weight: float = 1.0, prefill: float = 0.0
    ) -> None:
        if seconds <= 0 or weight <= 0:
            return
        self._decay(now)
        batch, omega, p = max(batch, 1.0), weight / (seconds * seconds), max(prefill, 0.0)
        self.w += weight
        for j, knee in enumerate(self.knees):
            x = (1.0, max(batch - knee, 0.0), p)
            sums, products = self.xx[j], self.xy[j]
            for n, (i, k) in enumerate(_PAIRS):
                sums[n] += omega * x[i] * x[k]
            for i in range(3):
                products[i] += omega * x[i] * seconds
            if batch > knee:
                self.above[j] += weight

    def _scale(self, f: float) -> None:
        for sums in (*self.xx, *self.xy, self.above):
            sums[:] = [v * f for v in sums]

    def hinge(self, now: float, prior: Line | None = None) -> Hinge | None:
        """The best-supported knee and its posterior at ``now``; None without observations
        (and without ``prior``)."""
        f = self._factor(now)
        n = self.w * f
        if n <= 0 or self.xx[0][0] <= 0:
            return None if prior is None else Hinge(0.0, prior)
        best: tuple[float, Hinge] | None = None
        for j, knee in enumerate(self.knees):
            above = self.above[j] * f
            if knee > 0 and (above < MIN_OBSERVATIONS or n - above < MIN_OBSERVATIONS):
                continue
            xx = _symmetric([v * f for v in self.xx[j]])
            xy = (self.xy[j][0] * f, self.xy[j][1] * f, self.xy[j][2] * f)
            s = xx[0][0]
            generic = _generic((xx[0][1] / s, xx[0][2] / s), xy[0] / s, KAPPA * self.tokens_per_seq)
            start = prior if knee == 0 and prior is not None else generic
            line, rss = _fit(start, n, xx, xy)
            score = rss / NOISE_SD**2 + math.log(max(n, math.e)) * (3 if knee == 0 else 4)
            if best is None or score < best[0]:
                best = (score, Hinge(knee, line))
        return None if best is None else best[1]

    def predict(self, now: float, batch: float, prior: Line | None = None) -> StepTime | None:
        if prior is None and self.weight(now) < MIN_OBSERVATIONS:
            return None
        hinge = self.hinge(now, prior)
        return None if hinge is None else hinge.at(batch)


# --- 3 x 3 in an upper triangle -------------------------------------------------------------


def _add(u: Sequence[float], v: Sequence[float]) -> Vector:
    return (u[0] + v[0], u[1] + v[1], u[2] + v[2])


def _symmetric(upper: Sequence[float]) -> Mat:
    """The symmetric matrix of an upper triangle given row by row (``_PAIRS``' order)."""
    a, b, c, d, e, f = upper
    return ((a, b, c), (b, d, e), (c, e, f))
