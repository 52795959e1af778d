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
while it ran, as this client saw them): the same table as ``bench/decision_quality.py``.
Shadow mirrors, which a client never sees, are read back from the gateways' outcome logs
(each names the request it mirrored) and priced as replay prices them.

``--time-scale`` runs the simulated servers faster than real time (their steps, the drift
schedule, think times and arrivals all shrink by it) and the gateways with them
(``SPECLANE_TIME_SCALE``: their clocks, windows, cooldowns, ticks and scrapes in the
simulators' time), so guardrail events are dated in scenario seconds, as replay dates them.
What a scale below 1 cannot shrink is the machine: the gateway's own work per chunk and
request takes real time, and a busy machine reads as a busier engine. Use 1 (the default)
for numbers to quote.
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

import httpx
import orjson
import yaml
from procs import Supervisor, free_port

from backends.sim.model import build_profile
from gateway.replay.bodies import build
from gateway.replay.report import TABLE_HEAD, markdown_row, summarise
from gateway.replay.run import Replay, Row
from gateway.replay.scenario import Scenario, Traffic, load_scenario
from policies.compiled import CompiledPolicy, load_policy
from policies.guardrail import Phase, SliceState, Transition
from policies.model import PoolKind

TOKEN = "live-scenarios"
LEAD_S = 20.0  # model seconds between the simulators' start and the scenario's second 0 ...
LEAD_REAL_S = 15.0  # ... and at least this many real ones: the gateways must be up by then
PATH = "/v1/chat/completions"


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


def start_stack(
    sup: Supervisor,
    policy: CompiledPolicy,
    scenario: Scenario,
    args: argparse.Namespace,
    work: Path,
) -> tuple[list[str], int]:
    model = scenario.model or next(iter(policy.ladders))
    ladder = policy.ladders[model]
    lead_s = max(LEAD_S, LEAD_REAL_S / args.time_scale)  # model seconds before second 0
    drift = ",".join(
        f"{p.workload.value}{'/' + p.tool if p.tool else ''}@{p.at_s + lead_s:g}={p.acceptance:g}"
        for p in scenario.drift_points()
    )
    urls: dict[str, list[str]] = {}
    children = []
    for name in ladder.pools:
        pool = policy.pools[name]
        for i, _ in enumerate(pool.endpoints):
            port = free_port()
            argv = [sys.executable, "-m", "gateway", "sim", "--port", str(port), "--model", model]
            argv += ["--seed", str(scenario.seed + 97 * len(children))]
            argv += ["--max-num-seqs", str(scenario.max_num_seqs)]
            argv += ["--max-num-batched-tokens", str(scenario.max_num_batched_tokens)]
            argv += ["--time-scale", str(args.time_scale), "--method", args.method]
            argv += ["--engine", pool.engine.value]  # the engine's shapes and pages
            if pool.kind is PoolKind.SPECULATIVE:
                argv += ["--mode", "speculative", "--k", str(pool.num_speculative_tokens)]
                argv += ["--drift", drift] if drift else []
            else:
                argv += ["--mode", "standard"]
            url = f"http://127.0.0.1:{port}"
            children.append((sup.start(f"sim-{name}-{i}", argv), url))
            urls.setdefault(name, []).append(url)
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


async def send(run: Run, client: httpx.AsyncClient, i: int, traffic: Traffic, who: int) -> None:
    scenario = run.scenario
    model = scenario.model or next(iter(run.policy.ladders))
    built = build(scenario.name, traffic, who, model)
    request_id = f"{scenario.name}-{traffic.name}-{who}-{len(run.rows)}-{run.rng.random():.9f}"
    headers = {**built.headers, "x-request-id": request_id}
    arrival = run.now()
    area = run.load.move(arrival, +1)
    pool = ""
    try:
        response, tokens, prompt = await _exchange(
            client, run.gateway(who) + PATH, built.body, headers
        )
    finally:
        done = run.now()
        area_after = run.load.move(done, -1)
    if response.status_code != 200:
        key = f"{response.status_code}"
        run.errors[key] = run.errors.get(key, 0) + 1
        return
    answered = response.headers
    pool = answered.get("x-speclane-pool", "")
    ladder = run.policy.ladders[model]
    profile = build_profile(
        built.body,
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
    run.rows.append(
        Row(
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
            tokens=tokens,
            acceptance=profile.acceptance,
            load=max(1.0, mean / run.endpoints),
            context=prompt + tokens / 2,
        )
    )


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
                )
            )
    return out


async def _exchange(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], headers: dict[str, str]
) -> tuple[httpx.Response, int, int]:
    """Send one request; the completion and prompt tokens from its usage (streamed or
    whole)."""
    if not body.get("stream"):
        response = await client.post(url, json=body, headers=headers)
        usage = response.json().get("usage") or {} if response.status_code == 200 else {}
        return response, int(usage.get("completion_tokens") or 0), _prompt(usage)
    tokens = prompt = 0
    async with client.stream("POST", url, json=body, headers=headers) as response:
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = orjson.loads(line[6:])
            if isinstance(event, dict) and event.get("usage"):
                tokens = int(event["usage"].get("completion_tokens") or 0)
                prompt = _prompt(event["usage"])
    return response, tokens, prompt


def _prompt(usage: dict[str, Any]) -> int:
    return int(usage.get("prompt_tokens") or 0)


async def closed_client(run: Run, client: httpx.AsyncClient, i: int, who: int) -> None:
    traffic = run.scenario.traffic[i]
    await _sleep_until(run, run.rng.uniform(0, max(traffic.think_s, 0.5)))
    while run.now() < run.scenario.duration_s:
        if who >= traffic.level(run.now()):
            later = [at for at in traffic.changes() if at > run.now()]
            if not later:
                return
            await _sleep_until(run, later[0])
            continue
        await send(run, client, i, traffic, who)
        await asyncio.sleep(traffic.think_s * run.scale)


async def open_class(run: Run, client: httpx.AsyncClient, i: int) -> None:
    traffic = run.scenario.traffic[i]
    tasks: set[asyncio.Task[None]] = set()
    who = 0
    while run.now() < run.scenario.duration_s:
        rate = traffic.level(run.now())
        if rate <= 0:
            later = [at for at in traffic.changes() if at > run.now()]
            if not later:
                break
            await _sleep_until(run, later[0])
            continue
        await asyncio.sleep(run.rng.expovariate(rate) * run.scale)
        task = asyncio.create_task(send(run, client, i, traffic, who))
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


def run_one(path: Path, policy_path: Path, args: argparse.Namespace) -> dict[str, Any]:
    scenario = load_scenario(path.read_text())
    scenario = scenario.model_copy(update={"seed": scenario.seed + 1000 * args.seed})
    policy = load_policy(policy_path.read_text(), str(policy_path))
    with tempfile.TemporaryDirectory() as tmp, Supervisor(Path(tmp)) as sup:
        gateways, endpoints = start_stack(sup, policy, scenario, args, Path(tmp))
        run = Run(scenario, policy, gateways, args.time_scale, endpoints)
        run.rng.seed(f"{scenario.seed}:live")
        wall = time.monotonic()
        events = asyncio.run(drive(run))
        wall = time.monotonic() - wall
        sup.close()  # the gateways write what is left of their outcome logs as they stop
        run.rows += mirrors(run, sorted(Path(tmp).glob("outcomes-*.jsonl")))
    model = scenario.model or next(iter(policy.ladders))
    ladder = policy.ladders[model]
    counts = {p: len(policy.pools[p].endpoints) for p in ladder.pools}
    replay = Replay(scenario, ladder, counts, sorted(run.rows, key=lambda r: r.arrival), events)
    summary = summarise(replay, policy)
    summary["errors"] = run.errors
    summary["wall_s"] = round(wall, 1)
    summary["seed"] = scenario.seed
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policy", type=Path, required=True)
    parser.add_argument("--scenario", type=Path, action="append", required=True)
    parser.add_argument("--time-scale", type=float, default=1.0)
    parser.add_argument("--method", default="draft_model", help="the simulators' proposer")
    parser.add_argument("--seed", type=int, default=0, help="offset of the scenario's seed")
    parser.add_argument("--out", type=Path, help="write each JSON summary here")
    args = parser.parse_args()
    print(TABLE_HEAD)
    for path in args.scenario:
        summary = run_one(path, args.policy, args)
        print(markdown_row(summary), flush=True)
        errors = summary["errors"]
        if errors:
            print(f"  client errors: {errors}", file=sys.stderr)
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            target = args.out / f"{summary['scenario']}-live-seed{args.seed}.json"
            target.write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
