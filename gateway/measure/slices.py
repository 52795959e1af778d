"""What live statistics keep (step 7): every slice's record (``slicerecord.py``), the
snapshot of their guardrail states that decisions read, the log of guardrail events, and,
when replicas share a store, the transitions waiting for it.

Shared by the parts of live statistics: ``livestats.py`` records outcomes and steps the
guardrail, ``replica.py`` is what the shared store does with them, ``views.py`` what the
admin API and the metrics read. ``guards`` is replaced, never mutated, so that a decision
reads it without locks or awaits.

Memory: at most ``max_slices`` slices are kept, least recently used evicted first. An
evicted slice forgets its state and starts again on its rule's start rung, like a slice
never seen; with the default cap (10,000) and 24 buckets of 7 numbers per window, that is a
few tens of MB at worst.
"""

from __future__ import annotations

import logging
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from types import MappingProxyType

from gateway.measure.slicerecord import SliceRecord
from policies.guardrail import ON_START, SliceState, Transition
from policies.splitting import Split

log = logging.getLogger(__name__)


class Slices:
    """The slice records of one gateway process, and what is published of them."""

    def __init__(
        self,
        *,
        max_slices: int = 10_000,
        max_events: int = 1_000,
        on_transition: Callable[[Transition], None] | None = None,
    ) -> None:
        self.records: OrderedDict[str, SliceRecord] = OrderedDict()
        self.events: deque[Transition] = deque(maxlen=max_events)
        self.guards: Mapping[str, SliceState] = MappingProxyType({})
        self.shared = False  # transitions go to the store as proposals
        self.proposals: dict[str, Transition] = {}
        self._max_slices = max_slices
        self._on_transition = on_transition
        self.splits: Mapping[str, Split] = MappingProxyType({})  # live ones: decisions read
        self.split_versions: dict[str, Split] = {}  # every split known, merged ones too
        self.split_proposals: dict[str, Split] = {}
        self.seed: Callable[[Split, float], None] | None = None  # makes a split's children

    def touch(self, key: str, model: str, rule: str, now: float) -> SliceRecord:
        """The slice's record, made when new, and now its most recently used."""
        entry = self.records.get(key)
        if entry is None:
            entry = self.records[key] = SliceRecord(model, rule)
            if len(self.records) > self._max_slices:
                evicted, _ = self.records.popitem(last=False)
                if evicted in self.guards:
                    self.publish()
        else:
            self.records.move_to_end(key)
        entry.seen = now
        return entry

    def publish(self) -> None:
        """A new snapshot of every slice not in its initial state."""
        self.guards = MappingProxyType(
            {k: s.state for k, s in self.records.items() if s.state != ON_START}
        )

    def move(self, key: str, entry: SliceRecord, transition: Transition) -> None:
        """A transition decided here: applied at once, or proposed to the shared store."""
        if self.shared:
            entry.proposed = True
            self.proposals[key] = transition
            return
        self.apply(key, transition)

    def apply(self, key: str, transition: Transition) -> None:
        """Make a transition the slice's state and log it (decided here or by the store)."""
        entry = self.records.get(key)
        if entry is None:
            return
        entry.restart(transition.after)
        self.events.append(transition)
        log.info("guardrail %s: %s", key, transition.reason)
        self.publish()
        if self._on_transition is not None:
            self._on_transition(transition)

    def change_split(self, split: Split, now: float) -> None:
        """A split or merge decided here: applied at once, or proposed to the shared store."""
        if self.shared:
            self.split_proposals[split.parent] = split
            return
        self.apply_split(split, now)

    def apply_split(self, split: Split, now: float, *, logged: bool = True) -> bool:
        """Make ``split`` the parent's (decided here or by the store) when it is newer than
        the one known: children made (``seed``) or dropped, and logged unless ``logged``
        is False (another replica's split, pulled). True when it changed.
        A slice that splits keeps its state, but what it saw before stops counting as its
        evidence (``fresh``, and ``split_at`` for its first tokens): it mixed in the
        children, and the parent is now the rest."""
        before = self.split_versions.get(split.parent)
        if before is not None and before.version >= split.version:
            return False
        self.split_versions[split.parent] = split
        kept = set(split.children())
        for child in before.children() if before is not None else ():
            if child not in kept:
                self.records.pop(child, None)
        parent = self.records.get(split.parent)
        if split.live and parent is not None and (before is None or not before.live):
            for pool in parent.windows.keys() | parent.remote.keys():
                parent.fresh[pool] = now  # what it saw mixed the children in: not its own
            parent.split_at = now
        if split.live and self.seed is not None:
            self.seed(split, now)
        self.splits = MappingProxyType({k: s for k, s in self.split_versions.items() if s.live})
        state = ON_START if parent is None else parent.state
        numbers = {"children": float(len(split.values))}
        self.publish()
        if not logged:  # another replica's, logged where it was decided
            return True
        event = Transition(split.parent, now, state, state, split.why, numbers)
        self.events.append(event)
        log.info("slices %s: %s", split.parent, split.why)
        if self._on_transition is not None:
            self._on_transition(event)
        return True
