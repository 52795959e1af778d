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
