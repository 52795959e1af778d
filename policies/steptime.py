"""A pool's engine step time as a function of its batch, learned online. Pure; time is an
argument.

An engine step reads the weights once and then does work for every sequence in the batch,
so its time is close to affine in the batch: ``seconds = a + b * batch``, a fixed part and
a per-sequence part, both >= 0 (the simulator's ``CostModel`` is exactly that; a GPU is
flat while memory-bound and then linear, which a line over the batches seen follows to ~15%).

Every finished request with a known decode time and step count is one observation: its
seconds per engine step, at the mean number of requests in flight on its endpoint while it
ran (its batch, as the gateway sees it). Observations are kept as running sums weighted
by ``1 / seconds^2`` (their noise is relative: a step at batch 60 is as noisy in percent as
one at batch 1) that decay with a half-life, so the fit follows the pool as its traffic
changes and costs O(1) per observation. The decay applies at the time of the question too:
a pool that stopped being fed loses weight, and its prediction grows less certain.

The fit is a Bayesian line (``Line``): a Gaussian prior on (a, b), the data's evidence, and
the residual noise (pooled with ``NOISE_SD`` over ``NOISE_WEIGHT`` pseudo-observations).
The prediction's variance grows with the distance from the batches observed and with
staleness. The prior is structural (``transfer``): pools of one ladder serve one target
model, so another pool's line says what this one should be: the fixed part scales with the
passes of a step (the target's, plus k draft passes of ``draft_cost`` each) and the
per-sequence part with the tokens each sequence verifies (k + 1 on a speculative pool, 1 on
a standard one). So a standard pool seen only at batch 1 extrapolates with the speculative
pool's measured slope, and the data overrule the prior where they exist. Without another
pool, a loose generic prior (``KAPPA``) stands in. Observed step times include the prefills
that ran meanwhile, as the sequences sharing the step paid for them.

``HingeFit`` is an alternative shape, not the default: a floor, then a slope past a knee
(a GPU's memory-bound then compute-bound step), kept with the same O(1) decaying sums at a
fixed set of candidate knees, the best-supported one chosen at question time. On step times
measured on an H200 (``bench/RESULTS.md``, "Real hardware") it stays within ~5-8% over the
batches a pool was seen at, where the line is off by up to 10-18%; above them neither shape
can see a knee that no observation shows.

Physical priors, not fitted to any test: ``KAPPA`` (a sequence adds 2% of a step's fixed
time per token it verifies: a memory-bound accelerator adds less, the simulator 3%),
``COMMON_SD`` (another pool of the same model may run on other hardware or settings: both
parts of its line within a factor ~1.6 of what the relation says, together),
``TRANSFER_SD`` (the relation itself holds within ~15% for each part: the draft's cost and
the attention share vary), ``NOISE_SD`` (one request's mean step time is within ~15% of
the line: prefills and batch changes during its life).

Explained for operators, with its numbers, in docs/guardrail.md ("The economic guardrail").
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

MIN_OBSERVATIONS = 3.0
KAPPA = 0.02
GENERIC_SD = 1.0  # the generic prior: each part known within a factor of e
TRANSFER_SD = 0.15
COMMON_SD = 0.5
NOISE_SD = 0.15
NOISE_WEIGHT = 3.0


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
    """A belief about ``seconds = a + b * batch``: the means of a and b, their covariance,
    and the weight of the pool's own (decayed) observations in it."""

    a: float
    b: float
    vaa: float
    vab: float
    vbb: float
    observations: float = 0.0

    def at(self, batch: float) -> StepTime:
        x = max(batch, 1.0)
        seconds = max(self.a + self.b * x, 1e-9)
        var = max(self.vaa + 2 * x * self.vab + x * x * self.vbb, 0.0)
        learned = self.observations >= MIN_OBSERVATIONS
        return StepTime(seconds, var / (seconds * seconds), self.observations, learned)


@dataclass(slots=True)
class StepFit:
    """Decaying sums of one pool's (batch, seconds per step) observations, each weighted by
    ``1 / seconds^2``; ``w`` is their plain (decayed) count."""

    half_life_s: float = 300.0
    tokens_per_seq: int = 1
    at: float = 0.0
    w: float = 0.0
    s: float = 0.0
    sx: float = 0.0
    sxx: float = 0.0
    sy: float = 0.0
    sxy: float = 0.0

    def add(self, now: float, batch: float, seconds: float, weight: float = 1.0) -> None:
        if seconds <= 0 or weight <= 0:
            return
        self._decay(now)
        x, omega = max(batch, 1.0), weight / (seconds * seconds)
        self.w += weight
        self.s += omega
        self.sx += omega * x
        self.sxx += omega * x * x
        self.sy += omega * seconds
        self.sxy += omega * x * seconds

    def _decay(self, now: float) -> None:
        if now > self.at:
            f = self._factor(now)
            self.w, self.s, self.sx, self.sxx = self.w * f, self.s * f, self.sx * f, self.sxx * f
            self.sy, self.sxy = self.sy * f, self.sxy * f
            self.at = now

    def _factor(self, now: float) -> float:
        return 0.5 ** (max(now - self.at, 0.0) / self.half_life_s) if self.w else 1.0

    def weight(self, now: float) -> float:
        """The observations' weight at ``now`` (decayed, also without new observations)."""
        return self.w * self._factor(now)

    def mean_batch(self, now: float) -> float | None:
        """The batch the observations were taken at (weighted); None under the minimum."""
        if self.weight(now) < MIN_OBSERVATIONS or self.s <= 0:
            return None
        return self.sx / self.s

    def line(self, now: float, prior: Line | None = None) -> Line | None:
        """The posterior line at ``now`` under ``prior`` (None: the generic prior, which
        needs observations). None without observations or prior."""
        f = self._factor(now)
        n, s, sx, sxx = self.w * f, self.s * f, self.sx * f, self.sxx * f
        sy, sxy = self.sy * f, self.sxy * f
        if prior is None:
            if n <= 0 or s <= 0:
                return None
            prior = _generic(sx / s, sy / s, KAPPA * self.tokens_per_seq)
        if n <= 0:
            return prior
        return _fit(prior, n, s, sx, sxx, sy, sxy)[0]

    def predict(self, now: float, batch: float, prior: Line | None = None) -> StepTime | None:
        """Seconds per step at ``batch``: from the pool's own observations (at least
        ``MIN_OBSERVATIONS`` of them, decayed) when ``prior`` is None, else from both."""
        if prior is None and self.weight(now) < MIN_OBSERVATIONS:
            return None
        line = self.line(now, prior)
        return None if line is None else line.at(batch)


def _fit(
    prior: Line, n: float, s: float, sx: float, sxx: float, sy: float, sxy: float
) -> tuple[Line, float]:
    """The posterior under ``prior``, its noise pooled from the residuals of a first pass,
    and the weighted residual sum of squares (relative residuals)."""
    noise = NOISE_SD**2
    line, rss = prior, 0.0
    for _ in range(2):
        line = _posterior(prior, n, s, sx, sxx, sy, sxy, noise)
        a, b = line.a, line.b
        rss = max(n - 2 * a * sy - 2 * b * sxy + a * a * s + 2 * a * b * sx + b * b * sxx, 0.0)
        noise = (NOISE_WEIGHT * NOISE_SD**2 + rss) / (NOISE_WEIGHT + n)
    return line, rss


def _generic(x: float, y: float, per_seq: float) -> Line:
    """A loose prior through the data's mean (x, y) with slope ``per_seq`` of the fixed
    part per sequence."""
    a = y / (1.0 + per_seq * x)
    b = per_seq * a
    return Line(a, b, (GENERIC_SD * a) ** 2, 0.0, (GENERIC_SD * b) ** 2)


def _posterior(
    prior: Line,
    n: float,
    s: float,
    sx: float,
    sxx: float,
    sy: float,
    sxy: float,
    noise: float,
) -> Line:
    """Gaussian update of ``prior`` with the weighted sums; a and b kept >= 0 (the
    constrained optimum in the posterior's own metric)."""
    det0 = prior.vaa * prior.vbb - prior.vab * prior.vab
    if det0 <= 0:
        p_aa, p_ab, p_bb = 1.0 / max(prior.vaa, 1e-30), 0.0, 1.0 / max(prior.vbb, 1e-30)
    else:
        p_aa, p_ab, p_bb = prior.vbb / det0, -prior.vab / det0, prior.vaa / det0
    l_aa, l_ab, l_bb = p_aa + s / noise, p_ab + sx / noise, p_bb + sxx / noise
    r_a = p_aa * prior.a + p_ab * prior.b + sy / noise
    r_b = p_ab * prior.a + p_bb * prior.b + sxy / noise
    det = l_aa * l_bb - l_ab * l_ab
    a = (l_bb * r_a - l_ab * r_b) / det
    b = (l_aa * r_b - l_ab * r_a) / det
    if b < 0:
        a, b = a + l_ab / l_aa * b, 0.0
    if a < 0:
        a, b = 0.0, max(b + l_ab / l_bb * a, 0.0)
    return Line(max(a, 0.0), b, l_bb / det, -l_ab / det, l_aa / det, n)


def transfer(source: Line, k_from: int | None, k_to: int | None, draft_cost: float) -> Line:
    """What ``source`` (a pool with ``k_from`` draft tokens, None: standard) says about a
    pool of the same model with ``k_to``: the fixed part scaled by the passes of a step,
    the per-sequence part by the tokens each sequence verifies. On top of the source's own
    doubt: a factor common to both parts (``COMMON_SD``: other hardware, another
    configuration), so that the pool's own data at one batch pin it and the slope follows,
    and ``TRANSFER_SD`` for each part alone (the structural relation itself)."""
    k_a, k_b = k_from or 0, k_to or 0
    fa = (1.0 + k_b * draft_cost) / (1.0 + k_a * draft_cost)
    fb = (k_b + 1.0) / (k_a + 1.0)
    a, b = source.a * fa, source.b * fb
    part, common = TRANSFER_SD**2, COMMON_SD**2
    return Line(
        a,
        b,
        source.vaa * fa * fa + (part + common) * a * a,
        source.vab * fa * fb + common * a * b,
        source.vbb * fb * fb + (part + common) * b * b,
    )


def combine(priors: Iterable[Line]) -> Line | None:
    """Several independent beliefs about one line, weighted by their precision matrices."""
    items = list(priors)
    if not items:
        return None
    if len(items) == 1:
        return items[0]
    p_aa = p_ab = p_bb = r_a = r_b = 0.0
    for line in items:
        det = max(line.vaa * line.vbb - line.vab * line.vab, 1e-30)
        q_aa, q_ab, q_bb = line.vbb / det, -line.vab / det, line.vaa / det
        p_aa, p_ab, p_bb = p_aa + q_aa, p_ab + q_ab, p_bb + q_bb
        r_a += q_aa * line.a + q_ab * line.b
        r_b += q_ab * line.a + q_bb * line.b
    det = p_aa * p_bb - p_ab * p_ab
    a = (p_bb * r_a - p_ab * r_b) / det
    b = (p_aa * r_b - p_ab * r_a) / det
    return Line(a, b, p_bb / det, -p_ab / det, p_aa / det)


# --- an alternative shape: a floor, then a slope past a knee ---------------------------------

HINGE_KNEES = (0.0, 4.0, 8.0, 12.0, 16.0, 24.0, 32.0, 48.0, 64.0, 96.0, 128.0, 192.0, 256.0)


@dataclass(frozen=True, slots=True)
class Hinge:
    """A belief about ``seconds = a + b * max(0, batch - knee)``: ``line`` holds a and b in
    that coordinate (knee 0 is ``Line`` itself)."""

    knee: float
    line: Line

    def at(self, batch: float) -> StepTime:
        x = max(max(batch, 1.0) - self.knee, 0.0)
        seconds = max(self.line.a + self.line.b * x, 1e-9)
        line = self.line
        var = max(line.vaa + 2 * x * line.vab + x * x * line.vbb, 0.0)
        learned = line.observations >= MIN_OBSERVATIONS
        return StepTime(seconds, var / (seconds * seconds), line.observations, learned)


@dataclass(slots=True)
class HingeFit:
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

    half_life_s: float = 300.0
    tokens_per_seq: int = 1
    knees: tuple[float, ...] = HINGE_KNEES
    at: float = 0.0
    w: float = 0.0
    s: float = 0.0
    sy: float = 0.0
    sx: list[float] = field(default_factory=list)
    sxx: list[float] = field(default_factory=list)
    sxy: list[float] = field(default_factory=list)
    above: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        n = len(self.knees)
        self.sx, self.sxx, self.sxy, self.above = [0.0] * n, [0.0] * n, [0.0] * n, [0.0] * n

    def add(self, now: float, batch: float, seconds: float, weight: float = 1.0) -> None:
        if seconds <= 0 or weight <= 0:
            return
        self._decay(now)
        x, omega = max(batch, 1.0), weight / (seconds * seconds)
        self.w += weight
        self.s += omega
        self.sy += omega * seconds
        for j, knee in enumerate(self.knees):
            xj = max(x - knee, 0.0)
            self.sx[j] += omega * xj
            self.sxx[j] += omega * xj * xj
            self.sxy[j] += omega * xj * seconds
            if x > knee:
                self.above[j] += weight

    def _decay(self, now: float) -> None:
        if now > self.at:
            f = self._factor(now)
            self.w, self.s, self.sy = self.w * f, self.s * f, self.sy * f
            for sums in (self.sx, self.sxx, self.sxy, self.above):
                sums[:] = [v * f for v in sums]
            self.at = now

    def _factor(self, now: float) -> float:
        return 0.5 ** (max(now - self.at, 0.0) / self.half_life_s) if self.w else 1.0

    def weight(self, now: float) -> float:
        return self.w * self._factor(now)

    def hinge(self, now: float, prior: Line | None = None) -> Hinge | None:
        """The best-supported knee and its posterior at ``now``; None without observations
        (and without ``prior``)."""
        f = self._factor(now)
        n, s, sy = self.w * f, self.s * f, self.sy * f
        if n <= 0 or s <= 0:
            return None if prior is None else Hinge(0.0, prior)
        best: tuple[float, Hinge] | None = None
        for j, knee in enumerate(self.knees):
            above = self.above[j] * f
            if knee > 0 and (above < MIN_OBSERVATIONS or n - above < MIN_OBSERVATIONS):
                continue
            sx, sxx, sxy = self.sx[j] * f, self.sxx[j] * f, self.sxy[j] * f
            base = prior if knee == 0 and prior is not None else None
            start = base or _generic(sx / s, sy / s, KAPPA * self.tokens_per_seq)
            line, rss = _fit(start, n, s, sx, sxx, sy, sxy)
            score = rss / NOISE_SD**2 + math.log(max(n, math.e)) * (2 if knee == 0 else 3)
            if best is None or score < best[0]:
                best = (score, Hinge(knee, line))
        return None if best is None else best[1]

    def predict(self, now: float, batch: float, prior: Line | None = None) -> StepTime | None:
        if prior is None and self.weight(now) < MIN_OBSERVATIONS:
            return None
        hinge = self.hinge(now, prior)
        return None if hinge is None else hinge.at(batch)
