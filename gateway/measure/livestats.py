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
judge weighs recent requests first (``policies/economics.py``, read through
``judging.py``). A slice falls to the cheapest rung below that is cheaper with confidence.
A climb decided by probes (a healing) makes what the slice saw before those probes, on the
probed rung and the rungs above, stale: it stops counting (``fresh``), so the slice neither
falls again on the mix of old and new requests nor judges the rungs above by their
collapsed past.

Live statistics are split by concern around the slices they keep (``slices.py``): this
module records and steps; ``judging.py`` builds the judgements; ``replica.py`` is the
shared store's protocol (several replicas, ``gateway/state/redis_store.py``); ``views.py``
is what the admin API and the metrics read.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import replace

from gateway.measure.acceptance import Labels, Outcome, Signal, Status
from gateway.measure.children import Splitter
from gateway.measure.judging import Judge, Load, Seen
from gateway.measure.replica import Replica
from gateway.measure.slicerecord import SliceRecord, counts_of
from gateway.measure.slices import Slices
from gateway.measure.steptimes import EXPLORE_PER_MINUTE, StepTimes, context_of
from gateway.measure.views import Views
from gateway.measure.windows import Counts
from policies.compiled import CompiledPolicy, Ladder, Placement
from policies.economics import exploring
from policies.guardrail import (
    NOTHING,
    ON_START,
    Economics,
    Judged,
    Phase,
    SliceState,
    Transition,
    alarm,
    reset_on_reload,
    step,
    step_economic,
)
from policies.model import ProbeMode
from policies.splitting import Split, route
from policies.steptime import StepFit

log = logging.getLogger(__name__)
JUDGE_EVERY_S = 0.25  # economic mode: a slice is judged at most this often on its outcomes
TICK_EVERY_S = 1.0  # how often a running gateway steps slices that wait on time alone


class LiveStats:
    """Per-slice windows and guardrail states for one gateway process. ``judge``,
    ``replica`` and ``views`` are its other concerns, over the same ``slices``."""

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
        self.steps = StepTimes()
        self.unattributed: dict[str, int] = {}
        self.slices = Slices(
            max_slices=max_slices, max_events=max_events, on_transition=on_transition
        )
        self.judge = Judge(policy, self.steps, load)
        self.replica = Replica(self.slices)
        self.views = Views(self.slices, self.judge, policy, self.unattributed)
        self.splitter = Splitter(self.slices, self.judge, policy)
        self._unmeasured: dict[str, dict[str, int]] = {}
        self._due: set[str] = set()

    @property
    def guards(self) -> Mapping[str, SliceState]:
        """Every slice not in its initial state: what a decision reads."""
        return self.slices.guards

    @property
    def splits(self) -> Mapping[str, Split]:
        """Every slice split by application now: what a decision reads."""
        return self.slices.splits

    @property
    def events(self) -> deque[Transition]:
        return self.slices.events

    @property
    def step_fits(self) -> dict[str, StepFit]:
        """Each pool's step-time observations (``policies/steptime.py``)."""
        return self.steps.fits

    def record(self, outcome: Outcome, now: float) -> None:
        labels = outcome.labels
        key = self._owner(labels)
        entry = self.slices.touch(key, labels.model, labels.rule, now)
        self.steps.learn(outcome, now)
        current = key == labels.slice and labels.epoch == entry.state.version
        if outcome.status is Status.CANCELLED:
            return
        own = context_of(outcome)
        entry.note_context(own)
        ttft = outcome.ttft_s if outcome.status is Status.OK else None
        place = self._policy().placement(labels.rule, labels.model)
        carried = _carried(labels, place, entry.state)
        if ttft is not None:
            entry.first_token(labels.pool, ttft, now, carried)
        if place is None:
            return
        entry.economic = place.guardrail.economic
        if not current and not entry.economic:
            return
        probing = current and entry.state.phase is Phase.PROBING
        if probing and labels.pool != place.pool(entry.state.offset):
            entry.probes += 1
            entry.probed_at = now
        if labels.pool != place.pool(entry.state.offset):
            _probe_prefill(entry, outcome)
        elif not (labels.probe or labels.shadow):
            entry.home_prefill = _mean_uncached(entry.home_prefill, outcome)
            entry.home_fresh = _mean_uncached(entry.home_fresh, outcome, share=True)
        entry.window_s = place.guardrail.window_s
        counts = counts_of(outcome)
        entry.add(labels.pool, counts, now)
        if labels.candidates and entry.economic:
            self.splitter.record(
                labels, place, counts, now, context=own, ttft_s=ttft, carried=carried
            )
        if outcome.signal is Signal.SPEED and outcome.status is Status.OK:
            per_slice = self._unmeasured.setdefault(labels.pool, {})
            per_slice[key] = per_slice.get(key, 0) + 1
        if entry.economic and now - entry.judged < JUDGE_EVERY_S:
            self._due.add(key)  # judged by the next outcome after that, or tick
            return
        self._step(key, entry, place, now)

    def _owner(self, labels: Labels) -> str:
        """The slice whose evidence an outcome is: the one it was decided in, unless its
        slice split or merged while it ran. A request decided in a parent that has split
        since belongs to its application's child (the parent is now the rest), and one
        decided in a child merged since belongs to the parent."""
        if not labels.parent:
            return labels.slice
        return route(labels.parent, labels.candidates, self.slices.splits)

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
        entry = self.slices.records.get(key)
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
        place = self._policy().placement(entry.rule, entry.model)
        if place is not None:
            self._step(key, entry, place, now)

    def tick(self, now: float) -> None:
        """Step every slice that is not on its start rung (cooldowns end with time alone),
        and every slice with outcomes not judged yet."""
        policy = self._policy()
        due, self._due = self._due | self.splitter.take_made(), set()
        guards = self.slices.guards
        for key in [*guards, *(k for k in due if k not in guards)]:
            self._step_now(key, policy, now)
        self.splitter.tick(now)
        for key in self.splitter.take_made():  # children split off just now
            self._step_now(key, policy, now)

    def _step_now(self, key: str, policy: CompiledPolicy, now: float) -> None:
        entry = self.slices.records.get(key)
        place = entry and policy.placement(entry.rule, entry.model)
        if entry is not None and place:
            self._step(key, entry, place, now)

    def policy_changed(self, policy: CompiledPolicy) -> None:
        """Clip fallen-back slices to the new policy's ladders (a ladder may have shrunk)."""
        changed = False
        for entry in self.slices.records.values():
            place = policy.placement(entry.rule, entry.model)
            if place is None or entry.state == ON_START:
                continue
            clipped = reset_on_reload(entry.state, len(place.ladder.pools) - 1 - place.start)
            if clipped != entry.state:
                entry.restart(clipped)
                changed = True
        if changed:
            self.slices.publish()

    def alarm(self, key: str, reason: str, numbers: dict[str, float], now: float) -> None:
        """An outside signal that speculation is wrong for a slice (the shadow canary): the
        guardrail's ``alarm`` transition, a fall of one rung when the slice can fall."""
        entry = self.slices.records.get(key)
        if entry is None:
            return
        place = self._policy().placement(entry.rule, entry.model)
        below = 0 if place is None or place.shadowed else place.below(entry.state.offset)
        after, transition = alarm(key, entry.state, below, reason, numbers, now)
        if after is entry.state:
            self.slices.events.append(transition)  # nowhere to fall: logged only
        else:
            self.slices.move(key, entry, transition)

    def _step(self, key: str, entry: SliceRecord, place: Placement, now: float) -> None:
        if place.shadowed or entry.proposed:
            return
        if place.guardrail.economic:
            self._step_economic(key, entry, place, now)
        else:
            self._step_threshold(key, entry, place, now)

    def _step_threshold(self, key: str, entry: SliceRecord, place: Placement, now: float) -> None:
        ladder = place.ladder
        serving = place.serving(entry.state.offset)
        evidence = self.judge.evidence
        judged_above = NOTHING
        if entry.state.phase is Phase.PROBING and serving > place.start:
            above = serving - 1
            judged_above = Judged(evidence(entry, ladder, above, now), ladder.k[above])
        state, transition = step(
            key,
            entry.state,
            Judged(evidence(entry, ladder, serving, now), ladder.k[serving]),
            judged_above,
            place.below(entry.state.offset),
            place.guardrail,
            now,
        )
        if transition is not None:
            self.slices.move(key, entry, transition)

    def _step_economic(self, key: str, entry: SliceRecord, place: Placement, now: float) -> None:
        entry.judged = now
        self._due.discard(key)
        serving = place.serving(entry.state.offset)
        seen = self.judge.seen(entry, place, now)
        rate = entry.requests_per_s(now)
        tokens = entry.mean_tokens(now)
        last = entry.probed_at if entry.probed_at is not None else entry.state.since
        prefill, reprefill = self._probe_prefill(key, entry, place, serving, tokens, now)
        economics = replace(
            seen.economics,
            rate=rate,
            tokens=tokens,
            since_probe=now - last if entry.state.phase is Phase.PROBING else None,
            prefill=prefill,
            reprefill=reprefill,
            resent=entry.home_fresh is not None and entry.home_fresh < 1.0,
        )
        state, transition = step_economic(key, entry.state, economics, place.guardrail, now)
        if transition is not None:
            if transition.after.offset < entry.state.offset and _by_probes(economics):
                self._stale_before_probes(entry, place.ladder, serving - 1, seen.decided_by, now)
            self.slices.move(key, entry, transition)
            return
        if state != entry.state:  # a new probe share: not an event
            entry.state = state
            self.slices.publish()
        self._explore(key, entry, place, seen, rate, tokens, now)

    def _probe_prefill(
        self,
        key: str,
        entry: SliceRecord,
        place: Placement,
        serving: int,
        tokens: float | None,
        now: float,
    ) -> tuple[float | None, float | None]:
        """A probe's prefill on the rung above and what a live one prefills beyond what the
        request would at home, both in requests on the serving rung (``Economics.prefill``,
        ``Economics.reprefill``): its probes' uncached prompt tokens there (before any, the
        slice's context) at the rung above's seconds per prompt token, less what a live
        probe saves at home at the serving rung's, over a request's output tokens at the
        serving rung's seconds per output token (``SliceRecord.home_saving``: nothing for a
        conversation's turn, whose next turn prefills at home what this one brought)."""
        if serving <= place.start or not tokens:
            return None, None
        above, here = place.ladder.pools[serving - 1], place.ladder.pools[serving]
        per_token = self.views.prefill_seconds_per_token(key, now)
        prefill = per_token.get(above)
        decode = self.views.seconds_per_token(key, now).get(here)
        prompt = entry.probe_prefill if entry.probe_prefill is not None else entry.context
        if prefill is None or not decode or prompt is None:
            return None, None
        there = prompt * prefill
        saved = entry.home_saving()
        if saved is None:
            return there / (tokens * decode), None
        extra = max(there - saved * per_token.get(here, prefill), 0.0)
        return there / (tokens * decode), extra / (tokens * decode)

    def _lean_prefill(
        self, key: str, entry: SliceRecord, place: Placement, tokens: float | None, now: float
    ) -> float | None:
        """What one of the slice's requests served a rung down prefills there beyond what it
        would at home, over its decode cost at home (``exploring``'s ``prefill``): its
        context at the pool below's seconds per prompt token, less its uncached prompt
        tokens at home at the serving pool's; nothing beyond where its answers never said
        what was cached (prefilled whole as far as is known); None while unknown."""
        serving, pools = place.serving(entry.state.offset), place.ladder.pools
        if serving + 1 >= len(pools) or not tokens or entry.context is None:
            return None
        if entry.home_prefill is None:
            return 0.0
        here, below = pools[serving], pools[serving + 1]
        per_token = self.views.prefill_seconds_per_token(key, now)
        decode = self.views.seconds_per_token(key, now).get(here)
        at_home = per_token.get(here)
        if not decode or at_home is None:
            return None
        there = entry.context * per_token.get(below, at_home)
        return max(there - entry.home_prefill * at_home, 0.0) / (tokens * decode)

    def _explore(
        self,
        key: str,
        entry: SliceRecord,
        place: Placement,
        seen: Seen,
        rate: float,
        tokens: float | None,
        now: float,
    ) -> None:
        """The share of the slice sent one rung down while its judgement hinges on that
        pool's step time, and whether it is served there (live) or mirrored.

        A slice leaning towards that pool serves its own lean there, which costs nothing
        in expectation (half the slice while the pool is not learned, where what a request
        prefills there allows: ``_lean_prefill``, asked only then); mirrors, a whole request
        each, come from the pool's budget when knowing is worth them
        (``policies/economics.py: exploring``)."""
        config, pools = place.guardrail, place.ladder.pools
        serving = place.serving(entry.state.offset)
        explore, live = 0.0, False
        if serving + 1 < len(pools):
            live = seen.near is not None and seen.near.z >= 0.0
            live = live and config.probe is ProbeMode.LIVE
            cost = EXPLORE_PER_MINUTE / 60.0
            unseen = seen.lower is None or not seen.lower.learned
            prefill = self._lean_prefill(key, entry, place, tokens, now) if unseen else None
            hinged, lean = exploring(
                seen.near, seen.lower, rate, live=live, cost=cost, prefill=prefill
            )
            pool = pools[serving + 1]
            explore = self.steps.explore_share(pool, key, rate, hinged, config.probe_fraction, now)
            explore = max(explore, lean)
            live = live and explore > 0
        if (explore, live) != (entry.state.explore, entry.state.explore_live):
            entry.state = replace(entry.state, explore=explore, explore_live=live)
            self.slices.publish()

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


def _by_probes(seen: Economics) -> bool:
    """Did the newest probes, rather than the whole window, decide a climb?"""
    return seen.probes is not None and seen.probes.verdict > 0


def _carried(labels: Labels, place: Placement | None, state: SliceState) -> bool:
    """Did the request's pool serve it as its slice's rung, carrying the slice's load (not
    a probe, a mirror or an exploration of another rung)?"""
    if labels.probe or labels.shadow:
        return False
    if place is None or labels.epoch != state.version:
        return True  # decided before the slice last moved: on its rung then
    return labels.pool == place.pool(state.offset)


def _probe_prefill(entry: SliceRecord, outcome: Outcome) -> None:
    """A probe's (live or mirrored) uncached prompt tokens, into its slice's mean."""
    if outcome.labels.probe or outcome.labels.shadow:
        entry.probe_prefill = _mean_uncached(entry.probe_prefill, outcome)


def _mean_uncached(mean: float | None, outcome: Outcome, *, share: bool = False) -> float | None:
    """``mean`` of uncached prompt tokens (or, ``share``, of the share of the prompt
    uncached) with ``outcome``'s in, when its answer said what was cached."""
    if outcome.status is not Status.OK or outcome.cached_tokens is None:
        return mean
    own = float(max(outcome.prompt_tokens - outcome.cached_tokens, 0))
    if share:
        own = own / outcome.prompt_tokens if outcome.prompt_tokens > 0 else 1.0
    return own if mean is None else mean + 0.1 * (own - mean)
