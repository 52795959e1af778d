"""Step 7 of a request: feedback. Outcomes -> per-slice windows -> guardrail transitions.

``record`` is O(1) and never awaits: it adds the outcome to its slice's window for the pool
that served it and steps that slice's guardrail. ``tick`` (called about once a second by a
background task) steps slices waiting out a cooldown. ``guards`` is an immutable snapshot
of every slice not in its initial state, replaced (never mutated) on each transition, so a
decision reads it without locks or awaits.

Windows are kept per (slice, guardrail epoch, pool). A transition starts a new epoch, so
only evidence gathered since the slice entered its phase is judged; outcomes of requests
decided in an older epoch still count in metrics but not in the guardrail.

Memory: at most ``max_slices`` slices are kept, least recently used evicted first. An
evicted slice forgets its state and starts again on its rule's start rung, the same as a
slice never seen; with the default cap (10,000) and 24 buckets of 7 numbers per window,
that is a few tens of MB at worst.
"""

from __future__ import annotations

import logging
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from gateway.acceptance import Outcome, Status
from gateway.windows import Counts, Window
from policies.compiled import CompiledPolicy, CompiledRule, Ladder
from policies.guardrail import (
    ON_START,
    Evidence,
    Phase,
    Rung,
    SliceState,
    Transition,
    judged_rung,
    step,
)
from policies.model import SHADOW

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Slice:
    model: str
    rule: str
    state: SliceState = ON_START
    windows: dict[str, Window] = field(default_factory=dict)


class LiveStats:
    """Per-slice windows and guardrail states for one gateway process."""

    def __init__(
        self,
        policy: Callable[[], CompiledPolicy],
        *,
        max_slices: int = 10_000,
        max_events: int = 1_000,
        on_transition: Callable[[Transition], None] | None = None,
    ) -> None:
        self._policy = policy
        self._max_slices = max_slices
        self._slices: OrderedDict[str, _Slice] = OrderedDict()
        self._on_transition = on_transition
        self.events: deque[Transition] = deque(maxlen=max_events)
        self.guards: Mapping[str, SliceState] = MappingProxyType({})

    def record(self, outcome: Outcome, now: float) -> None:
        labels = outcome.labels
        entry = self._touch(labels.slice, labels.model, labels.rule)
        if labels.epoch != entry.state.version or outcome.status is Status.CANCELLED:
            return
        policy = self._policy()
        found = _rule_and_ladder(policy, labels.rule, labels.model)
        if found is None:
            return
        rule, _ = found
        window = entry.windows.get(labels.pool)
        if window is None or window.window_s != rule.guardrail.window_s:
            window = entry.windows[labels.pool] = Window(rule.guardrail.window_s)
        _add(window.bucket(now), outcome)
        self._step(labels.slice, entry, policy, now)

    def tick(self, now: float) -> None:
        """Step every slice that is not on its start rung (cooldowns end with time alone)."""
        policy = self._policy()
        for key in list(self.guards):
            entry = self._slices.get(key)
            if entry is not None:
                self._step(key, entry, policy, now)

    def evidence(self, key: str, pool: str, now: float) -> Counts:
        entry = self._slices.get(key)
        window = entry.windows.get(pool) if entry else None
        return window.total(now) if window else Counts()

    def summary(self, now: float) -> dict[str, dict[str, object]]:
        """Every slice's state and per-pool window, for the admin API and the demo."""
        out: dict[str, dict[str, object]] = {}
        for key, entry in self._slices.items():
            pools = {}
            for pool, window in entry.windows.items():
                c = window.total(now)
                pools[pool] = {
                    "requests": c.requests,
                    "measured": c.measured,
                    "acceptance": c.acceptance,
                    "tpot_s": c.tpot,
                    "errors": c.errors,
                }
            state = entry.state
            out[key] = {
                "rule": entry.rule,
                "model": entry.model,
                "offset": state.offset,
                "phase": state.phase.value,
                "pools": pools,
            }
        return out

    def _touch(self, key: str, model: str, rule: str) -> _Slice:
        entry = self._slices.get(key)
        if entry is None:
            entry = self._slices[key] = _Slice(model, rule)
            if len(self._slices) > self._max_slices:
                evicted, _ = self._slices.popitem(last=False)
                if evicted in self.guards:
                    self._publish()
        else:
            self._slices.move_to_end(key)
        return entry

    def _step(self, key: str, entry: _Slice, policy: CompiledPolicy, now: float) -> None:
        found = _rule_and_ladder(policy, entry.rule, entry.model)
        if found is None or found[0].rule.start == SHADOW:
            return
        rule, ladder = found
        start = ladder.index(rule.rule.start)
        standard = len(ladder.pools) - 1
        judged = start + judged_rung(entry.state)
        if not start <= judged <= standard:
            return
        serving = min(start + entry.state.offset, standard)
        evidence = self._evidence(entry, ladder, judged, now)
        state, transition = step(
            key,
            entry.state,
            evidence,
            Rung(ladder.k[judged]),
            standard - serving,
            rule.guardrail,
            now,
        )
        if transition is not None:
            self._apply(key, entry, state, transition)

    def _evidence(self, entry: _Slice, ladder: Ladder, judged: int, now: float) -> Evidence:
        window = entry.windows.get(ladder.pools[judged])
        counts = window.total(now) if window else Counts()
        speedup = None
        standard = entry.windows.get(ladder.pools[-1])
        if standard is not None and judged != len(ladder.pools) - 1:
            base = standard.total(now)
            if counts.tpot is not None and base.tpot is not None and base.tpot_n >= 5:
                speedup = base.tpot / counts.tpot
        samples = counts.measured or counts.tpot_n
        return Evidence(samples, counts.acceptance, speedup)

    def _apply(self, key: str, entry: _Slice, state: SliceState, transition: Transition) -> None:
        entry.state = state
        entry.windows.clear()
        self.events.append(transition)
        log.info("guardrail %s: %s -> %s: %s", key, transition.before, state, transition.reason)
        self._publish()
        if self._on_transition is not None:
            self._on_transition(transition)

    def _publish(self) -> None:
        self.guards = MappingProxyType(
            {k: s.state for k, s in self._slices.items() if s.state != ON_START}
        )

    def alarm(self, key: str, reason: str, numbers: dict[str, float], now: float) -> None:
        """An outside signal that speculation is wrong for a slice (the shadow canary): fall
        back one rung when the slice is on a speculative one; log the event either way."""
        entry = self._slices.get(key)
        if entry is None:
            return
        found = _rule_and_ladder(self._policy(), entry.rule, entry.model)
        state = entry.state
        if found is not None and found[0].rule.start != SHADOW:
            rule, ladder = found
            start = ladder.index(rule.rule.start)
            if start + state.offset < len(ladder.pools) - 1:
                after = SliceState(state.offset + 1, Phase.FALLEN_BACK, now, state.version + 1)
                self._apply(key, entry, after, Transition(key, now, state, after, reason, numbers))
                return
        self.events.append(Transition(key, now, state, state, reason, numbers))

    def adopt(self, key: str, model: str, rule: str, state: SliceState) -> None:
        """Take a state decided elsewhere (another replica); local windows restart with it."""
        entry = self._touch(key, model, rule)
        if state.version > entry.state.version:
            entry.state = state
            entry.windows.clear()
            self._publish()


def _add(counts: Counts, outcome: Outcome) -> None:
    counts.requests += 1
    if outcome.status is not Status.OK:
        counts.errors += 1
        return
    if outcome.drafted:
        counts.measured += 1
        counts.drafted += outcome.drafted
        counts.accepted += outcome.accepted
    if outcome.tpot_s is not None:
        counts.tpot_sum += outcome.tpot_s
        counts.tpot_n += 1


def _rule_and_ladder(
    policy: CompiledPolicy, rule_name: str, model: str
) -> tuple[CompiledRule, Ladder] | None:
    rule = policy.rule(rule_name)
    ladder = policy.ladders.get(model)
    return None if rule is None or ladder is None else (rule, ladder)
