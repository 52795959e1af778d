"""Replay a scenario in virtual time through the real decision code.

Steps 2-4 and 6-7 of a request are the gateway's own: ``schema.parse``, ``classify``,
``decide``, the acceptance ``Fold`` and ``LiveStats.record``/``tick`` (which step the
guardrail), with the load meter between them as a running gateway has it: its own requests
in flight integrated exactly, the engines' gauges read every few seconds, prompts counted as
prefilled when their first token comes, each replica of the deployment
(``Scenario.gateways``) with its own and sharing state as through Redis
(``gateway/replay/replicas.py``, ``gateway/replay/shared.py``). Step 5 is
``backends.sim.cluster``: every pool of the model's ladder as simulated endpoints sharing
one virtual clock. Each routing decision is made at the request's arrival, from the
guardrail state that the outcomes finished before it left; shadow mirrors run too (they load
their pool and are measured, and cost what they cost).

Within a pool, a request goes to the endpoint the live gateway would choose: its prompt's
prefix placed under the load bound by ``backends/placement.py``, over a prefix map of what
was sent where, and a conversation cached on another pool than its slice's rung kept there
or moved by ``gateway/forward/moving.py``'s price (``placement``: the other strategies
``bench/agent_cache.py`` compares; ``gateway/replay/placing.py``). A traffic class with a
``session`` sends multi-turn conversations (``bodies.Talk``), each turn after the answer to
the one before.

Every request is kept as a ``Row`` with what pricing needs: its true per-token acceptance,
its tokens, its mean context while decoding (prompt plus half its answer), the pool that
served it, and the load actually carried while it ran (mean requests in flight per endpoint
over the whole ladder), and what the agent benchmarks read: its endpoint, its first token,
its prompt and the part of it the endpoint held cached, its conversation and turn. The pools
step on the replay's cost model (``cost``: unless given, the curve measured on an H200 for
the model's size, ``GPU_32B`` for ``qwen3-32b``), and pricing uses the same one. Pure apart
from CPU: no I/O, no clock.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import count
from typing import Any

import orjson

from backends.sim.agents import chat_of
from backends.sim.cluster import Cluster, Served
from backends.sim.config import Mode, SimConfig
from backends.sim.model import CostModel, StepCost, measured_for, scaled_draft
from backends.sim.validation import SimHTTPError
from gateway import schema
from gateway.apis import APIS, named
from gateway.classify import Defaults, classify
from gateway.engines import ENGINES
from gateway.errors import ApiError
from gateway.forward.affinity import prices
from gateway.forward.shadow import short_probe
from gateway.measure.acceptance import Fold, Labels, Outcome, Status
from gateway.replay.bodies import Talk, build
from gateway.replay.placing import Placing, Strategy
from gateway.replay.replicas import Gateway, Replicas
from gateway.replay.scenario import Scenario, Traffic
from gateway.replay.shared import VirtualStore
from gateway.state.flagstore import FlagStore
from policies.compiled import CompiledPolicy, Ladder
from policies.decide import decide
from policies.decision import Decision
from policies.guardrail import Transition
from policies.model import PoolKind


@dataclass(slots=True)
class Row:
    """One request (or shadow mirror) of a replay."""

    index: int
    traffic: str
    client: int
    phase: str
    slice: str
    rule: str
    pool: str
    rung: int
    probe: bool
    shadow: bool
    arrival: float
    reason: str
    done: float = 0.0
    tokens: int = 0
    acceptance: float = 0.0
    load: float = 1.0
    measured: float | None = None
    context: float = 0.0
    endpoint: str = ""
    first: float = 0.0  # its first token
    prompt_tokens: int = 0
    cached: int = 0  # prompt tokens its endpoint's prefix cache held
    talk: str = ""  # its conversation (a session class's), and its turn there
    turn: int = 0


@dataclass(slots=True)
class Replay:
    """A finished replay: every request, every guardrail event, the ladder it ran on."""

    scenario: Scenario
    ladder: Ladder
    endpoints: dict[str, int]
    rows: list[Row] = field(default_factory=list)
    events: list[Transition] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=dict)  # logged requests left out, by why
    cost: StepCost = field(default_factory=CostModel)
    placement: str = "prefix"
    moves: dict[str, int] = field(default_factory=dict)  # cached conversations, by fate
    usage: dict[str, tuple[float, float]] = field(default_factory=dict)  # Cluster.usage
    end: float = 0.0  # the last event's second


@dataclass(frozen=True, slots=True)
class _Ask:
    """One request to send: from a traffic class (``traffic`` its index) or a log (-1)."""

    name: str
    traffic: int
    client: int
    body: dict[str, Any]
    headers: Mapping[str, str]
    max_tokens: int
    path: str = "/v1/chat/completions"  # the API it came in on; ``body`` is in its words
    talk: Talk | None = None  # the conversation it is a turn of


@dataclass(frozen=True, slots=True)
class _Sent:
    """Who sent a request: the replica, and the prompt it counts as prefilled."""

    replica: Gateway
    prompt_tokens: int


@dataclass(slots=True)
class _Pending:
    row: Row
    traffic: int
    labels: Labels
    area: float
    replica: Gateway
    prompt_tokens: int
    reports: bool = True  # the answer carries per-request metrics
    prefill: int = 0  # what its replica counts its endpoint to prefill until its first token
    computed: int | None = None  # of its prompt, what the prefix map expects it to compute


class _Driver:
    def __init__(
        self,
        policy: CompiledPolicy,
        scenario: Scenario,
        cost: StepCost | None,
        placement: Strategy = "prefix",
    ) -> None:
        self.policy = policy
        self.scenario = scenario
        self.model = scenario.model or next(iter(policy.ladders))
        ladder = policy.ladders.get(self.model)
        if ladder is None:
            raise ValueError(f"the policy has no ladder for model {self.model}")
        self.ladder = ladder
        cost = cost if cost is not None else measured_for(self.model)
        cost = scaled_draft(cost, scenario.draft_scale)
        self.cluster = Cluster(_configs(policy, ladder, scenario, cost))
        self.replay = Replay(
            scenario, ladder, dict(self.cluster.pools), cost=cost, placement=placement
        )
        self.replicas = Replicas(
            scenario.gateways, policy, self.cluster.endpoints(), self.replay.events.append
        )
        self.placing = Placing(placement, self.cluster, scenario.seed, self.replicas.clock)
        self.replay.moves = self.placing.moves
        self.talks: dict[tuple[int, int], Talk] = {}
        self.talked: dict[tuple[int, int], int] = {}  # conversations each client began
        self.retired: set[tuple[int, int]] = set()  # clients whose sessions are all done
        self.store = VirtualStore(policy) if scenario.gateways > 1 else None
        self.flags = FlagStore(policy).values
        self.rng = random.Random(f"{scenario.seed}:arrivals")
        self.heap: list[tuple[float, int, str, int, int]] = []
        self.order = count()
        self.ids = count()
        self.active: list[set[int]] = [set() for _ in scenario.traffic]
        self.pending: dict[int, _Pending] = {}
        self.in_flight = 0
        self.area = 0.0
        self.area_t = 0.0
        self.n_endpoints = sum(self.cluster.pools.values())

    # --- time ----------------------------------------------------------------------------

    def run(self, log: Sequence[Logged] = ()) -> Replay:
        self.log = list(log)
        if self.log:
            first = min(entry.at for entry in self.log)
            for n, entry in enumerate(self.log):
                self._push(entry.at - first, "log", -1, n)
        for i, traffic in enumerate(self.scenario.traffic if not self.log else ()):
            self._push(0.0, "wake", i, 0)
            for at in traffic.changes():
                self._push(at, "wake", i, 0)
        while True:
            arrival = self.heap[0][0] if self.heap else None
            event = self.cluster.next_event()
            if event is not None and (arrival is None or event <= arrival):
                self._integrate(event)
                finished = self.cluster.advance()
                for served in self.cluster.started:
                    self._first_token(served, event)
                for served in finished:
                    self._finished(served)
            elif arrival is not None:
                at, _, kind, i, client = heapq.heappop(self.heap)
                if at <= self.scenario.duration_s:
                    self._integrate(at)
                    self._arrive(at, kind, i, client)
            else:
                self.replay.usage = self.cluster.usage(self.area_t)
                self.replay.end = self.area_t
                return self.replay

    def _push(self, at: float, kind: str, traffic: int, client: int) -> None:
        heapq.heappush(self.heap, (at, next(self.order), kind, traffic, client))

    def _integrate(self, now: float) -> None:
        self.area += self.in_flight * (now - self.area_t)
        self.area_t = now
        sync = self.store.sync if self.store is not None else None
        self.replicas.advance(now, self.cluster.in_engine, sync, self.cluster.counters)

    # --- arrivals ------------------------------------------------------------------------

    def _arrive(self, now: float, kind: str, i: int, client: int) -> None:
        if kind == "log":
            entry = self.log[client]
            body = entry.body
            limit = (
                body.get("max_tokens")
                or body.get("max_completion_tokens")
                or body.get("max_output_tokens")
            )
            max_tokens = limit if isinstance(limit, int) and limit > 0 else 256
            self._ask(now, _Ask("", -1, client, entry.body, entry.headers, max_tokens, entry.path))
            return
        traffic = self.scenario.traffic[i]
        level = traffic.level(now)
        if kind == "wake":
            if traffic.clients is not None:
                for c in range(int(level)):
                    if c not in self.active[i] and (i, c) not in self.retired:
                        self.active[i].add(c)
                        self._push(
                            now + self.rng.uniform(0, max(traffic.think_s, 0.5)), "req", i, c
                        )
            elif level > 0 and not self.active[i]:
                self.active[i].add(0)
                self._push(now + self.rng.expovariate(level), "req", i, 0)
            return
        if traffic.rate is not None:
            if level <= 0:
                self.active[i].clear()
                return
            self._push(now + self.rng.expovariate(level), "req", i, client + 1)
        self._send(now, i, traffic, client)

    def _send(self, now: float, i: int, traffic: Traffic, client: int) -> None:
        talk = self._talk(i, traffic, client) if traffic.session is not None else None
        if talk is not None:
            built = talk.body(self.scenario.name, client, self.model)
        else:
            built = build(self.scenario.name, traffic, client, self.model)
        ask = _Ask(
            traffic.name,
            i,
            client,
            built.body,
            built.headers,
            traffic.max_tokens,
            built.path,
            talk,
        )
        self._ask(now, ask)

    def _talk(self, i: int, traffic: Traffic, client: int) -> Talk:
        """The client's conversation under way, or its next one."""
        talk = self.talks.get((i, client))
        if talk is None or talk.done:
            number = self.talked.get((i, client), 0)
            self.talked[(i, client)] = number + 1
            name, seed = self.scenario.name, self.scenario.seed
            talk = self.talks[(i, client)] = Talk.draw(name, seed, traffic, client, number)
        return talk

    def _more(self, i: int, traffic: Traffic, client: int) -> bool:
        """Whether the client has another turn to send (its sessions not all done)."""
        session = traffic.session
        talk = self.talks.get((i, client))
        if session is None or session.sessions is None or talk is None or not talk.done:
            return True
        if self.talked.get((i, client), 0) < session.sessions:
            return True
        self.retired.add((i, client))
        return False

    def _ask(self, now: float, ask: _Ask) -> None:
        index = next(self.ids)
        try:
            model = named(ask.path).model
            parsed, _ = schema.parse(orjson.dumps(ask.body), model)
            upstream = chat_of(ask.path, ask.body)  # what the simulated servers run
        except ApiError as exc:  # a log line edited by hand: the gateway logs valid ones
            self._skip(f"not a valid request: {exc.message}")
            return
        except (ValueError, SimHTTPError) as exc:
            self._skip(f"not a valid request: {exc}")
            return
        ask = replace(ask, body=upstream)
        request_id = f"{self.scenario.name}-{index}"
        defaults = Defaults().under(self.policy.file.defaults)
        features = classify(parsed, ask.path, ask.headers, request_id, defaults)
        replica = self.replicas.of(ask.client)
        stats = replica.stats
        decision = decide(features, self.policy, self.flags, stats.guards, now, stats.splits)
        if decision.pool not in self.cluster.pools:  # a logged request for another model
            self._skip(f"model {parsed.model!r} is not on the ladder replayed ({self.model})")
            return
        views, talks, kept = replica.stats.views, replica.conversations, replica.load.kept
        costs = prices(views, talks.tokens_per_turn(decision.slice), decision.slice, now)
        affinity = self.placing.affinity(features, ask.body, costs)
        decision = self.placing.priced(decision, features, affinity, views, talks, now, kept)
        own = replica.own()
        endpoint = self.placing.choose(
            decision.pool, ask.body, features, affinity, own, replica.prefilling
        )
        self.placing.sent(features, endpoint)
        sent = _Sent(replica, features.prompt_tokens)
        prefill = affinity.uncached(endpoint) if affinity is not None else None
        self._submit(now, index, ask, decision, sent, shadow=False, endpoint=endpoint)
        self._queued(index, endpoint, prefill)
        target = decision.shadow_to
        if target is not None:
            mirrored = _short(ask, decision.shadow_tokens)
            cost = features.prompt_tokens + mirrored.max_tokens
            if replica.mirror(self.cluster.endpoints()[target], cost, now):
                # a conversation's mirrors go where its opening picks, as the gateway's do
                at = self.placing.mirror(target, affinity, replica.own())
                mirror, key = _mirror(decision), next(self.ids)
                self._submit(now, key, mirrored, mirror, sent, shadow=True, endpoint=at)
                if affinity is not None and at is not None:
                    self._queued(key, at, affinity.uncached(at))

    def _queued(self, index: int, endpoint: str, prefill: int | None) -> None:
        """The request's prompt counted as awaiting prefill on its endpoint, by its replica,
        as the gateway's pools count it (``Endpoint.prefilling``): what the prefix map
        expects it to compute (None: not known; 0 there)."""
        pending = self.pending[index]
        pending.prefill, pending.computed = prefill or 0, prefill
        queue = pending.replica.prefilling
        queue[endpoint] = queue.get(endpoint, 0) + pending.prefill

    def _skip(self, why: str) -> None:
        self.replay.skipped[why] = self.replay.skipped.get(why, 0) + 1

    def _submit(
        self,
        now: float,
        index: int,
        ask: _Ask,
        decision: Decision,
        sent: _Sent,
        *,
        shadow: bool,
        endpoint: str | None = None,
    ) -> None:
        pool = decision.pool
        endpoint = self.cluster.submit(index, pool, ask.body, now, ask.max_tokens, endpoint)
        sent.replica.sent(endpoint)
        spec = self.policy.pools[pool]
        row = Row(
            index,
            ask.name or decision.rule,
            ask.client,
            self.scenario.phase_of(now),
            decision.slice,
            decision.rule,
            pool,
            self.ladder.pools.index(pool),
            decision.probe,
            shadow,
            now,
            decision.reason,
        )
        if ask.talk is not None:
            row.talk, row.turn = ask.talk.key, ask.talk.turn
        labels = Labels(
            model=self.model,
            rule=decision.rule,
            slice=decision.slice,
            pool=pool,
            k=spec.num_speculative_tokens,
            endpoint=endpoint,
            shadow=shadow,
            probe=decision.probe,
            epoch=decision.epoch,
            chunk_signal=spec.chunk_acceptance,
            engine=spec.engine.value,
            parent=decision.parent,
            candidates=decision.candidates,
        )
        # only completions answers carry vLLM's per-request metrics (a Messages or Responses
        # answer is measured by its chunks)
        reports = ask.path in ("/v1/chat/completions", "/v1/completions")
        self.pending[index] = _Pending(
            row, ask.traffic, labels, self.area, sent.replica, sent.prompt_tokens, reports
        )
        self.in_flight += 1

    # --- completions ---------------------------------------------------------------------

    def _first_token(self, served: Served, now: float) -> None:
        """A stream's first event: its replica counts its prompt as prefilled."""
        pending = self.pending[served.key]
        replica, key = pending.replica, str(served.key)
        replica.prefilled(served.endpoint, pending.prompt_tokens, now, key, pending.computed)
        self._unqueued(pending, served.endpoint)

    def _unqueued(self, pending: _Pending, endpoint: str) -> None:
        queue = pending.replica.prefilling
        queue[endpoint] = queue.get(endpoint, 0) - pending.prefill
        pending.prefill = 0

    def _finished(self, served: Served) -> None:
        pending = self.pending.pop(served.key)
        pending.replica.done(served.endpoint)
        self._unqueued(pending, served.endpoint)
        pending.replica.mirrors -= pending.row.shadow
        self.in_flight -= 1
        row = pending.row
        span = served.done - served.arrival
        mean = (self.area - pending.area) / span if span > 0 else float(self.in_flight + 1)
        row.done = served.done
        row.tokens = served.completion_tokens
        row.context = served.prompt_tokens + served.completion_tokens / 2
        row.acceptance = served.acceptance
        row.load = max(1.0, mean / self.n_endpoints)
        row.endpoint, row.first = served.endpoint, served.first
        row.prompt_tokens, row.cached = served.prompt_tokens, served.cached_tokens
        cached = self.scenario.shows_cached(pending.traffic)
        outcome = _outcome(pending.labels, served, pending.reports, cached)
        row.measured = outcome.tokens_per_step
        pending.replica.record(outcome, served.done, str(served.key))
        self.replay.rows.append(row)
        if pending.traffic < 0:  # a logged request: arrivals do not depend on answers
            return
        traffic = self.scenario.traffic[pending.traffic]
        if traffic.clients is not None and not row.shadow:
            talk = self.talks.get((pending.traffic, row.client))
            if talk is not None:
                talk.answered()
            if not self._more(pending.traffic, traffic, row.client):
                self.active[pending.traffic].discard(row.client)
            elif row.client < traffic.level(served.done):
                self._push(served.done + traffic.think_s, "req", pending.traffic, row.client)
            else:
                self.active[pending.traffic].discard(row.client)


def _short(ask: _Ask, tokens: int | None) -> _Ask:
    """The request a short probe sends (``Decision.shadow_tokens``), as the gateway's."""
    if tokens is None:
        return ask
    api = APIS.at(ask.path)
    body = short_probe(ask.body, "max_tokens" if api is None else api.limit, tokens)
    return replace(ask, body=body, max_tokens=min(ask.max_tokens, tokens))


def _mirror(decision: Decision) -> Decision:
    assert decision.shadow_to is not None
    return Decision(
        decision.rule,
        decision.slice,
        decision.shadow_to,
        (decision.shadow_to,),
        decision.rung,
        decision.start,
        decision.reason,
        probe=decision.probe,
        epoch=decision.epoch,
    )


def _outcome(labels: Labels, served: Served, reports: bool = True, cached: bool = False) -> Outcome:
    """The outcome the gateway's fold makes of this answer, streamed at one chunk per step;
    with ``reports`` it says its speculative counts, with ``cached`` what was cached."""
    fold = Fold(labels, served.arrival)
    for at in _chunk_times(served):
        fold.content(at)
    fold.finished(served.finish_reason)
    metrics = None
    if labels.k is not None and reports:
        metrics = {
            "speculative_decoding": {
                "num_spec_steps": served.num_spec_steps,
                "num_draft_tokens": served.num_draft_tokens,
                "num_accepted_draft_tokens": served.num_accepted_draft_tokens,
                "draft_acceptance_rate": (
                    served.num_accepted_draft_tokens / served.num_draft_tokens
                    if served.num_draft_tokens
                    else 0.0
                ),
            }
        }
    details = {"cached_tokens": served.cached_tokens} if cached else None
    tokens = {"completion_tokens": served.completion_tokens, "prompt_tokens": served.prompt_tokens}
    fold.usage({**tokens, "prompt_tokens_details": details})
    said = ENGINES.of(labels.engine).evidence({"metrics": metrics})  # as its engine reads it
    if said is not None:
        fold.evidence(said)
    return fold.finish(Status.OK, served.done)


def _chunk_times(served: Served) -> Iterator[float]:
    """One chunk per step: the first at ``first``, the last at ``last``, the others evenly
    between (each read as it arrived, as the gateway's reader would)."""
    n = served.chunks
    for i in range(n):
        yield served.first + (served.last - served.first) * (i / (n - 1) if n > 1 else 0.0)


def _configs(
    policy: CompiledPolicy, ladder: Ladder, scenario: Scenario, cost: StepCost
) -> dict[str, list[SimConfig]]:
    drift = scenario.drift_points()
    out: dict[str, list[SimConfig]] = {}
    for n, pool in enumerate(ladder.pools):
        spec = policy.pools[pool]
        speculative = spec.kind is PoolKind.SPECULATIVE
        out[pool] = [
            SimConfig(
                Mode.SPECULATIVE if speculative else Mode.STANDARD,
                k=spec.num_speculative_tokens or 4,
                served_model_names=(ladder.model,),
                seed=scenario.seed * 1000 + n * 10 + e,
                max_num_seqs=scenario.max_num_seqs,
                max_num_batched_tokens=scenario.max_num_batched_tokens,
                cost=cost,
                drift=drift,
                enable_prefix_caching=scenario.prefix_caching,
                kv_cache_tokens=scenario.kv_cache_tokens,
            )
            for e in range(len(spec.endpoints))
        ]
    return out


@dataclass(frozen=True, slots=True)
class Logged:
    """One line of a gateway's request log (``SPECLANE_REQUEST_LOG``)."""

    at: float
    path: str
    body: dict[str, Any]
    headers: dict[str, str]


def read_log(text: str) -> list[Logged]:
    """The lines of a request log; ``ValueError`` names the first bad one."""
    out = []
    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            d = orjson.loads(line)
            out.append(Logged(float(d["at"]), str(d["path"]), dict(d["body"]), dict(d["headers"])))
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"request log line {n}: {exc}") from None
    return out


def replay(
    policy: CompiledPolicy,
    scenario: Scenario,
    log: Sequence[Logged] = (),
    cost: StepCost | None = None,
    placement: Strategy = "prefix",
) -> Replay:
    """Run ``scenario`` against ``policy``; deterministic for the same inputs. With ``log``,
    its requests arrive at their recorded offsets instead of the scenario's traffic (the
    scenario still gives the duration, phases and acceptance drift); a logged request for a
    model this ladder does not serve (the gateway answered it 404, or another ladder served
    it) is left out and counted in ``Replay.skipped``. ``cost``: the pools' step-time model
    (default: the curve measured for the model's size, ``backends.sim.model.measured_for``:
    ``GPU_32B`` for ``qwen3-32b``). ``placement``: how a pool's endpoint is chosen
    (``gateway/replay/placing.py``; the default is the live gateway's)."""
    return _Driver(policy, scenario, cost, placement).run(log)
