"""The shared store's protocol in virtual time, for a replay of several gateway replicas.

What ``gateway/state/redis_store.py`` does with Redis on each sync, done here with a dict,
through the same replica protocol (``gateway/measure/replica.py``), in the same order:

1. each transition the replica proposed is applied only when the slice's stored state still
   has the version the proposal started from (compare-and-set), logged once; a proposal
   that lost adopts the winner's state, and one with nothing stored to compare is dropped;
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

PULL_ACTIVE_S = 300.0  # as the Redis store: windows of slices seen this recently


class VirtualStore:
    """Guardrail states and window totals shared by a replay's replicas."""

    def __init__(self, policy: CompiledPolicy) -> None:
        self._policy = policy
        self.states: dict[str, tuple[str, str, SliceState]] = {}
        self.windows: dict[tuple[str, int, str], dict[float, Counts]] = {}

    def sync(self, replica: Replica, now: float) -> None:
        """One round of one replica: agree on transitions, push, pull."""
        increments = replica.drain()
        self._commit(replica, now)
        for inc in increments:
            buckets = self.windows.setdefault((inc.slice, inc.epoch, inc.pool), {})
            buckets.setdefault(inc.start, Counts()).add(inc.counts)
        for key, (model, rule, state) in self.states.items():
            replica.adopt(key, model, rule, state, now)
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
            version = stored[2].version if stored is not None else 0
            if version == transition.before.version:
                self.states[key] = (kept.model, kept.rule, transition.after)
                replica.apply(key, transition)  # logged once, by the replica that won
            elif stored is not None:
                replica.adopt(key, *stored, now)
            else:
                replica.abandon(key)


def _copy(counts: Counts) -> Counts:
    copy = Counts()
    copy.add(counts)
    return copy
