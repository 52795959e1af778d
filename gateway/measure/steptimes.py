"""Part of step 7 (feedback): each pool's step time as a function of its batch, and the
exploration that keeps a pool's line fed while some slice's judgement hinges on it.

Every outcome teaches the line of the pool that served it (``policies/steptime.py``),
whichever slice sent it: decode seconds over decode steps, at the outcome's mean load on its
endpoint and the prompt tokens prefilled beside it per step; the line is asked at no
prefill (a decode step). A pool's line is asked for under a prior carried over from the
other pools of its ladder. O(1) per outcome; never awaits. A ladder's lines are the same
for every slice that asks at about the same time, so each is computed at most every
``LINE_FRESH_S`` (and again as soon as a pool is seen for the first time): a line moves by
a fraction of its own doubt in that time.

Exploration: a pool that serves no slice is not observed, and its line goes stale. While
some slice's judgement hinges on it (``policies/economics.py: hinges``), a share of the
requests of every slice served just above it goes to it: live where that slice's own
judgement says the pool is at least as cheap on the point estimate, mirrored otherwise. The
budget is per pool, not per slice: ``EXPLORE_PER_MINUTE`` observations a minute over all
those slices, so a quiet slice's question is answered by busy traffic too, and never more
than a slice's ``probe_fraction``. Each replica explores on its own (its budget is its own).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gateway.measure.acceptance import Outcome, Status
from policies.compiled import Ladder
from policies.steptime import MIN_OBSERVATIONS, Line, StepFit, StepTime, combine, transfer

EXPLORE_PER_MINUTE = 4.0
NEED_FRESH_S = 60.0  # a slice that said it needs a pool this long ago no longer counts
LINE_FRESH_S = 0.25


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
        self, ladder: Ladder, i: int, load: float | None, draft_cost: float, now: float
    ) -> StepTime | None:
        """Pool ``i``'s step time at ``load`` (None: at the batch it was observed at)."""
        line = self.line(ladder, i, draft_cost, now)
        if line is None:
            return None
        fit = self.fits.get(ladder.pools[i])
        batch = load if load is not None else (fit and fit.mean_batch(now)) or 1.0
        return line.at(batch)

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
