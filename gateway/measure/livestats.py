"""Step 7 of a request: feedback. Outcomes -> per-slice windows -> guardrail transitions.

``record`` is O(1) and never awaits: it adds the outcome to its slice's window for the pool
that served it and steps that slice's guardrail; in economic mode at most every
``JUDGE_EVERY_S`` per slice (judging costs far more than recording: a slice at 50 requests
a second was judged 50 times a second, for a verdict that needs ``min_samples`` new
requests to change), and an outcome inside that interval is judged with the next one after
it or on the next tick. ``tick`` (about once a second, from the lifespan) steps slices
waiting out a cooldown and slices with outcomes not yet judged. ``guards`` is an
immutable snapshot of every slice not in its initial state, replaced (never mutated) on
each transition, so a decision reads it without locks or awaits. Times are wall-clock
seconds, so that replicas sharing a store agree on window buckets and cooldowns.

Windows are kept per slice and pool. In threshold mode a transition starts a new epoch and
clears them, so only evidence gathered since the slice entered its phase is judged; outcomes
of requests decided in an older epoch still count in metrics but not in the guardrail. In
economic mode (the default) evidence outlives transitions: a slice that left speculation in
a load surge keeps its tokens per step there and comes back when the load drops, and the
judge weighs recent requests first (``policies/economics.py``). A slice is judged against
every rung below the one serving it and falls to the cheapest one that is cheaper with
confidence; a serving rung it has no evidence on yet is judged by the nearest speculative
rung's tokens per step carried over to its k. A climb decided by probes (a healing) makes
what the slice saw before those probes, on the probed rung and the rungs above, stale: it
stops counting (``fresh``), so the slice neither falls again on the mix of old and new
requests nor judges the rungs above by their collapsed past.

Each pool's step time as a function of its batch is learned from every outcome it served,
whichever slice sent it (``policies/steptime.py``): decode seconds over decode steps, at
the outcome's mean load on its endpoint. ``load(model, now)`` says the load to judge at: the
mean requests in flight per endpoint over the model's whole ladder, which does not move
when a slice moves between rungs.

Shared mode (several replicas, ``gateway/state/redis_store.py``): local windows hold only the
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
from dataclasses import dataclass, replace
from types import MappingProxyType

from gateway.measure.acceptance import Outcome, Signal, Status
from gateway.measure.slicerecord import RECENT, Increment, SliceRecord, counts_of, newest_tallies
from gateway.measure.steptimes import EXPLORE_PER_MINUTE, StepTimes
from gateway.measure.windows import Counts, Window, spans
from policies.compiled import CompiledPolicy, CompiledRule, Ladder
from policies.economics import Judgement, Rung, Tally, hinges, judge, span_targets, transfer
from policies.guardrail import (
    NOTHING,
    ON_START,
    Economics,
    Evidence,
    Judged,
    Phase,
    SliceState,
    Transition,
    reset_on_reload,
    step,
    step_economic,
)
from policies.model import SHADOW, Guardrail, GuardrailMode, ProbeMode
from policies.steptime import StepFit, StepTime

Load = Callable[[str, float], "float | None"]

log = logging.getLogger(__name__)
JUDGE_EVERY_S = 0.25  # economic mode: a slice is judged at most this often on its outcomes


@dataclass(frozen=True, slots=True)
class Seen:
    """What ``judgements`` makes of a slice's evidence: ``economics`` for the guardrail's
    step; ``near``, the serving rung against the next one down, and ``lower``, that rung's
    step time (whether exploring it is worth it); ``decided_by``, how many of the newest
    probes the probes' judgement rests on."""

    economics: Economics
    near: Judgement | None
    lower: StepTime | None
    decided_by: int


class LiveStats:
    """Per-slice windows and guardrail states for one gateway process."""

    def __init__(
        self,
        policy: Callable[[], CompiledPolicy],
        *,
        max_slices: int = 10_000,
        max_events: int = 1_000,
        on_transition: Callable[[Transition], None] | None = None,
        load: Load | None = None,
    ) -> None:
        self._policy = policy
        self._load = load
        self.steps = StepTimes()
        self.unattributed: dict[str, int] = {}
        self._max_slices = max_slices
        self._slices: OrderedDict[str, SliceRecord] = OrderedDict()
        self._on_transition = on_transition
        self.events: deque[Transition] = deque(maxlen=max_events)
        self.guards: Mapping[str, SliceState] = MappingProxyType({})
        self.shared = False
        self.proposals: dict[str, Transition] = {}
        self._unmeasured: dict[str, dict[str, int]] = {}
        self._due: set[str] = set()

    @property
    def step_fits(self) -> dict[str, StepFit]:
        """Each pool's step-time observations (``policies/steptime.py``)."""
        return self.steps.fits

    def record(self, outcome: Outcome, now: float) -> None:
        labels = outcome.labels
        entry = self._touch(labels.slice, labels.model, labels.rule, now)
        self.steps.learn(outcome, now)
        current = labels.epoch == entry.state.version
        if outcome.status is Status.CANCELLED:
            return
        policy = self._policy()
        found = _rule_and_ladder(policy, labels.rule, labels.model)
        if found is None:
            return
        entry.economic = found[0].guardrail.economic
        if not current and not entry.economic:
            return
        if (
            current
            and entry.state.phase is Phase.PROBING
            and labels.pool != found[1].pools[entry.serving(*found)]
        ):
            entry.probes += 1
        window_s = entry.window_s = found[0].guardrail.window_s
        window = entry.windows.get(labels.pool)
        if window is None or window.window_s != window_s:
            window = entry.windows[labels.pool] = Window(window_s)
        counts = counts_of(outcome)
        window.add(now, counts)
        if counts.stepped:
            recent = entry.recent.get(labels.pool)
            if recent is None:
                recent = entry.recent[labels.pool] = deque(maxlen=RECENT)
            recent.append((now, counts.tokens, counts.steps))
        if outcome.signal is Signal.SPEED and outcome.status is Status.OK:
            per_slice = self._unmeasured.setdefault(labels.pool, {})
            per_slice[labels.slice] = per_slice.get(labels.slice, 0) + 1
        if entry.economic and now - entry.judged < JUDGE_EVERY_S:
            self._due.add(labels.slice)  # judged by the next outcome after that, or tick
            return
        self._step(labels.slice, entry, found, now)

    def pool_counters(self, pool: str, drafted: int, accepted: int, now: float) -> None:
        """A pool's draft/accepted tokens since the last scrape (acceptance signal 3). They
        become a slice's evidence only when that slice alone sent the pool requests that
        carried no per-request signal; otherwise they cannot be told apart."""
        served = self._unmeasured.pop(pool, {})
        if len(served) > 1:  # several slices: the counters cannot be told apart; say so
            self.unattributed[pool] = self.unattributed.get(pool, 0) + 1
            log.info("pool %s: counters of %d slices could not be attributed", pool, len(served))
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
        """Step every slice that is not on its start rung (cooldowns end with time alone),
        and every slice with outcomes not judged yet."""
        policy = self._policy()
        due, self._due = self._due, set()
        for key in [*self.guards, *(k for k in due if k not in self.guards)]:
            entry = self._slices.get(key)
            found = entry and _rule_and_ladder(policy, entry.rule, entry.model)
            if entry is not None and found:
                self._step(key, entry, found, now)

    def _touch(self, key: str, model: str, rule: str, now: float) -> SliceRecord:
        entry = self._slices.get(key)
        if entry is None:
            entry = self._slices[key] = SliceRecord(model, rule)
            if len(self._slices) > self._max_slices:
                evicted, _ = self._slices.popitem(last=False)
                if evicted in self.guards:
                    self._publish()
        else:
            self._slices.move_to_end(key)
        entry.seen = now
        return entry

    def _step(
        self, key: str, entry: SliceRecord, found: tuple[CompiledRule, Ladder], now: float
    ) -> None:
        rule, ladder = found
        if rule.rule.start == SHADOW or entry.proposed:
            return
        if rule.guardrail.economic:
            self._step_economic(key, entry, rule, ladder, now)
            return
        start = ladder.index(rule.rule.start)
        serving = entry.serving(rule, ladder)
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
            len(ladder.pools) - 1 - serving,
            rule.guardrail,
            now,
        )
        if transition is not None:
            self._transition(key, entry, transition)

    def _step_economic(
        self, key: str, entry: SliceRecord, rule: CompiledRule, ladder: Ladder, now: float
    ) -> None:
        config = rule.guardrail
        entry.judged = now
        self._due.discard(key)
        start = ladder.index(rule.rule.start)
        serving = entry.serving(rule, ladder)
        seen = self.judgements(entry, ladder, serving, start, config, now)
        rate = entry.requests_per_s(now)
        economics = replace(seen.economics, probe_count=entry.probes, rate=rate)
        state, transition = step_economic(key, entry.state, economics, config, now)
        if transition is not None:
            if transition.after.offset < entry.state.offset and _by_probes(economics):
                self._stale_before_probes(entry, ladder, serving - 1, seen.decided_by, now)
            self._transition(key, entry, transition)
            return
        if state != entry.state:  # a new probe share: not an event
            entry.state = state
            self._publish()
        explore, live = 0.0, False
        if serving + 1 < len(ladder.pools):
            need = hinges(seen.near, seen.lower, rate, EXPLORE_PER_MINUTE / 60.0)
            pool = ladder.pools[serving + 1]
            explore = self.steps.explore_share(pool, key, rate, need, config.probe_fraction, now)
            live = explore > 0 and seen.near is not None and seen.near.z >= 0.0
            live = live and config.probe is ProbeMode.LIVE
        if (explore, live) != (entry.state.explore, entry.state.explore_live):
            entry.state = replace(entry.state, explore=explore, explore_live=live)
            self._publish()

    def _stale_before_probes(
        self, entry: SliceRecord, ladder: Ladder, probed: int, decided_by: int, now: float
    ) -> None:
        """Probes showed rung ``probed`` cheaper than its window said: what the slice saw
        there before the ``decided_by`` newest probes, and everything it saw on the rungs
        above, predates the change (a healing) and is no longer evidence."""
        pool = ladder.pools[probed]
        times = [at for at, _, _ in entry.recent.get(pool, ())]
        entry.fresh[pool] = times[-decided_by] if 0 < decided_by <= len(times) else now
        for upper in ladder.pools[:probed]:
            entry.fresh[upper] = now

    def judgements(
        self,
        entry: SliceRecord,
        ladder: Ladder,
        serving: int,
        start: int,
        config: Guardrail,
        now: float,
    ) -> Seen:
        """One slice's judgements at the ladder's load (``Seen``)."""
        load = self._judge_load(ladder, now)
        targets = span_targets(config.min_samples)
        rungs = [
            self._rung(entry, ladder, i, load, targets, config, now, carry=i == serving)
            for i in range(len(ladder.pools))
        ]
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
        if serving > start:
            above = judge(rungs[serving - 1], rungs[serving], min_samples=n, confidence=confidence)
            if entry.state.phase is Phase.PROBING and entry.probes:
                fresh = self._rung(entry, ladder, serving - 1, load, (1, 2, 4, 8, 16), config, now)
                probes = judge(
                    fresh,
                    rungs[serving],
                    min_samples=1,
                    confidence=config.confidence,
                    max_n=entry.probes,
                )
                decided_by = probes.n if probes is not None else 0
        lower = rungs[serving + 1].step if serving + 1 < len(ladder.pools) else None
        return Seen(Economics(below, above, probes, drop=drop), near, lower, decided_by)

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
        step = self.steps.at(ladder, i, load, config.draft_cost_ratio, now)
        policy = self._policy()
        prices = [policy.pools[p].cost_per_hour for p in ladder.pools if p in policy.pools]
        price = policy.pools[pool].cost_per_hour if pool in policy.pools else None
        per_second = price / 3600.0 if price is not None and None not in prices else 1.0
        return Rung(pool, k, per_second, step, tallies, transferred)

    def _tallies(
        self, entry: SliceRecord, pool: str, k: int | None, targets: tuple[int, ...], now: float
    ) -> tuple[Tally, ...]:
        if k is None:
            return ()
        recent = entry.newest(pool)
        short = [t for t in targets if t <= len(recent)]
        longer = spans(entry.buckets(pool, now), [t for t in targets if t > len(recent)])
        return newest_tallies(recent, short) + tuple(x for x in longer if x.n > len(recent))

    def _judge_load(self, ladder: Ladder, now: float) -> float | None:
        load = self._load(ladder.model, now) if self._load is not None else None
        return max(load, 1.0) if load is not None else self.steps.mean_batch(ladder, now)

    def _evidence(
        self, entry: SliceRecord, ladder: Ladder, rung: int, now: float, speed: bool
    ) -> Evidence:
        counts = entry.counts(ladder.pools[rung], now)
        speedup = None
        if speed and rung != len(ladder.pools) - 1:
            base = entry.counts(ladder.pools[-1], now)
            if counts.tpot is not None and base.tpot is not None and base.tpot_n >= 5:
                speedup = base.tpot / counts.tpot
        return Evidence(counts.measured or counts.tpot_n, counts.acceptance, speedup)

    def _transition(self, key: str, entry: SliceRecord, transition: Transition) -> None:
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
                            entry.window_epoch,
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
            if entry is None or entry.window_epoch != inc.epoch:
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

    def every(self) -> Iterator[tuple[str, str, SliceState, str | None]]:
        """(slice, rule, state, pool served now) of every slice kept, for the state gauges."""
        policy = self._policy()
        for key, entry in self._slices.items():
            found = _rule_and_ladder(policy, entry.rule, entry.model)
            yield key, entry.rule, entry.state, entry.rungs(found)["rung"]

    def seconds_per_token(self, key: str, now: float) -> dict[str, float]:
        """The guardrail's estimate of endpoint-seconds per output token of one slice on each
        rung it can tell, at the ladder's load: step_time(B) / (L x B), ``L`` the slice's
        tokens per step there (1 on a standard pool). Times ``cost_per_hour`` / 3600 it is
        the cost per output token that the economic guardrail compares."""
        entry = self._slices.get(key)
        found = entry and _rule_and_ladder(self._policy(), entry.rule, entry.model)
        if entry is None or not found:
            return {}
        rule, ladder = found
        load = self._judge_load(ladder, now) or 1.0
        out = {}
        for i, pool in enumerate(ladder.pools):
            per_step = 1.0 if ladder.k[i] is None else entry.counts(pool, now).tokens_per_step
            step = self.steps.at(ladder, i, load, rule.guardrail.draft_cost_ratio, now)
            if step is not None and per_step:
                out[pool] = step.seconds / (per_step * load)
        return out

    def active(self, since: float) -> Iterator[tuple[str, str, str, int, tuple[str, ...]]]:
        """(slice, model, rule, epoch, pools) of slices seen since ``since`` or not at rest."""
        for key, entry in self._slices.items():
            if entry.seen >= since or entry.state != ON_START:
                yield key, entry.model, entry.rule, entry.window_epoch, tuple(entry.windows)

    def merge_remote(self, key: str, epoch: int, pool: str, buckets: dict[float, Counts]) -> None:
        """The totals of every replica for one pool, as pulled; replaces the last pull."""
        entry = self._slices.get(key)
        if entry is not None and entry.window_epoch == epoch:
            entry.remote[pool] = buckets

    def pool_summary(self, now: float) -> dict[str, dict[str, object]]:
        """Per pool: its learned step time, and how often its counters could not be told
        apart between slices (acceptance signal 3)."""
        names = set(self.steps.fits) | set(self.unattributed)
        for ladder in self._policy().ladders.values():
            names |= set(ladder.pools)
        return {
            pool: {
                "step_time": self.steps.summary(pool, now),
                "counters_unattributed": self.unattributed.get(pool, 0),
            }
            for pool in sorted(names)
        }

    def summary(self, now: float) -> dict[str, dict[str, object]]:
        """Every slice's state and per-pool window, for the admin API and the demo; ``rung``
        is the pool the slice is served on now (None when its rule or model is gone)."""
        policy = self._policy()
        return {
            key: entry.view(now, _rule_and_ladder(policy, entry.rule, entry.model))
            for key, entry in self._slices.items()
        }


def _by_probes(seen: Economics) -> bool:
    """Did the newest probes, rather than the whole window, decide a climb?"""
    return seen.probes is not None and seen.probes.verdict > 0


def _rule_and_ladder(
    policy: CompiledPolicy, rule_name: str, model: str
) -> tuple[CompiledRule, Ladder] | None:
    rule = policy.rule(rule_name)
    ladder = policy.ladders.get(model)
    return None if rule is None or ladder is None else (rule, ladder)
