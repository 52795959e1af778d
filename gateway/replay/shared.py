"""The shared store's protocol in virtual time, for a replay of several gateway replicas.

What ``gateway/state/redis_store.py`` does with Redis on each sync, done here with a dict,
through the same replica protocol (``gateway/measure/replica.py``), in the same order:

1. each transition the replica proposed is applied only when the slice's stored state still
   has the version the proposal started from, or none is stored (compare-and-set), logged
   once; a proposal that lost adopts the winner's state; splits of slices by application
   are agreed the same way, on their own versions;
2. the replica's window increments are added to the totals of every replica;
3. it pulls every stored state (adopting newer ones) and the totals of the windows of the
   slices it keeps.

So replicas disagree for at most one sync interval, as they do live. Pure: no I/O, no clock.
"""

from __future__ import annotations

from gateway.measure.replica import Replica
from gateway.measure.windows import Counts
from policies.compiled import CompiledPolicy
from policies.guardrail import SliceState
from policies.splitting import Split

PULL_ACTIVE_S = 300.0  # as the Redis store: windows of slices seen this recently


class VirtualStore:
    """Guardrail states and window totals shared by a replay's replicas."""

    def __init__(self, policy: CompiledPolicy) -> None:
        self._policy = policy
        self.states: dict[str, tuple[str, str, SliceState]] = {}
        self.windows: dict[tuple[str, int, str], dict[float, Counts]] = {}
        self.splits: dict[str, Split] = {}

    def sync(self, replica: Replica, now: float) -> None:
        """One round of one replica: agree on transitions, push, pull."""
        increments = replica.drain()
        self._commit(replica, now)
        for inc in increments:
            buckets = self.windows.setdefault((inc.slice, inc.epoch, inc.pool), {})
            buckets.setdefault(inc.start, Counts()).add(inc.counts)
        for key, (model, rule, state) in self.states.items():
            replica.adopt(key, model, rule, state, now)
        for split in self.splits.values():
            replica.adopt_split(split, now)
        for active in replica.active(now - PULL_ACTIVE_S):
            ladder = self._policy.ladders.get(active.model)
            for pool in ladder.pools if ladder else ():
                totals = self.windows.get((active.slice, active.epoch, pool), {})
                merged = {start: _copy(counts) for start, counts in totals.items()}
                replica.merge_remote(active.slice, active.epoch, pool, merged)
        replica.reachable(True)

    def _commit(self, replica: Replica, now: float) -> None:
        for key, transition in replica.take_proposals().items():
            kept = replica.kept(key)
            if kept is None:
                continue
            stored = self.states.get(key)
            if stored is None or stored[2].version == transition.before.version:
                self.states[key] = (kept.model, kept.rule, transition.after)
                replica.apply(key, transition)  # logged once, by the replica that won
            else:
                replica.adopt(key, *stored, now)
        for parent, split in replica.take_split_proposals().items():
            known = self.splits.get(parent)
            if known is None or known.version == split.version - 1:
                self.splits[parent] = split
                replica.apply_split(split, now)
            else:
                replica.adopt_split(known, now)


def _copy(counts: Counts) -> Counts:
    copy = Counts()
    copy.add(counts)
    return copy
