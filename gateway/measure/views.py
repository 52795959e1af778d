"""What operators read of live statistics: the admin API's slices and pools
(``/admin/stats``, the demo) and the guardrail gauges of a metrics scrape
(``collectors.py``); and the prices of moving a conversation between pools, asked on the
request path only when a cached conversation's slice is served on another pool now
(``gateway/forward/moving.py``). Reads, and changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import NamedTuple

from backends.placement import Costs
from gateway.measure.judging import Judge
from gateway.measure.slices import Slices
from policies.compiled import CompiledPolicy
from policies.guardrail import SliceState
from policies.splitting import split_json


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

    def splits(self, now: float) -> dict[str, dict[str, object]]:
        """Every slice split by application, as a tree: what it split by and why, and
        each child's rung, state and seconds per output token on each rung it can tell."""
        policy = self._policy()
        out: dict[str, dict[str, object]] = {}
        for parent, split in self._slices.splits.items():
            children = []
            for slot, key in enumerate(split.children(), start=1):
                entry = self._slices.records.get(key)
                place = entry and policy.placement(entry.rule, entry.model)
                children.append(
                    {
                        "slice": key,
                        "value": split.values[slot - 1],
                        "rung": entry.rungs(place or None)["rung"] if entry else None,
                        "offset": entry.state.offset if entry else 0,
                        "phase": entry.state.phase.value if entry else "on",
                        "seconds_per_token": self.seconds_per_token(key, now),
                    }
                )
            out[parent] = {**split_json(split), "children": children}
        return out

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

    def prefill_seconds_per_token(self, key: str, now: float) -> dict[str, float]:
        """Seconds of engine step time per prompt token prefilled, on each rung of the
        slice's ladder whose step time is known (the ``c`` of ``policies/steptime.py``)."""
        entry = self._slices.records.get(key)
        place = entry and self._policy().placement(entry.rule, entry.model)
        if entry is None or not place:
            return {}
        ladder, draft = place.ladder, place.guardrail.draft_cost_ratio
        out = {}
        for i, pool in enumerate(ladder.pools):
            line = self._judge.steps.line(ladder, i, draft, now)
            if line is not None:
                out[pool] = line.c
        return out

    def placement_costs(self, key: str, tokens_per_turn: float, now: float) -> dict[str, Costs]:
        """What weighs a cached endpoint's load against re-prefilling a conversation of the
        slice elsewhere (``backends/placement.py``), on each rung whose step time is known:
        its seconds per prompt token prefilled, its decode step at a batch (at the ladder's
        mean context) and the steps a turn of ``tokens_per_turn`` output tokens takes there
        (at the slice's tokens per step)."""
        entry = self._slices.records.get(key)
        place = entry and self._policy().placement(entry.rule, entry.model)
        if entry is None or not place:
            return {}
        ladder, draft, steps = place.ladder, place.guardrail.draft_cost_ratio, self._judge.steps
        prefill = self.prefill_seconds_per_token(key, now)
        out = {}
        for i, pool in enumerate(ladder.pools):
            per_step = 1.0 if ladder.k[i] is None else entry.counts(pool, now).tokens_per_step
            if pool not in prefill or not per_step or steps.at(ladder, i, 1.0, draft, now) is None:
                continue

            def step_s(batch: float, i: int = i) -> float:
                step = steps.at(ladder, i, batch, draft, now)
                return 0.0 if step is None else step.seconds

            out[pool] = Costs(prefill[pool], step_s, tokens_per_turn / per_step)
        return out

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
