"""The replica protocol: what the shared store (``gateway/state/memory.py``,
``gateway/state/redis_store.py``) does with live statistics, and nothing else does.

With several replicas, local windows hold only the increments not yet pushed (``drain``,
and ``restore`` when a push failed); ``merge_remote`` keeps the merged totals of every
replica as last pulled, and a slice's evidence is their sum. While the store is
``reachable``, transitions are not applied locally but proposed; the store applies each one
once for everybody (compare-and-set on the state's version) and the replica then
``apply``-s it, ``adopt``-s the state another replica won with, or ``abandon``-s the
proposal. Splits by application (``children.py``) are agreed the same way: a split or
merge is proposed with its version, the store places it once, and every replica applies
the newest it pulls. While the store is unreachable the replica applies its transitions
and splits itself, as a single process does.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import NamedTuple

from gateway.measure.slicerecord import Increment
from gateway.measure.slices import Slices
from gateway.measure.windows import Counts, Window
from policies.guardrail import ON_START, SliceState, Transition
from policies.splitting import Split


class Kept(NamedTuple):
    """A slice, the model and rule it belongs to, and its guardrail state."""

    slice: str
    model: str
    rule: str
    state: SliceState


class Active(NamedTuple):
    """A slice whose windows are worth pulling: the epoch they are kept under, and the pools
    they hold."""

    slice: str
    model: str
    rule: str
    epoch: int
    pools: tuple[str, ...]


class Replica:
    """One replica's side of the shared store's protocol."""

    __slots__ = ("_slices",)

    def __init__(self, slices: Slices) -> None:
        self._slices = slices

    @property
    def events(self) -> deque[Transition]:
        """The guardrail events this replica saw, oldest first."""
        return self._slices.events

    def reachable(self, connected: bool) -> None:
        """The store answered: transitions are proposed to it. It did not: they are applied
        here, those proposed and not placed yet too."""
        self._slices.shared = connected
        if not connected:
            for key, transition in self.take_proposals().items():
                self.apply(key, transition)
            for split in self.take_split_proposals().values():
                self.apply_split(split, split.since)

    def take_proposals(self) -> dict[str, Transition]:
        slices = self._slices
        taken, slices.proposals = slices.proposals, {}
        return taken

    def take_split_proposals(self) -> dict[str, Split]:
        slices = self._slices
        taken, slices.split_proposals = slices.split_proposals, {}
        return taken

    def apply_split(self, split: Split, now: float) -> bool:
        """A split or merge the store placed, or another replica did (when newer than the
        one known): children made or dropped. True when it changed."""
        return self._slices.apply_split(split, now)

    def adopt_split(self, split: Split, now: float) -> bool:
        """A split another replica placed, when newer than the one known (not logged
        here). True when it changed."""
        return self._slices.apply_split(split, now, logged=False)

    def splits(self) -> Iterator[Split]:
        """Every split known, merged ones too (their versions go on rising)."""
        yield from self._slices.split_versions.values()

    def apply(self, key: str, transition: Transition) -> None:
        self._slices.apply(key, transition)

    def adopt(self, key: str, model: str, rule: str, state: SliceState, now: float) -> bool:
        """Take a state decided elsewhere when it is newer; True when it changed."""
        entry = self._slices.touch(key, model, rule, now)
        if state.version <= entry.state.version:
            return False
        entry.restart(state)
        self._slices.publish()
        return True

    def abandon(self, key: str) -> None:
        """Forget a proposal the store could not place; the slice may propose again."""
        entry = self._slices.records.get(key)
        if entry is not None:
            entry.proposed = False

    def kept(self, key: str) -> Kept | None:
        entry = self._slices.records.get(key)
        return None if entry is None else Kept(key, entry.model, entry.rule, entry.state)

    def states(self) -> Iterator[Kept]:
        """Every slice not in its initial state."""
        for key, entry in self._slices.records.items():
            if entry.state != ON_START:
                yield Kept(key, entry.model, entry.rule, entry.state)

    def active(self, since: float) -> Iterator[Active]:
        """Slices seen since ``since`` or not at rest."""
        for key, entry in self._slices.records.items():
            if entry.seen >= since or entry.state != ON_START:
                pools = tuple(entry.windows)
                yield Active(key, entry.model, entry.rule, entry.window_epoch, pools)

    def drain(self) -> list[Increment]:
        """Local increments not yet pushed, emptied."""
        out = []
        for key, entry in self._slices.records.items():
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
            entry = self._slices.records.get(inc.slice)
            if entry is None or entry.window_epoch != inc.epoch:
                continue
            window = entry.windows.get(inc.pool)
            if window is None:
                window = entry.windows[inc.pool] = Window(inc.window_s)
            window.add(inc.start, inc.counts)

    def merge_remote(self, key: str, epoch: int, pool: str, buckets: dict[float, Counts]) -> None:
        """The totals of every replica for one pool, as pulled; replaces the last pull."""
        entry = self._slices.records.get(key)
        if entry is not None and entry.window_epoch == epoch:
            entry.remote[pool] = buckets
