"""Step 7 of a request: feedback. Outcomes -> per-slice windows -> guardrail transitions.

``record`` is O(1) and never awaits: it adds the outcome to its slice's window for the pool
that served it and steps that slice's guardrail. ``tick`` (about once a second, from the
lifespan) steps slices waiting out a cooldown. ``guards`` is an immutable snapshot of every
slice not in its initial state, replaced (never mutated) on each transition, so a decision
reads it without locks or awaits. Times are wall-clock seconds, so that replicas sharing a
store agree on window buckets and cooldowns.

Windows are kept per (slice, guardrail epoch, pool). A transition starts a new epoch, so
only evidence gathered since the slice entered its phase is judged; outcomes of requests
decided in an older epoch still count in metrics but not in the guardrail.

Shared mode (several replicas, ``gateway/state_redis.py``): local windows hold only the
increments not yet pushed; ``remote`` holds the merged totals of every replica as last
pulled; evidence is their sum. Transitions are not applied locally but proposed, and the
store applies each one once for everybody (compare-and-set on the state's version). While
the store is unreachable the replica applies transitions itself, as a single process does.

Memory: at most ``max_slices`` slices are kept, least recently used evicted first. An
evicted slice forgets its state and starts again on its rule's start rung, like a slice
never seen; with the default cap (10,000) and 24 buckets of 7 numbers per window, that is a
few tens of MB at worst.
"""

from __future__ import annotations

import logging
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from gateway.acceptance import Outcome, Signal, Status
from gateway.windows import Counts, Window, total_since
from policies.compiled import CompiledPolicy, CompiledRule, Ladder
from policies.guardrail import (
    NOTHING,
    ON_START,
    Evidence,
    Judged,
    Phase,
    SliceState,
    Transition,
    reset_on_reload,
    step,
)
from policies.model import SHADOW, GuardrailMode

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Slice:
    model: str
    rule: str
    state: SliceState = ON_START
    windows: dict[str, Window] = field(default_factory=dict)
    remote: dict[str, dict[float, Counts]] = field(default_factory=dict)
    proposed: bool = False
    seen: float = 0.0
    window_s: float = 120.0

    def counts(self, pool: str, now: float) -> Counts:
        """Evidence for ``pool``: the sliding window, except while probing, when everything
        since the phase began counts (a probe round at low traffic must be able to finish)."""
        window = self.windows.get(pool)
        buckets = self.remote.get(pool)
        out = Counts()
        if self.state.phase is Phase.PROBING:
            if window:
                out.add(window.since_start)
            if buckets:
                out.add(total_since(buckets, float("-inf")))
            return out
        if window:
            out.add(window.total(now))
        if buckets:
            out.add(total_since(buckets, now - self.window_s))
        return out

    def restart(self, state: SliceState) -> None:
        self.state = state
        self.windows.clear()
        self.remote.clear()
        self.proposed = False


@dataclass(frozen=True, slots=True)
class Increment:
    """Counts of one bucket of one (slice, epoch, pool), for the shared store."""

    slice: str
    model: str
    rule: str
    epoch: int
    pool: str
    start: float
    counts: Counts
    window_s: float


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
        self.shared = False
        self.proposals: dict[str, Transition] = {}
        self._unmeasured: dict[str, dict[str, int]] = {}

    def record(self, outcome: Outcome, now: float) -> None:
        labels = outcome.labels
        entry = self._touch(labels.slice, labels.model, labels.rule, now)
        if labels.epoch != entry.state.version or outcome.status is Status.CANCELLED:
            return
        policy = self._policy()
        found = _rule_and_ladder(policy, labels.rule, labels.model)
        if found is None:
            return
        window_s = entry.window_s = found[0].guardrail.window_s
        window = entry.windows.get(labels.pool)
        if window is None or window.window_s != window_s:
            window = entry.windows[labels.pool] = Window(window_s)
        window.add(now, _counts(outcome))
        if outcome.signal is Signal.SPEED and outcome.status is Status.OK:
            per_slice = self._unmeasured.setdefault(labels.pool, {})
            per_slice[labels.slice] = per_slice.get(labels.slice, 0) + 1
        self._step(labels.slice, entry, found, now)

    def pool_counters(self, pool: str, drafted: int, accepted: int, now: float) -> None:
        """A pool's draft/accepted tokens since the last scrape (acceptance signal 3). They
        become a slice's evidence only when that slice alone sent the pool requests that
        carried no per-request signal; otherwise they cannot be told apart."""
        served = self._unmeasured.pop(pool, {})
        if len(served) != 1:
            return
        ((key, requests),) = served.items()
        entry = self._slices.get(key)
        window = entry.windows.get(pool) if entry else None
        if entry is None or window is None:
            return
        rate = accepted / drafted
        window.add(
            now,
            Counts(
                measured=requests,
                drafted=drafted,
                accepted=accepted,
                rate_sum=rate * requests,
                rate_sq=rate * rate * requests,
            ),
        )
        found = _rule_and_ladder(self._policy(), entry.rule, entry.model)
        if found is not None:
            self._step(key, entry, found, now)

    def tick(self, now: float) -> None:
        """Step every slice that is not on its start rung (cooldowns end with time alone)."""
        policy = self._policy()
        for key in list(self.guards):
            entry = self._slices.get(key)
            found = entry and _rule_and_ladder(policy, entry.rule, entry.model)
            if entry is not None and found:
                self._step(key, entry, found, now)

    def _touch(self, key: str, model: str, rule: str, now: float) -> _Slice:
        entry = self._slices.get(key)
        if entry is None:
            entry = self._slices[key] = _Slice(model, rule)
            if len(self._slices) > self._max_slices:
                evicted, _ = self._slices.popitem(last=False)
                if evicted in self.guards:
                    self._publish()
        else:
            self._slices.move_to_end(key)
        entry.seen = now
        return entry

    def _step(
        self, key: str, entry: _Slice, found: tuple[CompiledRule, Ladder], now: float
    ) -> None:
        rule, ladder = found
        if rule.rule.start == SHADOW or entry.proposed:
            return
        start = ladder.index(rule.rule.start)
        standard = len(ladder.pools) - 1
        serving = min(start + entry.state.offset, standard)
        speed = rule.guardrail.mode is GuardrailMode.SPEEDUP
        judged_above = NOTHING
        if entry.state.phase is Phase.PROBING and serving > start:
            above = serving - 1
            judged_above = Judged(self._evidence(entry, ladder, above, now, speed), ladder.k[above])
        state, transition = step(
            key,
            entry.state,
            Judged(self._evidence(entry, ladder, serving, now, speed), ladder.k[serving]),
            judged_above,
            standard - serving,
            rule.guardrail,
            now,
        )
        if transition is not None:
            self._transition(key, entry, transition)

    def _evidence(
        self, entry: _Slice, ladder: Ladder, rung: int, now: float, speed: bool
    ) -> Evidence:
        counts = entry.counts(ladder.pools[rung], now)
        speedup = None
        if speed and rung != len(ladder.pools) - 1:
            base = entry.counts(ladder.pools[-1], now)
            if counts.tpot is not None and base.tpot is not None and base.tpot_n >= 5:
                speedup = base.tpot / counts.tpot
        return Evidence(counts.measured or counts.tpot_n, counts.acceptance, speedup)

    def _transition(self, key: str, entry: _Slice, transition: Transition) -> None:
        if self.shared:
            entry.proposed = True
            self.proposals[key] = transition
            return
        self.apply(key, transition)

    def apply(self, key: str, transition: Transition) -> None:
        """Make a transition the slice's state and log it (decided here or by the store)."""
        entry = self._slices.get(key)
        if entry is None:
            return
        entry.restart(transition.after)
        self.events.append(transition)
        log.info("guardrail %s: %s", key, transition.reason)
        self._publish()
        if self._on_transition is not None:
            self._on_transition(transition)

    def policy_changed(self, policy: CompiledPolicy) -> None:
        """Clip fallen-back slices to the new policy's ladders (a ladder may have shrunk)."""
        changed = False
        for entry in self._slices.values():
            found = _rule_and_ladder(policy, entry.rule, entry.model)
            if found is None or entry.state == ON_START:
                continue
            rule, ladder = found
            below = len(ladder.pools) - 1 - ladder.index(rule.rule.start)
            clipped = reset_on_reload(entry.state, below)
            if clipped != entry.state:
                entry.restart(clipped)
                changed = True
        if changed:
            self._publish()

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
            if ladder.index(rule.rule.start) + state.offset < len(ladder.pools) - 1:
                after = SliceState(state.offset + 1, Phase.FALLEN_BACK, now, state.version + 1)
                self._transition(key, entry, Transition(key, now, state, after, reason, numbers))
                return
        self.events.append(Transition(key, now, state, state, reason, numbers))

    def adopt(self, key: str, model: str, rule: str, state: SliceState, now: float) -> bool:
        """Take a state decided elsewhere when it is newer; True when it changed."""
        entry = self._touch(key, model, rule, now)
        if state.version <= entry.state.version:
            return False
        entry.restart(state)
        self._publish()
        return True

    def _publish(self) -> None:
        self.guards = MappingProxyType(
            {k: s.state for k, s in self._slices.items() if s.state != ON_START}
        )

    # --- for the shared store -------------------------------------------------------------

    def slice_labels(self, key: str) -> tuple[str, str] | None:
        entry = self._slices.get(key)
        return None if entry is None else (entry.model, entry.rule)

    def abandon(self, key: str) -> None:
        """Forget a proposal the store could not place; the slice may propose again."""
        entry = self._slices.get(key)
        if entry is not None:
            entry.proposed = False

    def take_proposals(self) -> dict[str, Transition]:
        taken, self.proposals = self.proposals, {}
        return taken

    def drain(self) -> list[Increment]:
        """Local increments not yet pushed, emptied."""
        out = []
        for key, entry in self._slices.items():
            for pool, window in entry.windows.items():
                for start, counts in window.drain():
                    out.append(
                        Increment(
                            key,
                            entry.model,
                            entry.rule,
                            entry.state.version,
                            pool,
                            start,
                            counts,
                            window.window_s,
                        )
                    )
        return out

    def restore(self, increments: list[Increment]) -> None:
        """Put back increments a failed push took out, so local evidence stays whole."""
        for inc in increments:
            entry = self._slices.get(inc.slice)
            if entry is None or entry.state.version != inc.epoch:
                continue
            window = entry.windows.get(inc.pool)
            if window is None:
                window = entry.windows[inc.pool] = Window(inc.window_s)
            window.add(inc.start, inc.counts)

    def states(self) -> Iterator[tuple[str, str, str, SliceState]]:
        """(slice, model, rule, state) of every slice not in its initial state."""
        for key, entry in self._slices.items():
            if entry.state != ON_START:
                yield key, entry.model, entry.rule, entry.state

    def active(self, since: float) -> Iterator[tuple[str, str, str, int, tuple[str, ...]]]:
        """(slice, model, rule, epoch, pools) of slices seen since ``since`` or not at rest."""
        for key, entry in self._slices.items():
            if entry.seen >= since or entry.state != ON_START:
                yield key, entry.model, entry.rule, entry.state.version, tuple(entry.windows)

    def merge_remote(self, key: str, epoch: int, pool: str, buckets: dict[float, Counts]) -> None:
        """The totals of every replica for one pool, as pulled; replaces the last pull."""
        entry = self._slices.get(key)
        if entry is not None and entry.state.version == epoch:
            entry.remote[pool] = buckets

    def summary(self, now: float) -> dict[str, dict[str, object]]:
        """Every slice's state and per-pool window, for the admin API and the demo."""
        out: dict[str, dict[str, object]] = {}
        for key, entry in self._slices.items():
            pools = {}
            for pool in entry.windows.keys() | entry.remote.keys():
                c = entry.counts(pool, now)
                pools[pool] = {
                    "requests": c.requests,
                    "measured": c.measured,
                    "acceptance": c.acceptance,
                    "acceptance_margin95": c.margin,
                    "tpot_s": c.tpot,
                    "errors": c.errors,
                }
            out[key] = {
                "rule": entry.rule,
                "model": entry.model,
                "offset": entry.state.offset,
                "phase": entry.state.phase.value,
                "pools": pools,
            }
        return out


def _counts(outcome: Outcome) -> Counts:
    counts = Counts(requests=1)
    if outcome.status is not Status.OK:
        counts.errors = 1
        return counts
    if outcome.drafted:
        rate = outcome.accepted / outcome.drafted
        counts.measured = 1
        counts.drafted = outcome.drafted
        counts.accepted = outcome.accepted
        counts.rate_sum = rate
        counts.rate_sq = rate * rate
    if outcome.tpot_s is not None:
        counts.tpot_sum = outcome.tpot_s
        counts.tpot_n = 1
    return counts


def _rule_and_ladder(
    policy: CompiledPolicy, rule_name: str, model: str
) -> tuple[CompiledRule, Ladder] | None:
    rule = policy.rule(rule_name)
    ladder = policy.ladders.get(model)
    return None if rule is None or ladder is None else (rule, ladder)
