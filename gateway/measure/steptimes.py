"""Part of step 7 (feedback): each pool's step time as a function of what its steps compute,
and the exploration that keeps a pool's curve fed while some slice's judgement hinges on it.

Every outcome teaches the curve of the pool that served it (``policies/stepcurve.py``),
whichever slice sent it: decode seconds over decode steps, at the requests decoding on its
endpoint meanwhile, the tokens they verified, the prompts the endpoint's cache held and the
prompt tokens prefilled beside them (``gateway/measure/load.py``); so does an engine's own
mean step between two readings of its counters (``learn_engine``). A slice asks for the
decode step at the ladder's load and its own context (``at``). The ladder's curves are
computed together (one knee), at most every ``LINE_FRESH_S``, with their joint posterior
(``policies/stepjoint.py``), which says how far two pools' doubts at a slice's step are one
(``correlation``). Each outcome also feeds the
batch-only line of ``policies/steptime.py``, which ``/admin`` shows. O(1) per outcome;
never awaits. A ladder's curves are the same for every slice that asks at about the same
time (again as soon as a pool is seen for the first time): a curve moves by a fraction of
its own doubt in that time.

Exploration: a pool that serves no slice is not observed, and its line goes stale. While
some slice's judgement hinges on it (``policies/economics.py: hinges``), a share of the
requests of every slice served just above it goes to it: live where that slice's own
judgement says the pool is at least as cheap on the point estimate, mirrored otherwise
(short: ``probe_tokens`` output tokens, enough steps to time). A slice that leans towards
the pool serves its own lean there instead, which costs nothing in expectation
(``policies/economics.py: exploring``). The budget is per pool, not per slice:
``EXPLORE_PER_MINUTE`` observations a minute over all those slices, so a quiet slice's
question is answered by busy traffic too, and never more than a slice's ``probe_fraction``.
Each replica explores on its own (its budget is its own).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gateway.measure.acceptance import Outcome, Status
from policies.compiled import Ladder
from policies.stepcurve import Curve, CurveFit, decode_step, ladder, prefill_weight
from policies.stepjoint import Joint, joint
from policies.steptime import MIN_OBSERVATIONS, Line, StepFit, StepTime, combine, transfer

EXPLORE_PER_MINUTE = 4.0
NEED_FRESH_S = 60.0  # a slice that said it needs a pool this long ago no longer counts
LINE_FRESH_S = 0.25
CONTEXT_EWMA = 0.05  # a pool's mean context: each outcome's share of the running mean


def context_of(outcome: Outcome) -> float:
    """The cached tokens a request holds on average while it decodes: its prompt and half
    its answer."""
    return outcome.prompt_tokens + outcome.completion_tokens / 2.0


@dataclass(slots=True)
class _Kept:
    """A ladder's curves as computed ``at``, from ``fits``; their joint posterior computed
    only once a judgement asks for it."""

    at: float
    fits: list[CurveFit | None]
    curves: list[Curve | None]
    ks: tuple[int | None, ...]
    draft_cost: float
    _joint: Joint | None = None
    _joined: bool = False

    def joint(self) -> Joint | None:
        if not self._joined:
            self._joint = joint(self.fits, self.curves, self.ks, self.draft_cost, self.at)
            self._joined = True
        return self._joint


@dataclass(slots=True)
class _Giver:
    """A slice served just above a pool: its requests a second, and when it said so."""

    rate: float
    at: float


class StepTimes:
    """The pools' step-time lines and the exploration budget (module docstring)."""

    def __init__(self) -> None:
        self.fits: dict[str, StepFit] = {}
        self._needed: dict[str, float] = {}
        self._givers: dict[str, dict[str, _Giver]] = {}
        self._lines: dict[tuple[tuple[str, ...], int, float], tuple[float, Line | None]] = {}
        self.curves: dict[str, CurveFit] = {}
        self.contexts: dict[str, float] = {}
        self._curves: dict[tuple[tuple[str, ...], float], _Kept] = {}

    def learn(self, outcome: Outcome, now: float) -> None:
        steps, load = outcome.steps, outcome.load
        if outcome.status is not Status.OK or not steps or steps < 2 or not load:
            return
        # an answer passed through whole without vLLM's timings shows only its duration:
        # counted as its steps plus one for prefill (queueing makes it read high on both
        # pools alike)
        per_step = (
            outcome.decode_s / steps if outcome.decode_s else outcome.duration_s / (steps + 1)
        )
        fit = self.fits.get(outcome.labels.pool)
        if fit is None:
            per_seq = (outcome.labels.k or 0) + 1
            fit = self.fits[outcome.labels.pool] = StepFit(tokens_per_seq=per_seq)
            self._lines.clear()
        fit.add(now, load, per_step, prefill=outcome.prefill or 0.0)
        self._learn_curve(outcome, per_step, load, now)

    def _learn_curve(self, outcome: Outcome, per_step: float, load: float, now: float) -> None:
        """The step as the curve sees it: the requests decoding on the endpoint while this
        one did (``batch``; queued ones are not in a step), verifying k + 1 tokens each and
        reading the prompts the endpoint's cache held (``kv``) plus half an answer each;
        without those, ``load`` sequences, the request's own context and the pool's mean
        context for the others."""
        pool, k = outcome.labels.pool, outcome.labels.k
        own = context_of(outcome)
        mean = self.contexts.get(pool)
        mean = own if mean is None else mean + CONTEXT_EWMA * (own - mean)
        self.contexts[pool] = mean
        curve = self.curves.get(pool)
        if curve is None:
            curve = self.curves[pool] = CurveFit(k=k)
            self._curves.clear()
        if outcome.kv is not None and outcome.batch:  # the endpoint's cache and batch
            seqs = outcome.batch
            kv = max(outcome.kv, outcome.prompt_tokens) + seqs * outcome.completion_tokens / 2
        else:
            seqs = load
            kv = own + max(load - 1.0, 0.0) * mean
        tokens, prefill = seqs * ((k or 0) + 1), outcome.prefill or 0.0
        weight = prefill_weight(tokens, prefill)
        curve.add(now, per_step, tokens=tokens, seqs=seqs, kv=kv, prefill=prefill, weight=weight)

    def learn_engine(
        self, pool: str, k: int | None, seconds: float, batch: float, prefill: float, now: float
    ) -> None:
        """An engine's own mean step between two readings of its counters
        (``enginesteps.py``) at ``batch`` requests running, of the pool's mean context."""
        curve = self.curves.get(pool)
        if curve is None:
            curve = self.curves[pool] = CurveFit(k=k)
            self._curves.clear()
        kv = batch * self.contexts.get(pool, 0.0)
        tokens = batch * ((k or 0) + 1)
        curve.add(now, seconds, tokens=tokens, seqs=batch, kv=kv, prefill=prefill)

    def ladder_curves(self, ladder_: Ladder, draft_cost: float, now: float) -> list[Curve | None]:
        """Every pool's curve of ``ladder_`` (``policies/stepcurve.py``: one knee for the
        ladder, each pool under the others' prior), at most every ``LINE_FRESH_S``."""
        return self._kept(ladder_, draft_cost, now).curves

    def _kept(self, ladder_: Ladder, draft_cost: float, now: float) -> _Kept:
        key = (ladder_.pools, draft_cost)
        kept = self._curves.get(key)
        if kept is not None and 0.0 <= now - kept.at < LINE_FRESH_S:
            return kept
        fits = [self.curves.get(p) for p in ladder_.pools]
        curves = ladder(fits, ladder_.k, draft_cost, now)
        kept = self._curves[key] = _Kept(now, fits, curves, ladder_.k, draft_cost)
        return kept

    def line(self, ladder: Ladder, i: int, draft_cost: float, now: float) -> Line | None:
        """Pool ``i``'s line: its own observations under the prior the others give."""
        key = (ladder.pools, i, draft_cost)
        kept = self._lines.get(key)
        if kept is not None and 0.0 <= now - kept[0] < LINE_FRESH_S:
            return kept[1]
        line = self._line(ladder, i, draft_cost, now)
        self._lines[key] = (now, line)
        return line

    def _line(self, ladder: Ladder, i: int, draft_cost: float, now: float) -> Line | None:
        own: dict[int, Line] = {}
        for j, pool in enumerate(ladder.pools):
            fit = self.fits.get(pool)
            line = fit.line(now) if fit is not None else None
            if line is not None and line.observations >= MIN_OBSERVATIONS:
                own[j] = line
        prior = combine(
            transfer(line, ladder.k[j], ladder.k[i], draft_cost)
            for j, line in own.items()
            if j != i
        )
        fit = self.fits.get(ladder.pools[i])
        return prior if fit is None else fit.line(now, prior)

    def at(
        self,
        ladder: Ladder,
        i: int,
        load: float | None,
        draft_cost: float,
        now: float,
        context: float | None = None,
    ) -> StepTime | None:
        """Pool ``i``'s decode step at ``load`` sequences (None: at the batch it was observed
        at) of ``context`` cached tokens each (None: the ladder's mean context): the step a
        slice of that context pays on it, at the batch it would join."""
        curve = self.ladder_curves(ladder, draft_cost, now)[i]
        if curve is None:
            return None
        return curve.at(*self._point(ladder, i, load, now, context))

    def correlation(
        self,
        ladder: Ladder,
        i: int,
        j: int,
        load: float | None,
        draft_cost: float,
        now: float,
        context: float | None = None,
    ) -> float:
        """The correlation of pools ``i``'s and ``j``'s steps where ``at`` asks for them
        (``policies/stepjoint.py``): how far one curve's doubt there is the other's."""
        found = self._kept(ladder, draft_cost, now).joint()
        if found is None:
            return 0.0
        step_i = decode_step(*self._point(ladder, i, load, now, context), ladder.k[i])
        step_j = decode_step(*self._point(ladder, j, load, now, context), ladder.k[j])
        return found.rho(i, step_i, j, step_j)

    def _point(
        self, ladder: Ladder, i: int, load: float | None, now: float, context: float | None
    ) -> tuple[float, float]:
        """The batch and context ``at`` asks pool ``i``'s curve for."""
        fit = self.fits.get(ladder.pools[i])
        batch = load if load is not None else (fit and fit.mean_batch(now)) or 1.0
        if context is None:
            known = [c for p in ladder.pools if (c := self.contexts.get(p)) is not None]
            context = sum(known) / len(known) if known else 0.0
        return batch, context

    def mean_batch(self, ladder: Ladder, now: float) -> float | None:
        """The batch the ladder's pools were observed at, when no load meter says."""
        means = [
            m
            for p in ladder.pools
            if (f := self.fits.get(p)) is not None and (m := f.mean_batch(now)) is not None
        ]
        return sum(means) / len(means) if means else None

    def explore_share(
        self, pool: str, slice_key: str, rate: float, hinged: bool, cap: float, now: float
    ) -> float:
        """The share of ``slice_key``'s requests (``rate`` a second, served on the rung just
        above ``pool``) to send to ``pool``: nothing unless some slice's judgement hinged on
        it within ``NEED_FRESH_S``, else the pool's budget split over every slice above it
        (the observations need not come from the slice that needs them), at most ``cap``."""
        if hinged:
            self._needed[pool] = now
        givers = self._givers.setdefault(pool, {})
        givers[slice_key] = _Giver(rate, now)
        if now - self._needed.get(pool, -math.inf) > NEED_FRESH_S:
            return 0.0
        for key in [k for k, g in givers.items() if g.at < now - NEED_FRESH_S]:
            del givers[key]
        total = sum(g.rate for g in givers.values())
        share = EXPLORE_PER_MINUTE / 60.0 / max(total, 1e-9)
        return round(min(share, cap), 3)

    def summary(self, pool: str, now: float) -> dict[str, float | None]:
        """A pool's line for the admin API: its own observations (decayed), where they
        were taken, the step there, and the line's two parts."""
        fit = self.fits.get(pool)
        line = fit.line(now) if fit is not None else None
        if fit is None or line is None:
            return {
                "observations": 0.0,
                "mean_batch": None,
                "step_ms_at_mean_batch": None,
                "fixed_ms": None,
                "per_sequence_ms": None,
                "per_prefill_token_ms": None,
            }
        batch = fit.mean_batch(now)
        return {
            "observations": round(fit.weight(now), 1),
            "mean_batch": batch,
            "step_ms_at_mean_batch": line.at(batch or 1.0).seconds * 1000,
            "fixed_ms": line.a * 1000,
            "per_sequence_ms": line.b * 1000,
            "per_prefill_token_ms": line.c * 1000,
        }
