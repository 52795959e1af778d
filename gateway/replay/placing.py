"""Which endpoint of a pool a replayed request goes to, and whether a cached conversation
follows its slice's rung: the strategies ``speclane replay`` and ``bench/agent_cache.py``
compare. Pure: no I/O, no clock (the replay's virtual clock is passed in).

- ``prefix`` (the default, what a live gateway does with ``SPECLANE_PREFIX_AFFINITY`` on):
  the gateway's own code. The prompt's hashes (``Features.prompt``), a prefix map of what
  was sent where (``gateway/state/prefixes.py``'s ``MemoryPrefixes``, one for every
  replica of the replay, as Redis shares it live) made into the request's affinity as the
  gateway makes it (``gateway/forward/affinity.py``, with the replica's step times as the
  pools' prices), ``backends/placement.py``'s ``place`` over the endpoints by the
  replica's own count of requests in flight and of prompt tokens awaiting their first
  token, and ``gateway/forward/moving.py``'s price when the conversation is cached on
  another pool than its slice's rung.
- ``least``: the fewest requests in flight (the gateway before prefix affinity).
- ``random``: uniform, from the scenario's seed.
- ``sticky``: the conversation's opening hashed over the pool's endpoints, whatever their
  load (session affinity with no bound).
- ``oracle``: ``prefix`` knowing every cache instead of guessing from what was sent
  where: ``place`` over what each endpoint's prefix cache holds of the prompt now
  (``Cluster.cached_tokens``, in the gateway's blocks) and the true counts of requests in
  flight: of the endpoints within the load bound, the one that holds the most beyond the
  conversation's opening (past the bound, the one that holds the most when that is worth
  its wait, by the same prices), else the opening's rendezvous choice; and the move price
  over what each pool truly holds.

Only ``prefix`` and ``oracle`` price a move between pools (the others follow the rung, as
the gateway did before the price existed); ``follow`` is ``prefix`` without the price.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from backends.placement import Affinity, place
from backends.sim.cluster import Cluster
from backends.sim.workload import CHARS_PER_TOKEN
from gateway.forward.affinity import Prices, affinity_of, unplaced
from gateway.forward.moving import Moved, keep_or_move
from gateway.forward.moving import Prices as MovePrices
from gateway.measure.conversations import Conversations
from gateway.prompt.prints import BLOCK_BYTES
from gateway.settings import Settings
from gateway.state.prefixes import MemoryPrefixes, opening_entry, probes
from policies.decision import Decision
from policies.features import Features

Strategy = Literal["prefix", "follow", "least", "random", "sticky", "oracle"]
STRATEGIES: tuple[Strategy, ...] = ("least", "random", "sticky", "prefix", "follow", "oracle")
_DEFAULTS = Settings.model_fields
EPSILON: float = _DEFAULTS["prefix_load_epsilon"].default
_MIX = 0x9E3779B97F4A7C15


@dataclass(frozen=True, slots=True)
class _Load:
    url: str
    outstanding: int
    prefilling: int = 0


@dataclass(frozen=True, slots=True)
class _Member:
    pool: str


class _Where:
    """The replay's endpoints as ``keep_or_move`` asks of pools: every one in service."""

    def __init__(self, endpoints: Mapping[str, list[str]]) -> None:
        self._pool = {name: pool for pool, names in endpoints.items() for name in names}
        self._names = endpoints

    def endpoint(self, url: str) -> _Member | None:
        pool = self._pool.get(url)
        return None if pool is None else _Member(pool)

    def healthy(self, pool: str) -> bool:
        return True

    def urls(self, rungs: Sequence[str]) -> list[str]:
        return [name for pool in rungs for name in self._names.get(pool, ())]


class Placing:
    """One replay's endpoint choice (module docstring)."""

    def __init__(self, strategy: Strategy, cluster: Cluster, seed: int, clock: list[float]):
        self.strategy = strategy
        self._cluster = cluster
        self._where = _Where(cluster.endpoints())
        self._rng = random.Random(f"{seed}:placement")
        self.prefixes = MemoryPrefixes(
            _DEFAULTS["prefix_ttl_s"].default,
            clock=lambda: clock[0],
            max_entries=_DEFAULTS["prefix_map_entries"].default,
        )
        self.moves: dict[str, int] = {}

    def affinity(
        self,
        features: Features,
        body: Mapping[str, object],
        costs: Prices,
    ) -> Affinity | None:
        """What the gateway knows of where the prompt is (``prefix`` and ``follow``: the
        prefix map read as ``gateway/pipeline.py`` reads it, by the same construction), or
        what every endpoint truly holds of it, in the gateway's blocks (``oracle``);
        ``costs``: the pools' prices, as the replica's step times say them."""
        prompt = features.prompt
        opened: str | None = None
        if self.strategy == "oracle":
            held = {
                name: tokens * CHARS_PER_TOKEN // BLOCK_BYTES
                for pool in self._cluster.pools
                for name, tokens in self._cluster.cached_tokens(pool, body).items()
            }
        elif self.strategy not in ("prefix", "follow"):
            return None
        elif (short := unplaced(features, EPSILON)) is not None:
            return short
        else:
            held = self.prefixes.lookup(probes(prompt.chain))
            opened = self.prefixes.at(opening_entry(prompt.opening))
        return affinity_of(features, held, opened, EPSILON, costs)

    def priced(
        self,
        decision: Decision,
        features: Features,
        affinity: Affinity | None,
        views: MovePrices,
        conversations: Conversations,
        now: float,
        kept: Callable[[str], float],
    ) -> Decision:
        """The decision after the move price (``prefix`` only), the outcome counted;
        ``kept``: what each endpoint keeps of what it is sent, as the replica measures it
        (``LoadMeter.kept``)."""
        conversations.saw(decision.slice, features.prompt.opening, features.prompt.turn, now)
        if affinity is None or self.strategy not in ("prefix", "oracle"):
            return decision
        moved, how, _ = keep_or_move(
            decision, features, affinity, self._where, views, conversations, now, kept
        )
        if how is not None:
            self.moves[how.value] = self.moves.get(how.value, 0) + 1
        return moved

    def choose(
        self,
        pool: str,
        body: Mapping[str, object],
        features: Features,
        affinity: Affinity | None,
        own: Mapping[str, int],
        queued: Mapping[str, int],
    ) -> str:
        """The endpoint of ``pool`` the request goes to; ``own``: the replica's count of
        its requests in flight on each endpoint, ``queued`` of the prompt tokens they await
        a first token for."""
        names = self._cluster.endpoints()[pool]
        loads = sorted(
            (_Load(n, own.get(n, 0), queued.get(n, 0)) for n in names),
            key=lambda e: (e.outstanding, e.url),
        )
        if self.strategy == "random":
            return self._rng.choice(names)
        if self.strategy == "sticky":
            return names[((features.prompt.opening * _MIX) >> 32) % len(names)]
        if self.strategy == "oracle" and affinity is not None:
            true = dict(zip(names, self._cluster.outstanding(pool), strict=True))
            loads = sorted(
                (_Load(n, true[n], queued.get(n, 0)) for n in names), key=lambda e: e.outstanding
            )
            return place(loads, affinity, lambda _: 1.0, pool)[0][0].url
        if affinity is None:
            return loads[0].url
        return place(loads, affinity, lambda _: 1.0, pool)[0][0].url

    def mirror(self, pool: str, affinity: Affinity | None, own: Mapping[str, int]) -> str | None:
        """Where a shadow mirror goes: with an affinity, ``place`` over the shadow pool (the
        conversation's opening picks one endpoint, as ``gateway/forward/shadow.py`` does);
        else the least loaded (None: the cluster's choice)."""
        if affinity is None:
            return None
        names = self._cluster.endpoints()[pool]
        loads = sorted(
            (_Load(n, own.get(n, 0)) for n in names), key=lambda e: (e.outstanding, e.url)
        )
        return place(loads, affinity, lambda _: 1.0)[0][0].url

    def sent(self, features: Features, endpoint: str) -> None:
        """Where the prompt now is, for the turns that follow (as the gateway keeps it)."""
        prompt = features.prompt
        if self.strategy in ("prefix", "follow") and prompt.chain:
            self.prefixes.keep(prompt.chain, prompt.opening, endpoint)


__all__ = ["STRATEGIES", "Moved", "Placing", "Strategy"]
