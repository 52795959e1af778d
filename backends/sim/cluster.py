"""Several simulated pools in one virtual time: a discrete-event run for policy replay.

Each pool has one or more endpoints; each endpoint runs its own continuous-batching
``Scheduler`` (the one the HTTP server runs), step after step, while it has work. The caller
drives time: it submits a request to a pool at a virtual second (the least loaded endpoint
takes it), asks when the next step ends (``next_event``) and runs that step (``advance``),
which hands back every request the step finished; ``started`` then lists the requests that
got their first token in that step (their prefill done: the moment a gateway in front sees
their stream open). So a caller can make each routing decision at a request's arrival from
the outcomes that finished before it, as a gateway does. ``outstanding`` and each
request's mean load are what a gateway in front would see: requests sent to the endpoint
and not yet finished (running or waiting). Each endpoint runs its ``SimConfig``'s engine
whole: chunked prefill within ``max_num_batched_tokens``, outputs merged when the API
server's ``stream_cost_s`` outruns the step, and its KV memory and prefix cache (a request
resent with a longer conversation prefills only what the endpoint has not cached; short of
blocks, requests wait or are preempted; ``backends/sim/engine.py``). Requests are cached
under their prompts only: the replay's bodies carry their own history.

Pure: no I/O, no clock reads, no global random state.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from backends.sim.config import SimConfig
from backends.sim.engine import Scheduler, Step
from backends.sim.engine import Sequence as Seq
from backends.sim.model import build_profile
from backends.sim.prefix import prompt_hashes
from backends.sim.workload import Workload, estimate_prompt_tokens


@dataclass(slots=True)
class Served:
    """One finished request: what a client and a gateway in front of the endpoint saw.

    ``load`` is the time-weighted mean of the endpoint's outstanding requests over the
    request's life (itself included). ``chunks`` counts the outputs the API server handed it,
    i.e. SSE content chunks at ``--stream-interval 1`` (one per engine step that gave it
    tokens unless outputs merged under load); ``first`` and ``last`` are when the first and
    the last of them came. ``steps`` counts the engine steps that gave it tokens.
    ``cached_tokens`` are the prompt tokens the endpoint's prefix cache held when it was
    admitted (vLLM's ``cached_tokens``); ``preemptions`` the times it was sent back to the
    queue for want of KV blocks.
    """

    key: int
    pool: str
    endpoint: str
    arrival: float
    workload: Workload
    acceptance: float
    prompt_tokens: int
    k: int | None
    first: float = 0.0
    last: float = 0.0
    done: float = 0.0
    completion_tokens: int = 0
    chunks: int = 0
    steps: int = 0
    num_spec_steps: int = 0
    num_draft_tokens: int = 0
    num_accepted_draft_tokens: int = 0
    finish_reason: str = ""
    load: float = 1.0
    area_at_arrival: float = 0.0
    cached_tokens: int = 0
    preemptions: int = 0


@dataclass(slots=True, eq=False)
class _Endpoint:
    name: str
    pool: str
    config: SimConfig
    scheduler: Scheduler
    busy_until: float = 0.0
    step: Step | None = None
    outstanding: int = 0
    area: float = 0.0
    area_t: float = 0.0
    submitted: int = 0
    busy_s: float = 0.0  # engine-seconds stepped
    served: dict[int, Served] = field(default_factory=dict)  # id(seq) -> record

    def integrate(self, now: float) -> None:
        self.area += self.outstanding * (now - self.area_t)
        self.area_t = now


class Cluster:
    """Pools of simulated endpoints sharing one virtual clock."""

    def __init__(self, pools: Mapping[str, Sequence[SimConfig]]) -> None:
        self._pools: dict[str, list[_Endpoint]] = {}
        for pool, configs in pools.items():
            self._pools[pool] = [
                _Endpoint(
                    f"{pool}#{i}",
                    pool,
                    config,
                    Scheduler.for_config(config),
                )
                for i, config in enumerate(configs)
            ]
        self._busy: list[tuple[float, int, _Endpoint]] = []
        self._tiebreak = 0
        self.started: list[Served] = []

    @property
    def pools(self) -> Mapping[str, int]:
        """Endpoints per pool."""
        return {pool: len(endpoints) for pool, endpoints in self._pools.items()}

    def endpoints(self) -> dict[str, list[str]]:
        """Every pool's endpoints by name, as submit names them."""
        return {pool: [e.name for e in endpoints] for pool, endpoints in self._pools.items()}

    def in_engine(self) -> dict[str, int]:
        """Requests each endpoint runs and queues, by its own count (what its metrics page's
        running and waiting gauges say)."""
        return {e.name: e.outstanding for group in self._pools.values() for e in group}

    def counters(self) -> dict[str, tuple[int, int, int, int, int]]:
        """Per endpoint, what its metrics page counts (``backends/sim/metrics.py``): its
        engine steps, the tokens they scheduled (prompt and generated), its prompt tokens,
        the requests it runs now, and the prompt tokens its prefix cache held."""
        out = {}
        for group in self._pools.values():
            for e in group:
                c, scheduler = e.scheduler.counters, e.scheduler
                scheduled = c.prompt_tokens + c.generation_tokens
                running = scheduler.num_running
                out[e.name] = (c.steps, scheduled, c.prompt_tokens, running, c.cached_prompt_tokens)
        return out

    def usage(self, now: float) -> dict[str, tuple[float, float]]:
        """Per endpoint: the engine-seconds it has stepped (its GPU busy, prefill and decode)
        and its requests outstanding integrated over time, both up to ``now``."""
        out = {}
        for group in self._pools.values():
            for e in group:
                e.integrate(max(now, e.area_t))
                out[e.name] = (e.busy_s, e.area)
        return out

    def outstanding(self, pool: str) -> list[int]:
        """Requests sent to each endpoint of ``pool`` and not yet finished."""
        return [e.outstanding for e in self._pools[pool]]

    def cached_tokens(self, pool: str, body: Mapping[str, object]) -> dict[str, int]:
        """Tokens of ``body``'s prompt each endpoint of ``pool`` holds in its prefix cache
        now, by endpoint name (what a router that knew every cache would see)."""
        out = {}
        hashed: dict[int, tuple[int, ...]] = {}  # by block size: hashed once
        for e in self._pools[pool]:
            config, kv = e.config, e.scheduler.kv
            if kv is None or not config.enable_prefix_caching:
                out[e.name] = 0
                continue
            size = config.block_size
            hashes = hashed.get(size)
            if hashes is None:
                hashes = hashed[size] = prompt_hashes(body, size)
            out[e.name] = kv.cached_prefix(hashes, estimate_prompt_tokens(body))
        return out

    def submit(
        self,
        key: int,
        pool: str,
        body: Mapping[str, object],
        at: float,
        max_tokens: int,
        endpoint_name: str | None = None,
    ) -> str:
        """Send a request to the endpoint ``endpoint_name`` of ``pool`` (None: the least
        loaded) at virtual second ``at`` (never earlier than an event already run); returns
        the endpoint's name."""
        endpoints = self._pools[pool]
        if endpoint_name is None:
            endpoint = min(endpoints, key=lambda e: e.outstanding)
        else:
            endpoint = next(e for e in endpoints if e.name == endpoint_name)
        config = endpoint.config
        profile = build_profile(
            body,
            seed=config.seed,
            index=endpoint.submitted,
            max_tokens=max_tokens,
            now_s=at,
            model=config.acceptance,
            drift=config.drift,
        )
        endpoint.submitted += 1
        hashes = prompt_hashes(body, config.block_size) if config.enable_prefix_caching else ()
        seq = Seq(profile, config.k, hashes=hashes)
        endpoint.integrate(at)
        endpoint.outstanding += 1
        endpoint.served[id(seq)] = Served(
            key,
            pool,
            endpoint.name,
            at,
            profile.workload,
            profile.acceptance,
            profile.prompt_tokens,
            config.k if config.speculative else None,
            finish_reason=profile.finish_reason,
            area_at_arrival=endpoint.area,
        )
        endpoint.scheduler.submit(seq)
        if endpoint.step is None:
            self._start(endpoint, at)
        return endpoint.name

    def next_event(self) -> float | None:
        """When the earliest running step ends; None when every endpoint is idle."""
        return self._busy[0][0] if self._busy else None

    def advance(self) -> list[Served]:
        """Run the earliest step to its end; the requests it finished, in endpoint order.
        ``started`` then holds the requests whose first token that step gave."""
        now, _, endpoint = heapq.heappop(self._busy)
        step, endpoint.step = endpoint.step, None
        assert step is not None
        served = endpoint.served
        self.started = []
        for seq, event in step.events:
            if event.tokens:
                served[id(seq)].completion_tokens += event.tokens
                served[id(seq)].steps += 1
        for seq, _ in step.outputs:
            record = served[id(seq)]
            if record.chunks == 0:
                record.first = now
                self.started.append(record)
            record.last = now
            record.chunks += 1
        endpoint.integrate(now)
        finished = [seq for seq, event in step.events if event.finished]
        for seq in finished:
            self._finish(endpoint, seq, now)
        if endpoint.scheduler.has_work():
            self._start(endpoint, now)
        return [served.pop(id(seq)) for seq in finished]

    @staticmethod
    def _finish(endpoint: _Endpoint, seq: Seq, now: float) -> None:
        record = endpoint.served[id(seq)]
        tally = seq.tally
        record.num_spec_steps = tally.num_spec_steps
        record.num_draft_tokens = tally.num_draft_tokens
        record.num_accepted_draft_tokens = tally.num_accepted_draft_tokens
        record.cached_tokens = max(seq.cached, 0)
        record.preemptions = seq.preemptions
        record.done = now
        span = now - record.arrival
        record.load = (endpoint.area - record.area_at_arrival) / span if span > 0 else 1.0
        endpoint.outstanding -= 1

    def _start(self, endpoint: _Endpoint, at: float) -> None:
        step = endpoint.scheduler.step()
        endpoint.step = step
        endpoint.busy_s += step.seconds
        endpoint.busy_until = at + step.seconds
        self._tiebreak += 1
        heapq.heappush(self._busy, (endpoint.busy_until, self._tiebreak, endpoint))
