"""What a slice's output token costs on each rung, and whether another rung is cheaper with
confidence. Pure; no I/O, no clock.

Cost per output token on a pool, at a load of B requests in flight per endpoint:

    cost = step_time(B) * price_per_second / (L * B)

``L`` is the slice's tokens per engine step on that pool (1 on a standard pool), measured
from whichever signal the pool gives; ``step_time`` is the pool's own, learned online
(``policies/steptime.py``). Two rungs are compared at the same B, so B cancels and the
log cost ratio is ``log t_up - log t_down + log p_up - log p_down - log L_up + log L_down``.

Confidence: the variance of that log ratio adds the step-time fits' variances, less twice
the part of them the two pools share (``Rung.shared``: one target model, each pool's curve
carried over to the other, ``policies/stepjoint.py``), and the variance of each measured
``log L``: the dispersion of per-request tokens per step in the
span (pooled with a prior of 30% over 3 pseudo-requests, so three requests that happen to
agree do not look certain) over the number of requests. A slice's own dispersion was
measured on its requests; a span of shorter ones (short probes of a few tokens) varies more
per request, by the ratio of their sizes, for a request's tokens per step is a mean over
fewer steps. The ratio is judged on
the newest ``min_samples`` requests first, then on the newest 4x, 16x and all in the
window: the shortest span that is confident decides, so recent evidence outweighs old (a
collapse shows within a few requests; so does a healing seen by probes), and a slice near
the line is judged on everything it has. A rung moves only when the other is cheaper at
``confidence`` (one-sided; 0.999 is z = 3.1, strict because the test repeats on every
request).

Explained for operators, with its numbers, in docs/guardrail.md ("The economic guardrail").
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from statistics import NormalDist

from policies.speedup import draft_rate_to_token_rate, expected_tokens_per_step
from policies.steptime import StepTime

PRIOR_DISPERSION = 0.09
PRIOR_WEIGHT = 3.0
TRANSFER_LOG_VAR = 0.04
SPAN_FACTORS = (1, 4, 16)
LEAN_MAX = 0.25
LEAN_UNSEEN = 0.5


@dataclass(frozen=True, slots=True)
class Tally:
    """Tokens-per-step evidence over ``n`` requests: sums of decode tokens and steps, and of
    their squares and products (for the variance of the ratio)."""

    n: int = 0
    tokens: float = 0.0
    steps: float = 0.0
    tok_sq: float = 0.0
    step_sq: float = 0.0
    tok_step: float = 0.0

    @property
    def per_step(self) -> float | None:
        return self.tokens / self.steps if self.steps > 0 and self.tokens > 0 else None

    def dispersion(self) -> float | None:
        """Relative variance of one request's tokens around L times its steps."""
        per_step = self.per_step
        if per_step is None or self.n < 2:
            return None
        residual = self.tok_sq - 2 * per_step * self.tok_step + per_step**2 * self.step_sq
        mean = per_step * self.steps / self.n
        return max(residual, 0.0) / ((self.n - 1) * mean * mean)


def summed(tallies: Iterable[Tally]) -> Tally:
    """One tally of the requests of several."""
    n, tokens, steps, tok_sq, step_sq, tok_step = 0, 0.0, 0.0, 0.0, 0.0, 0.0
    for t in tallies:
        n, tokens, steps = n + t.n, tokens + t.tokens, steps + t.steps
        tok_sq, step_sq, tok_step = tok_sq + t.tok_sq, step_sq + t.step_sq, tok_step + t.tok_step
    return Tally(n, tokens, steps, tok_sq, step_sq, tok_step)


@dataclass(frozen=True, slots=True)
class Rung:
    """One rung of a slice's ladder as the judge sees it. ``spans`` are the slice's tallies
    on this pool, newest requests first and growing (empty when it never ran here), or,
    when ``transferred``, another speculative rung's tallies carried over to this k
    (``transfer``), which adds ``TRANSFER_LOG_VAR`` to their doubt."""

    pool: str
    k: int | None
    price: float
    step: StepTime | None
    spans: tuple[Tally, ...] = ()
    transferred: bool = False
    dispersion: float | None = None
    dispersion_tokens: float | None = None  # the mean request it was measured on
    shared: tuple[tuple[str, float], ...] = ()  # (pool, covariance of the two log steps)

    @property
    def prior_dispersion(self) -> float:
        return PRIOR_DISPERSION if self.dispersion is None else self.dispersion

    def dispersion_of(self, tally: Tally) -> float:
        """The dispersion of one of ``tally``'s requests: the slice's own, scaled up where
        they are shorter than the requests it was measured on."""
        spread = _pooled(tally, self.prior_dispersion)
        size = tally.tokens / tally.n if tally.n else 0.0
        if self.dispersion is None or not self.dispersion_tokens or size <= 0:
            return spread
        return spread * max(self.dispersion_tokens / size, 1.0)

    @property
    def extra_var(self) -> float:
        return TRANSFER_LOG_VAR if self.transferred else 0.0

    def shared_with(self, pool: str) -> float:
        """The doubt this rung's log step time shares with ``pool``'s (``shared``)."""
        return next((cov for other, cov in self.shared if other == pool), 0.0)


@dataclass(frozen=True, slots=True)
class Judgement:
    """``verdict`` +1: the upper rung is cheaper with confidence; -1: the lower one is; 0:
    not sure. ``ratio`` is cost(upper) / cost(lower) on the deciding span (the longest when
    none decides), ``z`` how many standard deviations its log lies from 0 (positive: upper
    dearer); ``newest_ratio`` is the ratio on the newest span judged, the last known one."""

    verdict: int
    ratio: float
    z: float
    n: int
    reason: str
    numbers: dict[str, float] = field(default_factory=dict)
    log_var: float = 0.0
    newest_ratio: float | None = None


def transfer(tally: Tally, k_from: int, k_to: int) -> Tally:
    """A tally measured at ``k_from`` draft tokens as the tally expected at ``k_to``: the
    per-token acceptance its tokens per step imply (Leviathan's formula), at the other k.
    Each request's tokens scale by one factor, so the relative dispersion is kept."""
    per_step = tally.per_step
    if per_step is None or k_from == k_to:
        return tally
    a = draft_rate_to_token_rate((per_step - 1.0) / k_from, k_from)
    f = expected_tokens_per_step(a, k_to) / per_step
    return replace(
        tally, tokens=tally.tokens * f, tok_sq=tally.tok_sq * f * f, tok_step=tally.tok_step * f
    )


def _pooled(tally: Tally, prior: float = PRIOR_DISPERSION) -> float:
    """The span's own dispersion, pooled with ``prior`` (a span that mixes two regimes is
    dispersed, so a collapse is judged on the newest requests, not through the mix)."""
    seen = tally.dispersion()
    if seen is None:
        return prior
    weight = PRIOR_WEIGHT + tally.n - 1
    return (PRIOR_WEIGHT * prior + (tally.n - 1) * seen) / weight


def dispersion(spans: tuple[Tally, ...]) -> float | None:
    """What a slice's requests on one pool say of their own dispersion: its longest span's,
    pooled with the generic prior, when that is the smaller; the prior of its shorter spans
    (``Rung.dispersion``). A slice whose requests agree closely is judged on a few of its
    newest (one whole probe of a healing can be enough); a slice that varies more, or a window
    that mixes two regimes, is judged as cautiously as one never seen."""
    if not spans or spans[-1].n < PRIOR_WEIGHT:
        return None
    return min(_pooled(spans[-1]), PRIOR_DISPERSION)


@dataclass(frozen=True, slots=True)
class _Side:
    log_cost: float
    log_var: float
    per_step: float
    n: int


def _fixed(rung: Rung, other: Rung) -> _Side | None:
    """A rung's cost from its whole window (or, for a speculative rung it never ran on, from
    another speculative rung's acceptance through Leviathan's formula)."""
    if rung.step is None:
        return None
    base = math.log(rung.step.seconds * rung.price)
    if rung.k is None:
        return _Side(base, rung.step.log_var, 1.0, 0)
    if rung.spans and rung.spans[-1].per_step is not None:
        tally = rung.spans[-1]
        per_step = tally.per_step or 1.0
        var = rung.step.log_var + _pooled(tally) / tally.n + rung.extra_var
        return _Side(base - math.log(per_step), var, per_step, tally.n)
    if not other.spans or other.k is None:
        return None
    return _carried(rung, other, other.spans[-1])


def _carried(rung: Rung, other: Rung, tally: Tally) -> _Side | None:
    """A speculative rung's cost from the acceptance ``tally`` of ``other`` implies."""
    source = tally.per_step
    if source is None or other.k is None or rung.k is None or rung.step is None:
        return None
    a = draft_rate_to_token_rate((source - 1.0) / other.k, other.k)
    per_step = expected_tokens_per_step(a, rung.k)
    var = rung.step.log_var + TRANSFER_LOG_VAR + _pooled(tally) / tally.n + other.extra_var
    base = math.log(rung.step.seconds * rung.price)
    return _Side(base - math.log(per_step), var, per_step, 0)


def judge(
    upper: Rung,
    lower: Rung,
    *,
    min_samples: int,
    confidence: float,
    max_n: int | None = None,
) -> Judgement | None:
    """Is ``upper`` or ``lower`` cheaper per output token? None without evidence: no step
    time for a rung, or fewer than ``min_samples`` measured requests where they are needed.
    ``max_n`` limits the spans to the newest ``max_n`` requests (a probe round's own). A
    longer span decides only the way the newest one leans: older requests that say
    otherwise predate a change the newest already show."""
    subject, other = (upper, lower) if upper.spans or not lower.spans else (lower, upper)
    if subject.step is None or other.step is None or not subject.spans:
        return None
    fixed = _fixed(other, subject)
    if fixed is None:
        return None
    z_needed = NormalDist().inv_cdf(confidence)
    base = math.log(subject.step.seconds * subject.price)
    sign = 1.0 if subject is upper else -1.0
    last: Judgement | None = None
    newest: float | None = None
    leans = 0.0
    for tally in subject.spans:
        per_step = tally.per_step
        if per_step is None or tally.n < min_samples or (max_n is not None and tally.n > max_n):
            continue
        if other.k is not None and not other.spans and subject.k is not None:
            # carried over from the subject: from the same requests, not its whole window
            fixed = _carried(other, subject, tally) or fixed
        spread = subject.dispersion_of(tally)
        var = subject.step.log_var + spread / tally.n + subject.extra_var + fixed.log_var
        if subject.k is None:
            per_step, var = 1.0, subject.step.log_var + fixed.log_var
        var -= 2.0 * subject.shared_with(other.pool)
        diff = sign * (base - math.log(per_step) - fixed.log_cost)
        z = diff / math.sqrt(max(var, 1e-12))
        verdict = -1 if z > z_needed else 1 if z < -z_needed else 0
        leans = leans or diff
        if verdict and verdict * leans > 0:  # older requests against the newest ones
            verdict = 0
        up_steps = per_step if subject is upper else fixed.per_step
        down_steps = fixed.per_step if subject is upper else per_step
        newest = math.exp(diff) if newest is None else newest
        last = _judgement(
            verdict, diff, z, tally.n, upper, lower, up_steps, down_steps, var, newest
        )
        if verdict:
            return last
    return last


def _judgement(
    verdict: int,
    diff: float,
    z: float,
    n: int,
    upper: Rung,
    lower: Rung,
    up_steps: float,
    down_steps: float,
    var: float,
    newest: float | None = None,
) -> Judgement:
    ratio = math.exp(diff)
    assert upper.step is not None and lower.step is not None
    numbers = {
        "cost_ratio": ratio,
        "z": z,
        "requests": float(n),
        "tokens_per_step": up_steps,
        "tokens_per_step_below": down_steps,
        "step_ms": upper.step.seconds * 1000,
        "step_ms_below": lower.step.seconds * 1000,
    }
    below_step = "prior" if not lower.step.learned else "learned"
    carried = upper.transferred or lower.transferred
    told = " (acceptance carried over from another rung)" if carried else ""
    reason = (
        f"{upper.pool} costs {ratio:.2f}x {lower.pool} per token{told} "
        f"(z {z:+.1f} over {n} requests: {up_steps:.2f} vs {down_steps:.2f} tokens per step, "
        f"step {upper.step.seconds * 1000:.1f} vs {lower.step.seconds * 1000:.1f} ms "
        f"[{below_step}])"
    )
    return Judgement(verdict, ratio, z, n, reason, numbers, var, newest)


def span_targets(min_samples: int) -> tuple[int, ...]:
    return tuple(min_samples * f for f in SPAN_FACTORS)


def leaning(judged: Judgement | None, unseen: bool = False) -> float:
    """The share of a slice to serve one rung down while the judge leans that way but is not
    sure (``judged``: the serving rung against the next one down): the probability that the
    lower rung is the cheaper one, less even odds, at most ``LEAN_MAX``, in steps of 1%;
    ``LEAN_UNSEEN`` while that rung's pool has too few observations of its own to be learned
    (``unseen``).

    A lower pool that serves nothing is seen only at the batch of the few requests explored
    there, and its step time at the ladder's load is then an extrapolation the judge rightly
    doubts; a share of the slice served there loads it to where it is judged, and costs
    nothing in expectation, since the judge already finds it cheaper on the point estimate.
    The cap keeps the slice mostly where it is until the judge is sure. A pool never seen is
    known only through the others' curves, and most of that doubt is one factor for the
    whole curve (other hardware, another engine build), which one observation of it settles:
    half the slice goes there until it is learned, so that the first observation comes
    within about one of the slice's requests, not one in several."""
    if judged is None or judged.verdict != 0 or judged.z <= 0:
        return 0.0
    if unseen:
        return LEAN_UNSEEN
    return round(min(LEAN_MAX, NormalDist().cdf(judged.z) - 0.5), 2)


def hinges(judged: Judgement | None, lower: StepTime | None, rate: float, cost: float) -> bool:
    """Are observations of the lower rung's pool worth their ``cost`` (request-equivalents
    a second) to decide ``judged``, the serving rung against it, for a slice of ``rate``
    requests a second? Always while that pool has too few observations of its own to be
    learned. Otherwise when the judgement is undecided, the lower rung is within one
    standard deviation of being cheaper, its step time is the larger part of the doubt (more
    requests of the slice itself would not settle it), and what knowing it would save is
    worth it: the expected gain of moving once its doubt is gone (the positive part of a
    log cost ratio whose spread is that doubt), per request, times the slice's rate, at
    least ``cost``. A slice at the line has little to gain whichever way it goes."""
    if lower is None or not lower.learned:
        return True
    if judged is None or judged.verdict != 0 or judged.z < -1.0:
        return False
    if lower.log_var < judged.log_var - lower.log_var:
        return False
    mu, sd = math.log(judged.ratio), math.sqrt(max(lower.log_var, 1e-12))
    normal = NormalDist()
    gain = sd * normal.pdf(mu / sd) + mu * normal.cdf(mu / sd)
    return gain * rate >= cost


def exploring(
    judged: Judgement | None,
    lower: StepTime | None,
    rate: float,
    *,
    live: bool,
    cost: float,
    prefill: float | None = None,
) -> tuple[bool, float]:
    """How a slice explores the rung below (``judged``: the serving rung against it, ``lower``
    its step time, ``rate`` the slice's requests a second): whether it asks for the pool's
    budget of observations, and the share of its own requests it serves there (``leaning``).
    ``live``: explored requests may be served there, where the point estimate finds that
    pool at least as cheap, and so cost nothing in expectation: the lean is then worth it
    whatever the slice's rate, and its own requests are the observations. Otherwise each is a
    mirror of ``cost`` (request-equivalents a second, the budget's), asked for only when
    knowing is worth that (``hinges``).

    ``prefill``: what one of the slice's requests prefills on the rung below beyond what it
    would at home, as a share of its decode cost at home (None while unknown). A pool not
    yet learned gets the larger lean (``LEAN_UNSEEN``) only where that is less than what the
    point estimate saves there: not for a conversation's turns, cached at home and
    re-prefilled below."""
    unseen = lower is None or not lower.learned
    if unseen and (prefill is None or judged is None or prefill > 1.0 - 1.0 / judged.ratio):
        unseen = False
    lean = leaning(judged, unseen) if live and hinges(judged, lower, rate, 0.0) else 0.0
    if lean:
        return False, lean
    return hinges(judged, lower, rate, cost), 0.0


def log_tokens_per_step(tally: Tally) -> tuple[float, float] | None:
    """log L of a tally and the variance of that estimate (its dispersion pooled with the
    prior, over its requests), as ``judge`` weighs it; None without tokens or steps."""
    per_step = tally.per_step
    if per_step is None or tally.n < 1:
        return None
    return math.log(per_step), _pooled(tally) / tally.n
