"""The gateway's measurement in virtual time: what a replica sees of the pools, as it sees it
live.

A replay runs the gateway's own measurement code, not a model of it. Each replica here has
its own live statistics (``LiveStats``, the guardrail), its own load meter (``LoadMeter``)
and its own count of the requests it has in flight on each endpoint, integrated exactly
(``InFlight``, as ``backends/pool.py`` keeps it). What a live replica does on a timer runs
on the same period in virtual time, at the first event on or after it is due:

- the load meter samples every ``SAMPLE_EVERY_S``;
- the engines' own counts of running and waiting requests are read every
  ``scrape_interval_s`` (the gateway's default), and held as fresh for one and a half of
  those, so what an endpoint counts beyond this replica's own requests (other replicas')
  lags as it does live; so are their step counters (``Cluster.counters``, what the
  simulator's metrics page counts, on the engines whose page has vLLM's step histogram),
  and the mean step between two of a replica's readings of an engine teaches its pool's
  step time, as ``LoadScraper`` does live;
- the guardrail ticks every ``TICK_EVERY_S``;
- with several replicas, each syncs with the shared store every ``sync_interval_s``
  (``gateway/replay/shared.py``), staggered.

A replica admits shadow mirrors by the gateway's own bounds (``Admission``: mirrors in
flight, the target pool's least busy endpoint by the replica's own count, a token budget a
minute, at the gateway's default bounds), so a busy pool drops mirrors here as it does
live. An outcome reaches a replica's live statistics the way ``Feedback.record`` hands it on
live: with its mean load and the prompts prefilled beside it (``loaded_outcome``), which a
replica knows only of its own requests, each counted when its first token comes out (a
stream's first event). Each replica learns its slices' conversations (turns, output tokens
per turn) from its own requests, as ``Feedback`` does live, for the price of moving one.
Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from backends.pool import InFlight
from backends.sim.dialects import SimEngine
from gateway.forward.shadow import Admission, ShadowLimits
from gateway.measure.acceptance import Outcome, Status
from gateway.measure.conversations import Conversations
from gateway.measure.enginesteps import EngineReading, since_last
from gateway.measure.livestats import TICK_EVERY_S, LiveStats
from gateway.measure.load import SAMPLE_EVERY_S, LoadMeter, loaded_outcome
from gateway.measure.replica import Replica
from gateway.settings import Settings
from policies.compiled import CompiledPolicy
from policies.guardrail import Transition

SCRAPE_EVERY_S: float = Settings.model_fields["scrape_interval_s"].default
SYNC_EVERY_S: float = Settings.model_fields["sync_interval_s"].default


@dataclass(slots=True)
class _Due:
    """When a periodic task of one replica runs next."""

    every_s: float
    at: float

    def ready(self, now: float) -> bool:
        if now < self.at:
            return False
        self.at += self.every_s * max(1, int((now - self.at) // self.every_s) + 1)
        return True


@dataclass(slots=True)
class Gateway:
    """One gateway replica in a replay (module docstring)."""

    index: int
    stats: LiveStats
    load: LoadMeter
    clock: list[float]
    flights: dict[str, InFlight] = field(default_factory=dict)
    due: dict[str, _Due] = field(default_factory=dict)
    admission: Admission = field(default_factory=lambda: Admission(ShadowLimits(), 0.0))
    mirrors: int = 0  # in flight
    conversations: Conversations = field(default_factory=Conversations)
    prefilling: dict[str, int] = field(default_factory=dict)  # as ``Endpoint.prefilling``
    readings: dict[str, EngineReading] = field(default_factory=dict)  # each engine's last

    def mirror(self, endpoints: Sequence[str], cost_tokens: int, now: float) -> bool:
        """Whether a mirror to a pool of ``endpoints`` starts (counted in flight if so)."""
        own = [self.flights[name].count if name in self.flights else 0 for name in endpoints]
        least = min(own) if own else None
        if self.admission.refusal(self.mirrors, least, cost_tokens, now) is not None:
            return False
        self.mirrors += 1
        return True

    def sent(self, endpoint: str) -> None:
        flight = self._flight(endpoint)
        flight.move(flight.count + 1)

    def done(self, endpoint: str) -> None:
        flight = self._flight(endpoint)
        flight.move(flight.count - 1)

    def prefilled(
        self,
        endpoint: str,
        prompt_tokens: int,
        now: float,
        key: str = "",
        computed: int | None = None,
    ) -> None:
        self.load.prefill(endpoint, prompt_tokens, now, key, computed)

    def record(self, outcome: Outcome, now: float, key: str = "") -> None:
        loaded = loaded_outcome(self.load, outcome, key)
        self.stats.record(loaded, now)
        if not loaded.labels.shadow and loaded.status is Status.OK:
            self.conversations.answered(loaded.labels.slice, loaded.completion_tokens)

    def own(self) -> dict[str, int]:
        """Its requests in flight on each endpoint (what its pools count live)."""
        return {name: flight.count for name, flight in self.flights.items()}

    def _flight(self, endpoint: str) -> InFlight:
        flight = self.flights.get(endpoint)
        if flight is None:
            flight = self.flights[endpoint] = InFlight(lambda: self.clock[0], at=self.clock[0])
        return flight


class Replicas:
    """Every replica of a replayed deployment, and their timers."""

    def __init__(
        self,
        count: int,
        policy: CompiledPolicy,
        endpoints: Mapping[str, Sequence[str]],
        on_transition: Callable[[Transition], None],
    ) -> None:
        self._endpoints = endpoints
        self._pools = {name: pool for pool, names in endpoints.items() for name in names}
        self._k = {name: spec.num_speculative_tokens for name, spec in policy.pools.items()}
        # only a vLLM-shaped page carries the step histogram the live scraper reads
        self._counted = {
            name for name, spec in policy.pools.items() if SimEngine(spec.engine.value).vllm_shaped
        }
        self.clock = [0.0]
        ladders = {model: ladder.pools for model, ladder in policy.ladders.items()}
        self.all: list[Gateway] = []
        for i in range(count):
            flights: dict[str, InFlight] = {}
            load = LoadMeter(
                self._counts(flights), lambda: ladders, gauge_fresh_s=1.5 * SCRAPE_EVERY_S
            )
            stats = LiveStats(lambda: policy, on_transition=on_transition, load=load.ladder)
            offset = i / count  # replicas' timers do not run in step
            due = {
                "sample": _Due(SAMPLE_EVERY_S, 0.0),
                "scrape": _Due(SCRAPE_EVERY_S, offset * SCRAPE_EVERY_S),
                "tick": _Due(TICK_EVERY_S, offset * TICK_EVERY_S),
                "sync": _Due(SYNC_EVERY_S, offset * SYNC_EVERY_S),
            }
            self.all.append(Gateway(i, stats, load, self.clock, flights, due))

    def _counts(
        self, flights: dict[str, InFlight]
    ) -> Callable[[], dict[str, list[tuple[str, int, float]]]]:
        def counts() -> dict[str, list[tuple[str, int, float]]]:
            out: dict[str, list[tuple[str, int, float]]] = {}
            for pool, names in self._endpoints.items():
                rows = out[pool] = []
                for name in names:
                    flight = flights.get(name)
                    own = (flight.count, flight.area()) if flight is not None else (0, 0.0)
                    rows.append((name, *own))
            return out

        return counts

    def _engine_steps(
        self, replica: Gateway, counters: Mapping[str, tuple[int, int, int, int, int]], now: float
    ) -> None:
        """Each engine's mean step since the replica's last reading of its counters, to the
        replica's step times, as ``LoadScraper`` hands them on live (``enginesteps.py``)."""
        for name, (steps, tokens, prompt, running, cached) in counters.items():
            pool = self._pools.get(name)
            if pool is None or pool not in self._counted:
                continue
            current = EngineReading(now, steps, tokens, prompt, running, cached)
            step = since_last(replica.readings, name, current)
            if step is not None:
                k = self._k.get(pool)
                replica.stats.steps.learn_engine(
                    pool, k, step.seconds, step.batch, step.prefill, now
                )

    def of(self, client: int) -> Gateway:
        """The replica a client's requests reach (a load balancer that keeps a client on one
        replica)."""
        return self.all[client % len(self.all)]

    def advance(
        self,
        now: float,
        engine_counts: Callable[[], Mapping[str, int]],
        sync: Callable[[Replica, float], None] | None,
        engine_counters: Callable[[], Mapping[str, tuple[int, int, int, int, int]]] | None = None,
    ) -> None:
        """Run what is due at ``now`` on every replica: samples, gauge reads (and, with
        ``engine_counters``, the engines' step counters), ticks, syncs."""
        self.clock[0] = now
        for replica in self.all:
            if replica.due["sample"].ready(now):
                replica.load.sample(now)
            if replica.due["scrape"].ready(now):
                for name, running in engine_counts().items():
                    own = replica.flights.get(name)
                    replica.load.scraped(name, running, own.count if own else 0, now)
                if engine_counters is not None:
                    self._engine_steps(replica, engine_counters(), now)
            if replica.due["tick"].ready(now):
                replica.stats.tick(now)
            if sync is not None and replica.due["sync"].ready(now):
                sync(replica.stats.replica, now)
