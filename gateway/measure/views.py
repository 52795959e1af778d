"""What operators read of live statistics: the admin API's slices and pools
(``/admin/stats``, the demo) and the guardrail gauges of a metrics scrape
(``collectors.py``). Reads; never on the request path, and changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import NamedTuple

from gateway.measure.judging import Judge
from gateway.measure.slices import Slices
from policies.compiled import CompiledPolicy
from policies.guardrail import SliceState


class Served(NamedTuple):
    """A slice kept, its rule, its guardrail state, and the pool it is served on now (None
    when its rule or model is gone)."""

    slice: str
    rule: str
    state: SliceState
    pool: str | None


class Views:
    """Read-only views over one gateway's live statistics."""

    __slots__ = ("_judge", "_policy", "_slices", "_unattributed")

    def __init__(
        self,
        slices: Slices,
        judge: Judge,
        policy: Callable[[], CompiledPolicy],
        unattributed: dict[str, int],
    ) -> None:
        self._slices = slices
        self._judge = judge
        self._policy = policy
        self._unattributed = unattributed

    def summary(self, now: float) -> dict[str, dict[str, object]]:
        """Every slice's state and per-pool window, for the admin API and the demo; ``rung``
        is the pool the slice is served on now (None when its rule or model is gone)."""
        policy = self._policy()
        return {
            key: entry.view(now, policy.placement(entry.rule, entry.model))
            for key, entry in self._slices.records.items()
        }

    def pool_summary(self, now: float) -> dict[str, dict[str, object]]:
        """Per pool: its learned step time, and how often its counters could not be told
        apart between slices (acceptance signal 3)."""
        steps = self._judge.steps
        names = set(steps.fits) | set(self._unattributed)
        for ladder in self._policy().ladders.values():
            names |= set(ladder.pools)
        return {
            pool: {
                "step_time": steps.summary(pool, now),
                "counters_unattributed": self._unattributed.get(pool, 0),
            }
            for pool in sorted(names)
        }

    def every(self) -> Iterator[Served]:
        """Every slice kept, for the state gauges."""
        policy = self._policy()
        for key, entry in self._slices.records.items():
            place = policy.placement(entry.rule, entry.model)
            yield Served(key, entry.rule, entry.state, entry.rungs(place)["rung"])

    def seconds_per_token(self, key: str, now: float) -> dict[str, float]:
        """The guardrail's estimate of endpoint-seconds per output token of one slice on each
        rung it can tell, at the ladder's load: step_time(B) / (L x B), ``L`` the slice's
        tokens per step there (1 on a standard pool). Times ``cost_per_hour`` / 3600 it is
        the cost per output token that the economic guardrail compares."""
        entry = self._slices.records.get(key)
        place = entry and self._policy().placement(entry.rule, entry.model)
        if entry is None or not place:
            return {}
        ladder = place.ladder
        load = self._judge.load(ladder, now) or 1.0
        out = {}
        for i, pool in enumerate(ladder.pools):
            per_step = 1.0 if ladder.k[i] is None else entry.counts(pool, now).tokens_per_step
            step = self._judge.steps.at(ladder, i, load, place.guardrail.draft_cost_ratio, now)
            if step is not None and per_step:
                out[pool] = step.seconds / (per_step * load)
        return out
