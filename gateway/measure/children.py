"""Splitting slices by application (step 7): each slice's evidence per candidate child, and
the split and merge decisions taken on it (``policies/splitting.py``), applied through the
slices (``slices.py``: at once, or proposed to the shared store like a transition).

Per parent slice (a *family*), for each split key, the evidence of each value seen (a
template fingerprint, a tenant, ...) is kept as a small slice record of its own: windows per
pool and its newest requests, hashes only. At most ``tracked(max_children)`` values per key
are kept (the quietest is dropped for a newcomer), and at most ``MAX_FAMILIES`` families
(least recently seen dropped first): with 24 buckets per window, two pools and four keys,
a family is at most a few hundred kB, so the whole is bounded at a few tens of MB.

Every ``CHECK_EVERY_S`` (from ``tick``) a family is judged: each value with ``min_samples``
requests is judged as the guardrail judges a slice, on its parent's rung, and the slice
splits when values want different rungs with the guardrail's confidence. A child starts
from its parent's guardrail state and the evidence its value gathered in the family. A
split slice merges back once every child has served on its parent's rung, and the values
no longer differ with confidence, for the policy's ``merge_after_s``; a pinned split stays
while the policy pins it.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from statistics import NormalDist

from gateway.measure.acceptance import Labels
from gateway.measure.judging import Judge
from gateway.measure.slicerecord import SliceRecord
from gateway.measure.slices import Slices
from gateway.measure.windows import Counts
from policies.compiled import CompiledPolicy, Placement
from policies.economics import Judgement, Tally
from policies.guardrail import ON_START, SliceState
from policies.splitting import (
    Split,
    Verdict,
    agree,
    merge_due,
    merged,
    pin,
    propose,
    wants,
)

CHECK_EVERY_S = 5.0
MAX_FAMILIES = 256


def tracked(max_children: int) -> int:
    """How many values per split key a family keeps evidence for."""
    return max(max_children + 2, 4)


@dataclass(slots=True)
class Family:
    """One parent slice's candidate children: key -> value -> evidence."""

    model: str
    rule: str
    values: dict[str, OrderedDict[str, SliceRecord]] = field(default_factory=dict)
    checked: float = float("-inf")
    agreeing: float | None = None
    seen: float = 0.0


class Splitter:
    """The families of one gateway process, and the splits they lead to."""

    def __init__(self, slices: Slices, judge: Judge, policy: Callable[[], CompiledPolicy]) -> None:
        self._slices = slices
        self._judge = judge
        self._policy = policy
        self.families: OrderedDict[str, Family] = OrderedDict()
        self.made: set[str] = set()  # children made since ``take_made``: judge them at once
        slices.seed = self.seed

    def record(
        self,
        labels: Labels,
        place: Placement,
        counts: Counts,
        now: float,
        *,
        context: float | None = None,
        ttft_s: float | None = None,
        carried: bool = True,
    ) -> None:
        """One outcome of a request with candidate values, into its family: its counts,
        the cached tokens it held (``context``: each value is judged at its own context, as
        a slice is) and its time to first token (the latency rule's evidence)."""
        parent = labels.parent or labels.slice
        family = self.families.get(parent)
        if family is None:
            family = self.families[parent] = Family(labels.model, labels.rule)
            if len(self.families) > MAX_FAMILIES:
                self.families.popitem(last=False)
        else:
            self.families.move_to_end(parent)
        family.seen = now
        keep = tracked(self._policy().splitting.max_children)
        for key, value in labels.candidates:
            values = family.values.setdefault(key, OrderedDict())
            entry = values.get(value)
            if entry is None:
                if len(values) >= keep:
                    quietest = min(values, key=lambda v: values[v].requests(now))
                    del values[quietest]
                entry = values[value] = SliceRecord(labels.model, labels.rule, economic=True)
            entry.window_s = place.guardrail.window_s
            entry.seen = now
            entry.add(labels.pool, counts, now)
            if context is not None:
                entry.note_context(context)
            if ttft_s is not None:
                entry.first_token(labels.pool, ttft_s, now, carried)

    def tick(self, now: float) -> None:
        """Judge every family not judged for ``CHECK_EVERY_S``: split or merge."""
        policy = self._policy()
        for parent, family in list(self.families.items()):
            if now - family.checked < CHECK_EVERY_S:
                continue
            family.checked = now
            place = policy.placement(family.rule, family.model)
            split = self._slices.splits.get(parent)
            if place is None or place.shadowed or not place.guardrail.economic:
                if split is not None:
                    self._slices.change_split(merged(split, now, "merged: rule not guarded"), now)
                continue
            if split is not None:
                self._maybe_merge(parent, family, split, policy, now)
            elif policy.splitting.on:
                self._maybe_split(parent, family, place, policy, now)
        for split in list(self._slices.splits.values()):  # a family dropped, a policy changed
            if split.parent not in self.families and not policy.splitting.on:
                self._slices.change_split(merged(split, now, "merged: splitting is off"), now)

    def _parent_state(self, parent: str) -> SliceState:
        entry = self._slices.records.get(parent)
        return ON_START if entry is None else entry.state

    def _maybe_split(
        self,
        parent: str,
        family: Family,
        place: Placement,
        policy: CompiledPolicy,
        now: float,
    ) -> None:
        config, guard = policy.splitting, place.guardrail
        known = self._slices.split_versions.get(parent)
        version = 0 if known is None else known.version
        pinned = config.pins.get(family.rule)
        if pinned is not None:
            counts = {v: e.requests(now) for v, e in family.values.get(pinned, {}).items()}
            split = pin(
                parent,
                pinned,
                counts,
                max_children=config.max_children,
                min_samples=guard.min_samples,
                version=version,
                now=now,
            )
        else:
            state = self._parent_state(parent)
            verdicts = {
                key: self._verdicts(parent, family, key, state, place, now)
                for key in config.keys
                if len(family.values.get(key, ())) > 1
            }
            split = propose(
                parent,
                verdicts,
                config.keys,
                max_children=config.max_children,
                min_samples=guard.min_samples,
                version=version,
                now=now,
                z_needed=NormalDist().inv_cdf(guard.confidence),
            )
        if split is not None:
            family.agreeing = None
            self._slices.change_split(split, now)

    def _verdicts(
        self,
        family_key: str,
        family: Family,
        key: str,
        state: SliceState,
        place: Placement,
        now: float,
    ) -> list[Verdict]:
        out = []
        need = place.guardrail.min_samples
        pool = _speculative(place, state)
        parent = self._slices.records.get(family_key)
        fresh = dict(parent.fresh) if parent is not None else {}
        for value, entry in family.values[key].items():
            requests = entry.requests(now)
            if requests < need:
                continue
            entry.state = state
            entry.fresh = fresh  # what the slice saw before a healing is stale here too
            seen = self._judge.seen(entry, place, now)
            below, above = seen.economics.below, seen.economics.above
            direction = wants(
                None if below is None else below.verdict,
                None if above is None else above.verdict,
            )
            decided = next((j for j in (below, above) if j is not None and j.verdict), None)
            decided = decided or below or above
            ratio, z = (decided.ratio, decided.z) if decided is not None else (1.0, 0.0)
            leans = _leans(seen.near, above)
            tallies, reach = _served(entry, pool, now) if pool else ({}, 0.0)
            out.append(Verdict(value, requests, direction, ratio, z, leans, tallies, reach))
        return out

    def _maybe_merge(
        self, parent: str, family: Family, split: Split, policy: CompiledPolicy, now: float
    ) -> None:
        config = policy.splitting
        if split.pinned:
            if config.pins.get(family.rule) != split.key:
                self._slices.change_split(merged(split, now, "merged: no longer pinned"), now)
            return
        if not config.keys:
            self._slices.change_split(merged(split, now, "merged: splitting is off"), now)
            return
        records = self._slices.records
        offsets = [records[c].state.offset for c in split.children() if c in records]
        state = self._parent_state(parent)
        if not agree(state.offset, offsets) or self._still_differ(
            parent, family, split, state, now
        ):
            family.agreeing = None
            return
        family.agreeing = now if family.agreeing is None else family.agreeing
        if merge_due(family.agreeing, now, config.merge_after_s):
            why = f"merged: every child on its parent's rung for {config.merge_after_s:g} s"
            family.agreeing = None
            self._slices.change_split(merged(split, now, why), now)

    def _still_differ(
        self, parent: str, family: Family, split: Split, state: SliceState, now: float
    ) -> bool:
        """Would the split's values split the slice again now? Then they stay apart,
        though they serve on one rung for now (a change of load may part them again)."""
        policy = self._policy()
        place = policy.placement(family.rule, family.model)
        if place is None or split.key not in family.values:
            return False
        verdicts = {split.key: self._verdicts(parent, family, split.key, state, place, now)}
        guard = place.guardrail
        again = propose(
            parent,
            verdicts,
            [split.key],
            max_children=policy.splitting.max_children,
            min_samples=guard.min_samples,
            version=split.version,
            now=now,
            z_needed=NormalDist().inv_cdf(guard.confidence),
        )
        return again is not None

    def take_made(self) -> set[str]:
        """The children made since the last call: each is judged on its inherited evidence
        at once, not at its first outcome (a slow application's may be many seconds away)."""
        made, self.made = self.made, set()
        return made

    def seed(self, split: Split, now: float) -> None:
        """Make ``split``'s children: each from its parent's guardrail state and its value's
        evidence in the family (when this replica has it)."""
        parent = self._slices.records.get(split.parent)
        family = self.families.get(split.parent)
        state = ON_START if parent is None else parent.state
        for slot, value in enumerate(split.values, start=1):
            key = split.child(slot)
            model = parent.model if parent else family.model if family else ""
            rule = parent.rule if parent else family.rule if family else ""
            if not model:
                continue
            known = self._slices.records.get(key)  # an earlier child's, kept by the store
            version = max(state.version, known.state.version if known else 0)
            child = self._slices.touch(key, model, rule, now)
            child.restart(replace(state, version=version))
            child.economic = True
            values = family.values.get(split.key) if family else None
            evidence = values.get(value) if values else None
            if evidence is not None:
                child.window_s = evidence.window_s
                child.windows = copy.deepcopy(evidence.windows)
                child.recent = copy.deepcopy(evidence.recent)
                child.ttft = copy.deepcopy(evidence.ttft)
                child.context = evidence.context
            self.made.add(key)


def _speculative(place: Placement, state: SliceState) -> str | None:
    """The speculative rung a family's values are told apart on: the serving one, or the
    one above it when the slice is served on a standard pool."""
    ladder = place.ladder
    serving = place.serving(state.offset)
    for i in (serving, serving - 1):
        if 0 <= i < len(ladder.pools) and ladder.k[i] is not None:
            return ladder.pools[i]
    return None


def _leans(near: Judgement | None, above: Judgement | None) -> int:
    """Where a value's point estimate leans: a rung down, up, or staying."""
    if near is not None:
        return -1 if near.ratio > 1.0 else 0
    if above is not None:
        return 1 if above.ratio < 1.0 else 0
    return 0


def _served(entry: SliceRecord, pool: str, now: float) -> tuple[dict[float, Tally], float]:
    """What a value's window holds on ``pool`` from its evidence floor on, bucket by bucket
    (this replica's and those pulled from others added up), and its requests' mean decode
    in seconds (how long before it ended a request was being served)."""
    by_start: dict[float, Counts] = {}
    total = Counts()
    for start, counts in entry.buckets(pool, now):
        by_start.setdefault(start, Counts()).add(counts)
        total.add(counts)
    tpot = total.tpot or 0.0
    decode = tpot * total.tokens / total.stepped if total.stepped else 0.0
    tallies = {start: counts.tally() for start, counts in by_start.items() if counts.stepped}
    return tallies, decode
