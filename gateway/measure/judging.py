"""What a slice's evidence says, as the guardrail's step needs it (step 7): live statistics
turned into the judgements of ``policies/economics.py`` (economic mode) or into windowed
``Evidence`` (threshold mode). Reads; changes nothing but the step-time cache.

Economic mode: a slice is judged against every rung below the one serving it, at the
ladder's load (``load(model, now)``: the mean requests in flight per endpoint over the
model's whole ladder, which does not move when a slice moves between rungs), and the judge
weighs recent requests first. A serving rung it has no evidence on yet is judged by the
nearest speculative rung's tokens per step carried over to its k. While the slice probes
the rung above, the newest probes are judged alone too (1, 2, 4, 8, 16 of them), so probes
taken during a collapse do not hold back a recovery.

Each pool's step time as a function of its batch is learned from every outcome it served,
whichever slice sent it (``steptimes.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from gateway.measure.slicerecord import SliceRecord, newest_tallies
from gateway.measure.steptimes import StepTimes
from gateway.measure.windows import spans
from policies.compiled import CompiledPolicy, Ladder, Placement
from policies.economics import (
    Judgement,
    Rung,
    Tally,
    dispersion,
    judge,
    span_targets,
    transfer,
)
from policies.guardrail import Economics, Evidence, Latency, Phase
from policies.model import Guardrail
from policies.steptime import StepTime

Load = Callable[[str, float], "float | None"]
_PROBE_SPANS = (1, 2, 4, 8, 16)  # the newest probes, judged alone


@dataclass(frozen=True, slots=True)
class Seen:
    """What ``Judge.seen`` makes of a slice's evidence: ``economics`` for the guardrail's
    step; ``near``, the serving rung against the next one down, and ``lower``, that rung's
    step time (whether exploring it is worth it); ``decided_by``, how many of the newest
    probes the probes' judgement rests on."""

    economics: Economics
    near: Judgement | None
    lower: StepTime | None
    decided_by: int


class Judge:
    """Builds the judgements of one gateway's slices from their records."""

    def __init__(
        self, policy: Callable[[], CompiledPolicy], steps: StepTimes, load: Load | None = None
    ) -> None:
        self._policy = policy
        self._load = load
        self.steps = steps

    def seen(self, entry: SliceRecord, place: Placement, now: float) -> Seen:
        """One slice's judgements at the ladder's load (``Seen``)."""
        ladder, config = place.ladder, place.guardrail
        serving = place.serving(entry.state.offset)
        load = self.load(ladder, now)
        targets = span_targets(config.min_samples)
        rungs = self._shared(
            [
                self._rung(entry, ladder, i, load, targets, config, now, carry=i == serving)
                for i in range(len(ladder.pools))
            ],
            ladder,
            load,
            config,
            entry.context,
            now,
        )
        n, confidence = config.min_samples, config.confidence
        below = above = probes = near = None
        drop = 1
        for j in range(serving + 1, len(ladder.pools)):
            judged = judge(rungs[serving], rungs[j], min_samples=n, confidence=confidence)
            if j == serving + 1:
                below = near = judged
            if judged is None or judged.verdict >= 0:
                continue
            if below is None or below.verdict >= 0 or judged.ratio > below.ratio:
                below, drop = judged, j - serving
        decided_by = 0
        if serving > place.start:
            above = judge(rungs[serving - 1], rungs[serving], min_samples=n, confidence=confidence)
            if entry.state.phase is Phase.PROBING and entry.probes:
                fresh = self._rung(entry, ladder, serving - 1, load, _PROBE_SPANS, config, now)
                own = rungs[serving - 1]
                fresh = replace(
                    fresh,
                    dispersion=own.dispersion,
                    dispersion_tokens=own.dispersion_tokens,
                    shared=own.shared,
                )
                probes = judge(
                    fresh, rungs[serving], min_samples=1, confidence=confidence, max_n=entry.probes
                )
                decided_by = probes.n if probes is not None else 0
        lower = rungs[serving + 1].step if serving + 1 < len(ladder.pools) else None
        latency = self._latency(entry, place, serving, now)
        latency_above = None  # read only under a goal (``step_economic``)
        if config.ttft_p50_s is not None:
            latency_above = self._latency(entry, place, serving - 1, now, climbing=True)
        economics = Economics(
            below, above, probes, drop=drop, latency=latency, latency_above=latency_above
        )
        return Seen(economics, near, lower, decided_by)

    def _latency(
        self,
        entry: SliceRecord,
        place: Placement,
        upper: int,
        now: float,
        *,
        climbing: bool = False,
    ) -> Latency | None:
        """The slice's TTFT p50 on speculative rung ``upper`` and on the rung below it, as
        the latency rule compares them: the upper rung's from the requests it served as the
        slice's rung (carrying the slice's load: ``_carried`` in ``livestats.py``) since the
        slice entered its phase, never from probes taken while it was served below nor from
        before it last came up, and the lower rung's from all of its newest requests.
        ``climbing`` (``upper`` is the rung above the serving one):
        as they would be after the climb, the lower rung's from the requests it served
        without the slice's load (exploration and mirrors from before the fall). Where the
        slice has too few requests in that condition, what bounds it stands in (any
        request on the upper rung, which had at most the slice's load there; every request
        on the lower one, which had at least the slice's load there), so the rule holds a
        climb only where it would fire even on the bound."""
        ladder = place.ladder
        if upper < place.start or upper + 1 >= len(ladder.pools) or ladder.k[upper] is None:
            return None
        n = place.guardrail.min_samples
        up_pool, down_pool = ladder.pools[upper], ladder.pools[upper + 1]
        since = float("-inf") if climbing else entry.state.since
        up = entry.ttft_p50(up_pool, now, n, carried=True, since=since)
        down = None
        if climbing:
            up = up or entry.ttft_p50(up_pool, now, n)
            down = entry.ttft_p50(down_pool, now, n, carried=False)
        down = down or entry.ttft_p50(down_pool, now, n)
        if up is None or down is None:
            return None
        return Latency(up[0], down[0], min(up[1], down[1]))

    def _shared(
        self,
        rungs: list[Rung],
        ladder: Ladder,
        load: float | None,
        config: Guardrail,
        context: float | None,
        now: float,
    ) -> list[Rung]:
        """``rungs`` with the doubt each rung's step time shares with every other's
        (``Rung.shared``)."""
        shared: list[list[tuple[str, float]]] = [[] for _ in rungs]
        for i, rung in enumerate(rungs):
            for j in range(i + 1, len(rungs)):
                other = rungs[j]
                if rung.step is None or other.step is None:
                    continue
                rho = self.steps.correlation(
                    ladder, i, j, load, config.draft_cost_ratio, now, context
                )
                cov = rho * math.sqrt(rung.step.log_var * other.step.log_var)
                shared[i].append((other.pool, cov))
                shared[j].append((rung.pool, cov))
        return [replace(rung, shared=tuple(s)) for rung, s in zip(rungs, shared, strict=True)]

    def _rung(
        self,
        entry: SliceRecord,
        ladder: Ladder,
        i: int,
        load: float | None,
        targets: tuple[int, ...],
        config: Guardrail,
        now: float,
        *,
        carry: bool = False,
    ) -> Rung:
        """Rung ``i`` as the judge sees it. With ``carry`` (the serving rung), a speculative
        rung without evidence of its own takes the nearest speculative rung's, carried over
        to its k; the judge carries evidence over to the other rungs itself."""
        pool = ladder.pools[i]
        tallies = self._tallies(entry, pool, ladder.k[i], targets, now)
        transferred = False
        k = ladder.k[i]
        if carry and k is not None and not tallies:
            for j in sorted(range(len(ladder.pools)), key=lambda j: (abs(j - i), j)):
                other = ladder.k[j]
                if j == i or other is None:
                    continue
                source = self._tallies(entry, ladder.pools[j], other, targets, now)
                if source:
                    tallies = tuple(transfer(t, other, k) for t in source)
                    transferred = True
                    break
        step = self.steps.at(ladder, i, load, config.draft_cost_ratio, now, entry.context)
        policy = self._policy()
        prices = [policy.price(p) for p in ladder.pools if p in policy.pools]
        price = policy.price(pool)
        per_second = price / 3600.0 if price is not None and None not in prices else 1.0
        spread = None if transferred else dispersion(tallies)
        size = tallies[-1].tokens / tallies[-1].n if spread is not None else None
        return Rung(pool, k, per_second, step, tallies, transferred, spread, size)

    def _tallies(
        self, entry: SliceRecord, pool: str, k: int | None, targets: tuple[int, ...], now: float
    ) -> tuple[Tally, ...]:
        if k is None:
            return ()
        recent = entry.newest(pool)
        short = [t for t in targets if t <= len(recent)]
        longer = spans(entry.buckets(pool, now), [t for t in targets if t > len(recent)])
        return newest_tallies(recent, short) + tuple(x for x in longer if x.n > len(recent))

    def load(self, ladder: Ladder, now: float) -> float | None:
        """The load to judge ``ladder`` at: its model's, or else the pools' mean batch."""
        load = self._load(ladder.model, now) if self._load is not None else None
        return max(load, 1.0) if load is not None else self.steps.mean_batch(ladder, now)

    def evidence(self, entry: SliceRecord, ladder: Ladder, rung: int, now: float) -> Evidence:
        """Threshold mode: what the window says of rung ``rung``."""
        counts = entry.counts(ladder.pools[rung], now)
        return Evidence(counts.measured or counts.tpot_n, counts.acceptance)
