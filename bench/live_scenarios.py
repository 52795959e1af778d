"""Scenarios in real time: the real ``speclane serve`` in front of ``speclane sim`` pools,
driven by a client population, priced like ``speclane replay``.

    .venv/bin/python bench/live_scenarios.py --policy policies/examples/starter.yaml \\
        --scenario bench/scenarios/tool-collapse.yaml [--time-scale 0.5] [--write LABEL]

``speclane replay`` runs the gateway's decision code in virtual time; this runs the whole
gateway as a process, with everything the replay leaves out: real sockets and timing, the
scrape loop, the guardrail tick, background tasks, a busy machine. The scenario file is the
same (``bench/scenarios/README.md``). One simulated server is started per endpoint the
policy lists for each pool of the ladder (its k, the scenario's ``max_num_seqs`` and
``max_num_batched_tokens``, the scenario's acceptance schedule as ``--drift``), the policy's
endpoints are pointed at them, and the scenario's clients send their requests through the
gateway with their API keys and users; with ``gateways: N`` in the scenario, N gateways
share their state through Redis (127.0.0.1:6379, a namespace of their own) and client ``i``
talks to gateway ``i mod N``. Every answered request becomes a row priced with the
simulator's cost model at the load actually carried (mean requests in flight per endpoint
while it ran, as this client saw them) and the acceptance of the chat request the
simulator ran for it (a Messages or Responses body becomes one first, ``chat_of``, as in
replay): the same table as ``bench/decision_quality.py``.
Shadow mirrors, which a client never sees, are read back from the gateways' outcome logs
(each names the request it mirrored) and priced as replay prices them.

A class with a ``session`` (the agent scenarios, ``bench/scenarios/agents-*.yaml``) sends
conversations, as replay does: each client draws the same conversations replay draws for it
(``gateway/replay/bodies.py``'s ``Talk``, from the same seed), sends each turn with the whole
history in its API's words to that API's route, the next turn only once the turn before was
answered, and stops after its ``sessions``; the simulators report the prompt tokens their
prefix cache held (``--enable-prompt-tokens-details``). Such a scenario also prints
``bench/agent_cache.py``'s row for the run (the conversations' prefix-cache hit rate from
the third turn, their TTFT, GPU-seconds with prefill), beside the same row from the replay
of the same seed, so live and replay compare on one line each.

``--time-scale`` runs the simulated servers faster than real time (their steps, the drift
schedule, think times and arrivals all shrink by it) and the gateways with them
(``SPECLANE_TIME_SCALE``: their clocks, windows, cooldowns, ticks and scrapes in the
simulators' time), so guardrail events are dated in scenario seconds, as replay dates them.
What a scale below 1 cannot shrink is the machine: the gateway's own work per chunk and
request takes real time, and a busy machine reads as a busier engine. Use 1 (the default)
for numbers to quote. ``--cost-model`` (default ``measured``: the H200 curve for the
model's size) is the simulators' step-time model and the pricing's.

Why one module past 600 lines: one live run is one harness (the stack it starts, the clients
that drive it, the rows they record and their pricing), and ``parity.py`` and the tests run
it whole; split, each part would pass the run's state to the next.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import random
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import agent_cache
import httpx
import orjson
import yaml
from procs import Supervisor, free_port

from backends.sim.agents import chat_of
from backends.sim.cli import COST_MODEL_HELP, cost_for, cost_model_arg
from backends.sim.model import build_profile
from gateway.demo.summary import mirror_counts
from gateway.replay.bodies import Built, Talk, build
from gateway.replay.report import TABLE_HEAD, markdown_row, summarise
from gateway.replay.run import Replay, Row, replay
from gateway.replay.scenario import Scenario, Traffic, load_scenario
from policies.compiled import CompiledPolicy, load_policy
from policies.guardrail import Phase, SliceState, Transition
from policies.model import PoolKind

Ids = dict[tuple[str, int, int], str]  # (class, client, its n-th request) -> request id

TOKEN = "live-scenarios"
LEAD_S = 20.0  # model seconds between the simulators' start and the scenario's second 0 ...
LEAD_REAL_S = 15.0  # ... and at least this many real ones: the gateways must be up by then
_OPENINGS = ("message_start", "ping", "response.created", "response.in_progress")


@dataclass(slots=True)
class Load:
    """Requests in flight from this client, integrated over time."""

    in_flight: int = 0
    area: float = 0.0
    stamp: float = 0.0

    def move(self, now: float, by: int) -> float:
        self.area += self.in_flight * (now - self.stamp)
        self.stamp = now
        self.in_flight += by
        return self.area


@dataclass(slots=True)
class Run:
    scenario: Scenario
    policy: CompiledPolicy
    gateways: list[str]
    scale: float
    endpoints: int
    started: float = 0.0
    model_started: float = 0.0  # the gateways' clock at second 0 (it dates guardrail events)
    load: Load = field(default_factory=Load)
    rows: list[Row] = field(default_factory=list)
    sent: dict[str, int] = field(default_factory=dict)  # request id -> its row
    errors: dict[str, int] = field(default_factory=dict)
    rng: random.Random = field(default_factory=random.Random)
    talks: dict[tuple[int, int], Talk] = field(default_factory=dict)  # (class, client)
    talked: dict[tuple[int, int], int] = field(default_factory=dict)  # conversations begun
    ids: Ids = field(default_factory=dict)  # a replay's (``parity.replayed_ids``)
    asked: dict[tuple[str, int], int] = field(default_factory=dict)  # requests sent, by client
    mirrored: dict[str, int] = field(default_factory=dict)  # the gateways' mirrors, by result

    def __post_init__(self) -> None:
        self.rng.seed(f"{self.scenario.seed}:live")

    def now(self) -> float:
        """Scenario seconds since second 0."""
        return (time.monotonic() - self.started) / self.scale

    def gateway(self, who: int) -> str:
        """The gateway client ``who`` talks to (as replay's replicas take clients)."""
        return self.gateways[who % len(self.gateways)]


def model_wall(scale: float) -> float:
    """A gateway's wall clock now, at ``SPECLANE_TIME_SCALE=scale``
    (``gateway/server/app.py``, ``scaled``)."""
    real = time.time()
    epoch = real // 86_400 * 86_400
    return epoch + (real - epoch) / scale if scale != 1.0 else real


def stack_policy(policy: CompiledPolicy, urls: dict[str, list[str]]) -> str:
    data = policy.file.model_dump(mode="json", exclude_none=True)
    for name, pool_urls in urls.items():
        data["pools"][name]["endpoints"] = pool_urls
    return yaml.safe_dump(data, sort_keys=False)


@dataclass(frozen=True, slots=True)
class SimSpec:
    """One simulated server of the stack: the pool it serves and its ``speclane sim``
    arguments (after ``sim``, without ``--port``)."""

    pool: str
    argv: tuple[str, ...]


def sim_specs(
    policy: CompiledPolicy, scenario: Scenario, args: argparse.Namespace, lead_s: float
) -> list[SimSpec]:
    """One simulator per endpoint the policy lists for each pool of the scenario's ladder:
    its k, the scenario's batch limits, its acceptance schedule (``--drift``, second 0 at
    ``lead_s`` of the simulator's time), the time scale, proposer and cost model."""
    model = scenario.model or next(iter(policy.ladders))
    ladder = policy.ladders[model]
    drift = ",".join(
        f"{p.workload.value}{'/' + p.tool if p.tool else ''}@{p.at_s + lead_s:g}={p.acceptance:g}"
        for p in scenario.drift_points()
    )
    out = []
    for name in ladder.pools:
        pool = policy.pools[name]
        for _ in pool.endpoints:
            argv = ["--model", model, "--seed", str(scenario.seed + 97 * len(out))]
            argv += ["--max-num-seqs", str(scenario.max_num_seqs)]
            argv += ["--max-num-batched-tokens", str(scenario.max_num_batched_tokens)]
            argv += ["--time-scale", str(args.time_scale), "--method", args.method]
            argv += ["--engine", pool.engine.value]  # the engine's shapes and pages
            argv += [] if scenario.prefix_caching else ["--no-enable-prefix-caching"]
            if any(t.session is not None for t in scenario.traffic):
                argv += ["--enable-prompt-tokens-details"]  # what each turn found cached
                argv += ["--max-model-len", str(model_len(scenario))]
            if scenario.kv_cache_tokens is not None:
                argv += ["--kv-cache-tokens", str(scenario.kv_cache_tokens)]
            argv += ["--cost-model", args.cost_model]
            if pool.kind is PoolKind.SPECULATIVE:
                argv += ["--mode", "speculative", "--k", str(pool.num_speculative_tokens)]
                argv += ["--drift", drift] if drift else []
            else:
                argv += ["--mode", "standard"]
            out.append(SimSpec(name, tuple(argv)))
    return out


def start_stack(
    sup: Supervisor,
    policy: CompiledPolicy,
    scenario: Scenario,
    args: argparse.Namespace,
    work: Path,
) -> tuple[list[str], int]:
    # second 0 is fixed before the simulators start (a drift schedule is in their own time),
    # far enough ahead for the stack to be up, and settled, on a busy machine
    lead_s = max(LEAD_S, LEAD_REAL_S / args.time_scale)
    urls: dict[str, list[str]] = {}
    children = []
    for spec in sim_specs(policy, scenario, args, lead_s):
        port = free_port()
        argv = [sys.executable, "-m", "gateway", "sim", "--port", str(port), *spec.argv]
        url = f"http://127.0.0.1:{port}"
        children.append((sup.start(f"sim-{spec.pool}-{len(children)}", argv), url))
        urls.setdefault(spec.pool, []).append(url)
    sims_started = time.monotonic()
    for child, url in children:
        sup.wait_ready(child, url + "/health")
    policy_path = work / "policy.yaml"
    policy_path.write_text(stack_policy(policy, urls))
    gateways = start_gateways(sup, policy_path, scenario.gateways, args.time_scale)
    remaining = sims_started + lead_s * args.time_scale - time.monotonic()
    if remaining < 0:
        raise RuntimeError("the stack took longer to start than the lead time; raise LEAD_REAL_S")
    time.sleep(remaining)
    return gateways, sum(len(v) for v in urls.values())


def model_len(scenario: Scenario) -> int:
    """A ``--max-model-len`` that holds the scenario's longest conversation and its answer,
    twice over (replay's engines refuse no prompt; the simulators count tokens by
    characters, as replay does), and never below the simulator's default."""
    longest = max(
        (t.session.last_tokens + t.max_tokens for t in scenario.traffic if t.session is not None),
        default=0,
    )
    return max(32_768, 2 * longest)


def start_gateways(sup: Supervisor, policy_path: Path, count: int, scale: float) -> list[str]:
    """``count`` gateways on the policy, judging in the simulators' time, each writing its
    outcome log beside the policy; several share their state through the Redis on
    127.0.0.1:6379, under a namespace of their own."""
    env = {
        **os.environ,
        "SPECLANE_ADMIN_TOKEN": TOKEN,
        "SPECLANE_LOG_LEVEL": "warning",
        "SPECLANE_TIME_SCALE": str(scale),
    }
    if count > 1:
        env["SPECLANE_REDIS_URL"] = "redis://127.0.0.1:6379/0"
        env["SPECLANE_NAMESPACE"] = f"speclane-live-{os.getpid()}-{time.time_ns()}"
    argv = [sys.executable, "-m", "gateway", "serve", "--policy", str(policy_path)]
    urls = []
    for i in range(count):
        port = free_port()
        log = {"SPECLANE_OUTCOME_LOG": str(policy_path.parent / f"outcomes-{i}.jsonl")}
        child = sup.start(f"gateway-{i}", [*argv, "--port", str(port)], env=env | log)
        urls.append(f"http://127.0.0.1:{port}")
        sup.wait_ready(child, urls[-1] + "/healthz")
    return urls


async def send(
    run: Run, client: httpx.AsyncClient, i: int, traffic: Traffic, who: int, talk: Talk | None
) -> None:
    scenario = run.scenario
    model = scenario.model or next(iter(run.policy.ladders))
    built = (
        talk.body(scenario.name, who, model) if talk else build(scenario.name, traffic, who, model)
    )
    number = run.asked.get((traffic.name, who), 0)
    run.asked[(traffic.name, who)] = number + 1
    request_id = run.ids.get((traffic.name, who, number)) or (
        f"{scenario.name}-{traffic.name}-{who}-{len(run.rows)}-{run.rng.random():.9f}"
    )
    headers = {**built.headers, "x-request-id": request_id}
    arrival = run.now()
    area = run.load.move(arrival, +1)
    pool = ""
    try:
        url = run.gateway(who) + built.path
        response, heard = await _exchange(client, run, url, built, headers)
    except httpx.TransportError as exc:  # a broken connection: counted, as a refusal is
        key = type(exc).__name__
        run.errors[key] = run.errors.get(key, 0) + 1
        return
    finally:
        done = run.now()
        area_after = run.load.move(done, -1)
    if response.status_code != 200:
        key = f"{response.status_code}"
        run.errors[key] = run.errors.get(key, 0) + 1
        if talk is not None and 400 <= response.status_code < 500 and key != "429":
            talk.turn = talk.turns + 1  # refused as it is: the conversation ends there
        return
    answered = response.headers
    pool = answered.get("x-speclane-pool", "")
    ladder = run.policy.ladders[model]
    profile = build_profile(  # of the chat request the simulator ran, as replay prices it
        chat_of(built.path, built.body),
        seed=0,
        index=0,
        max_tokens=traffic.max_tokens,
        now_s=arrival,
        drift=scenario.drift_points(),
    )
    span = done - arrival
    mean = (area_after - area) / span if span > 0 else 1.0
    reason = answered.get("x-speclane-reason", "")
    run.sent[request_id] = len(run.rows)
    row = Row(
        index=len(run.rows),
        traffic=traffic.name,
        client=who,
        phase=scenario.phase_of(arrival),
        slice=answered.get("x-speclane-slice", ""),
        rule=answered.get("x-speclane-rule", ""),
        pool=pool,
        rung=ladder.pools.index(pool) if pool in ladder.pools else len(ladder.pools) - 1,
        probe="probe" in reason,
        shadow=False,
        arrival=arrival,
        reason=reason,
        done=done,
        tokens=heard.tokens,
        acceptance=profile.acceptance,
        load=max(1.0, mean / run.endpoints),
        context=heard.prompt + heard.tokens / 2,
        first=heard.first if heard.first is not None else done,
        prompt_tokens=heard.prompt,
        cached=heard.cached,
    )
    if talk is not None:
        row.talk, row.turn = talk.key, talk.turn
        talk.answered()
    run.rows.append(row)


def mirrors(run: Run, logs: list[Path]) -> list[Row]:
    """The shadow mirrors the gateways sent, from their outcome logs: each priced as the
    request it mirrored (its acceptance and load), on the pool it went to."""
    ladder = run.policy.ladders[run.scenario.model or next(iter(run.policy.ladders))]
    out = []
    for path in logs:
        lines = path.read_text().splitlines() if path.exists() else []
        for line in lines:
            record = json.loads(line)
            primary = run.sent.get(record.get("request_id") or "")
            if not record.get("shadow") or primary is None or record["status"] != "ok":
                continue
            row = run.rows[primary]
            pool = record["pool"]
            tokens = int(record["completion_tokens"] or 0)
            out.append(
                dataclasses.replace(
                    row,
                    index=len(run.rows) + len(out),
                    pool=pool,
                    rung=ladder.pools.index(pool) if pool in ladder.pools else row.rung,
                    shadow=True,
                    tokens=tokens,
                    context=int(record["prompt_tokens"] or 0) + tokens / 2,
                    prompt_tokens=int(record["prompt_tokens"] or 0),
                    cached=int(record.get("cached_tokens") or 0),
                )
            )
    return out


@dataclass(slots=True)
class Answered:
    """What a client read of an answer: its completion, prompt and cached prompt tokens (from
    its usage, in any API's words), and when its first generated content came (scenario
    seconds; None for an answer read whole)."""

    tokens: int = 0
    prompt: int = 0
    cached: int = 0
    first: float | None = None

    def read(self, usage: object) -> None:
        if not isinstance(usage, dict):
            return
        self.prompt = int(usage.get("prompt_tokens") or usage.get("input_tokens") or self.prompt)
        self.tokens = int(
            usage.get("completion_tokens") or usage.get("output_tokens") or self.tokens
        )
        details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details") or {}
        cached = usage.get("cache_read_input_tokens") or details.get("cached_tokens")
        self.cached = int(cached or self.cached)


async def _exchange(
    client: httpx.AsyncClient, run: Run, url: str, built: Built, headers: dict[str, str]
) -> tuple[httpx.Response, Answered]:
    """Send one request to ``url`` (its API's route); what its usage says (streamed or
    whole)."""
    answered = Answered()
    if not built.body.get("stream"):
        response = await client.post(url, json=built.body, headers=headers)
        if response.status_code == 200:
            answered.read(response.json().get("usage"))
        return response, answered
    async with client.stream("POST", url, json=built.body, headers=headers) as response:
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = orjson.loads(line[6:])
            if not isinstance(event, dict):
                continue
            if answered.first is None and _generated(event):
                answered.first = run.now()
            answered.read(event.get("usage"))
            for inner in ("message", "response"):  # Messages' start, Responses' completion
                if isinstance(event.get(inner), dict):
                    answered.read(event[inner].get("usage"))
    return response, answered


def _generated(event: dict[str, Any]) -> bool:
    """Whether a stream's event carries what the model generated (not an opening event)."""
    kind = event.get("type")
    if kind is None:  # a chat or completions chunk
        return bool(event.get("choices"))
    return isinstance(kind, str) and kind not in _OPENINGS and not kind.startswith("error")


def _turn(run: Run, i: int, traffic: Traffic, who: int) -> Talk | None:
    """The client's conversation under way, or its next one; None once it has had its
    ``sessions`` (as replay's clients go)."""
    session = traffic.session
    assert session is not None
    talk = run.talks.get((i, who))
    if talk is not None and not talk.done:
        return talk
    number = run.talked.get((i, who), 0)
    if session.sessions is not None and number >= session.sessions:
        return None
    run.talked[(i, who)] = number + 1
    talk = Talk.draw(run.scenario.name, run.scenario.seed, traffic, who, number)
    run.talks[(i, who)] = talk
    return talk


async def closed_client(run: Run, client: httpx.AsyncClient, i: int, who: int) -> None:
    traffic = run.scenario.traffic[i]
    await _sleep_until(run, run.rng.uniform(0, max(traffic.think_s, 0.5)))
    while run.now() < run.scenario.duration_s:
        if who >= traffic.level(run.now()):
            later = [at for at in traffic.changes() if run.now() < at < run.scenario.duration_s]
            if not later:
                return
            await _sleep_until(run, later[0])
            continue
        talk = _turn(run, i, traffic, who) if traffic.session is not None else None
        if traffic.session is not None and talk is None:
            return  # its sessions are over
        await send(run, client, i, traffic, who, talk)
        await asyncio.sleep(traffic.think_s * run.scale)


async def open_class(run: Run, client: httpx.AsyncClient, i: int) -> None:
    traffic = run.scenario.traffic[i]
    tasks: set[asyncio.Task[None]] = set()
    who = 0
    while run.now() < run.scenario.duration_s:
        rate = traffic.level(run.now())
        if rate <= 0:
            later = [at for at in traffic.changes() if run.now() < at < run.scenario.duration_s]
            if not later:
                break
            await _sleep_until(run, later[0])
            continue
        await asyncio.sleep(run.rng.expovariate(rate) * run.scale)
        task = asyncio.create_task(send(run, client, i, traffic, who, None))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        who += 1
    await asyncio.gather(*tasks)


async def _sleep_until(run: Run, at: float) -> None:
    await asyncio.sleep(max(0.0, (at - run.now()) * run.scale))


async def drive(run: Run) -> list[Transition]:
    limits = httpx.Limits(max_connections=1024, max_keepalive_connections=1024)
    timeout = httpx.Timeout(600.0, connect=10.0)
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
        run.started, run.model_started = time.monotonic(), model_wall(run.scale)
        jobs = []
        for i, traffic in enumerate(run.scenario.traffic):
            if traffic.clients is not None:
                most = max([traffic.clients, *(c.clients or 0 for c in traffic.schedule)])
                jobs += [closed_client(run, client, i, who) for who in range(most)]
            else:
                jobs.append(open_class(run, client, i))
        await asyncio.gather(*jobs)
        answer = await client.get(
            run.gateways[0] + "/admin/guardrail?limit=1000",
            headers={"authorization": f"Bearer {TOKEN}"},
        )
        for url in run.gateways:
            metrics = await client.get(url + "/metrics")
            for result, n in mirror_counts(metrics.text).items():
                run.mirrored[result] = run.mirrored.get(result, 0) + n
    events = answer.json().get("events", []) if answer.status_code == 200 else []
    return [_transition(e, run.model_started) for e in events]


def _transition(event: dict[str, Any], started: float) -> Transition:
    """A guardrail event at scenario seconds, as the replay's are."""

    def state(d: dict[str, Any]) -> SliceState:
        return SliceState(int(d["offset"]), Phase(d["phase"]), float(d["since"]), int(d["version"]))

    return Transition(
        event["slice"],
        float(event["at"]) - started,
        state(event["from"]),
        state(event["to"]),
        event["reason"],
    )


def run_one(
    path: Path, policy_path: Path, args: argparse.Namespace, ids: Ids | None = None
) -> dict[str, Any]:
    """One scenario live; ``ids``: the request ids to send (``parity.replayed_ids``)."""
    scenario = load_scenario(path.read_text())
    scenario = scenario.model_copy(update={"seed": scenario.seed + 1000 * args.seed})
    policy = load_policy(policy_path.read_text(), str(policy_path))
    with tempfile.TemporaryDirectory() as tmp, Supervisor(Path(tmp)) as sup:
        gateways, endpoints = start_stack(sup, policy, scenario, args, Path(tmp))
        run = Run(scenario, policy, gateways, args.time_scale, endpoints, ids=ids or {})
        wall = time.monotonic()
        events = asyncio.run(drive(run))
        wall = time.monotonic() - wall
        sup.close()  # the gateways write what is left of their outcome logs as they stop
        summary = priced(run, events, sorted(Path(tmp).glob("outcomes-*.jsonl")), args)
    summary["wall_s"] = round(wall, 1)
    return summary


def said(rows: list[Row], every_s: float = 10.0) -> dict[str, dict[int, str]]:
    """What the gateway told each slice's clients (``x-speclane-reason``): the first reason
    in every ``every_s`` seconds, by slice and the bucket's start; mirrors left out."""
    out: dict[str, dict[int, str]] = {}
    for row in sorted(rows, key=lambda r: r.arrival):
        if not row.shadow:
            out.setdefault(row.slice, {}).setdefault(
                int(row.arrival // every_s * every_s), row.reason
            )
    return out


def priced(
    run: Run, events: list[Transition], logs: list[Path], args: argparse.Namespace
) -> dict[str, Any]:
    """The run's summary, as ``speclane replay`` summarises one: its rows and the shadow
    mirrors in the gateways' outcome logs (``logs``) priced with the cost model, beside the
    guardrail's events (scenario seconds)."""
    scenario, policy = run.scenario, run.policy
    run.rows += mirrors(run, logs)
    model = scenario.model or next(iter(policy.ladders))
    ladder = policy.ladders[model]
    counts = {p: len(policy.pools[p].endpoints) for p in ladder.pools}
    rows = sorted(run.rows, key=lambda r: r.arrival)
    cost = cost_for(cost_model_arg(args.cost_model), model)
    live = Replay(scenario, ladder, counts, rows, events, cost=cost, placement="live")
    summary = summarise(live, policy)
    summary["errors"] = run.errors
    summary["mirror_results"] = run.mirrored
    summary["said"] = said(run.rows)
    summary["seed"] = scenario.seed
    if run.talks:  # conversations: live and replay of the same seed, as agent_cache reports
        replayed = replay(policy, scenario, cost=cost)
        measured = [agent_cache.measure(live), agent_cache.measure(replayed)]
        summary["agents"] = [dataclasses.asdict(m) for m in measured]
        summary["agents_table"] = agent_cache.table(scenario.name, scenario.seed, measured)
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policy", type=Path, required=True)
    parser.add_argument("--scenario", type=Path, action="append", required=True)
    parser.add_argument("--time-scale", type=float, default=1.0)
    parser.add_argument("--method", default="draft_model", help="the simulators' proposer")
    parser.add_argument("--seed", type=int, default=0, help="offset of the scenario's seed")
    parser.add_argument("--out", type=Path, help="write each JSON summary here")
    add_cost_model(parser)
    args = parser.parse_args()
    print(TABLE_HEAD)
    for path in args.scenario:
        summary = run_one(path, args.policy, args)
        print(markdown_row(summary), flush=True)
        if "agents_table" in summary:
            print("\n" + agent_cache.HEAD + "\n" + "\n".join(summary["agents_table"]) + "\n")
        errors = summary["errors"]
        if errors:
            print(f"  client errors: {errors}", file=sys.stderr)
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            target = args.out / f"{summary['scenario']}-live-seed{args.seed}.json"
            target.write_text(json.dumps(summary, indent=1))
    return 0


def add_cost_model(parser: argparse.ArgumentParser) -> None:
    """``--cost-model``: the simulators' step-time model, and the pricing's."""

    def checked(text: str) -> str:
        cost_model_arg(text)  # a bad value is a usage error here, not in a child
        return text

    parser.add_argument("--cost-model", type=checked, default="measured", help=COST_MODEL_HELP)


if __name__ == "__main__":
    sys.exit(main())
