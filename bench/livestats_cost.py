"""What feedback (step 7) costs per outcome: ``LiveStats.record`` and its share of ``tick``,
for the economic guardrail, on the code importable from ``PYTHONPATH`` (so that two
checkouts can be compared side by side, interleaved).

    .venv/bin/python bench/livestats_cost.py                       # this checkout
    .venv/bin/python bench/livestats_cost.py --against /path/to/old/checkout
    .venv/bin/python bench/livestats_cost.py --reaction --against /path/to/old/checkout

Traffic: ``--slices`` slices of one model on a ``[spec-k7, spec-k3, standard]`` ladder
(and the same on ``[spec, standard]``), outcomes arriving at ``--rate`` per second of
injected time in total, a tick every second, healthy acceptance (nobody falls: the cost
of the steady state, which is where the gateway spends its life). Reports CPU
microseconds per outcome (``time.process_time``), median over ``--rounds`` rounds.

``--reaction``: what that costs in reaction, in replay (``speclane replay``, virtual time):
for each scenario with a ``collapsed`` phase, seconds from the collapse to each slice's
first fall (and the slice's requests served meanwhile on the collapsed rung), and from
the healing to its return to its start rung.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time

LADDERS = {
    "three-rung": """
version: 1
pools:
  k7: {kind: speculative, model: m, num_speculative_tokens: 7, endpoints: ["http://a"]}
  k3: {kind: speculative, model: m, num_speculative_tokens: 3, endpoints: ["http://b"]}
  standard: {kind: standard, model: m, endpoints: ["http://c"]}
ladder: [k7, k3, standard]
rules: [{name: default, start: k7}]
""",
    "two-rung": """
version: 1
pools:
  k7: {kind: speculative, model: m, num_speculative_tokens: 4, endpoints: ["http://a"]}
  standard: {kind: standard, model: m, endpoints: ["http://c"]}
ladder: [k7, standard]
rules: [{name: default, start: k7}]
""",
}


def measure(ladder: str, slices: int, rate: float, outcomes: int, seed: int) -> float:
    from gateway.measure.acceptance import Labels, Outcome, Signal, Status
    from gateway.measure.livestats import LiveStats
    from policies.compiled import load_policy

    policy = load_policy(LADDERS[ladder])
    stats = LiveStats(lambda: policy, load=lambda model, now: 4.0)
    rng = random.Random(seed)
    pools = list(policy.ladders["m"].pools)
    made = []
    for i in range(outcomes):
        key = f"default / s{i % slices}"
        pool = pools[0] if i % 20 else pools[-1]
        k = policy.pools[pool].num_speculative_tokens
        steps = rng.randint(20, 40)
        labels = Labels("m", "default", key, pool, k)
        tokens = steps * (4 if k else 1) + 1
        drafted = k * steps if k else 0
        made.append(
            Outcome(
                labels,
                Status.OK,
                0.0,
                1.0,
                0.05,
                0.01,
                200,
                tokens,
                steps + 1,
                Signal.PER_REQUEST if k else Signal.NONE,
                drafted=drafted,
                accepted=tokens - 1 - steps if k else 0,
                steps=steps,
                decode_s=steps * rng.uniform(0.02, 0.03),
                load=rng.uniform(1, 8),
            )
        )
    now, tick = 0.0, 1.0
    started = time.process_time()
    for outcome in made:
        now += rng.expovariate(rate)
        if now >= tick:
            stats.tick(now)
            tick += 1.0
        stats.record(outcome, now)
    return (time.process_time() - started) / outcomes * 1e6


REACTION = {
    "tool-collapse": "bench/policies/baseline.yaml",
    "quiet-collapse": "bench/policies/baseline.yaml",
    "three-rung-collapse": "bench/policies/three-rung.yaml",
    "trainium-collapse": "bench/policies/trainium.yaml",
}


def reaction(scenario: str, policy_file: str) -> dict[str, list[float | None]]:
    from pathlib import Path

    from gateway.replay.run import replay
    from gateway.replay.scenario import load_scenario
    from policies.compiled import load_policy

    here = Path(__file__).resolve().parent.parent
    policy = load_policy((here / policy_file).read_text())
    loaded = load_scenario((here / "bench" / "scenarios" / f"{scenario}.yaml").read_text())
    result = replay(policy, loaded)
    collapsed = loaded.phases["collapsed"]
    healed = loaded.phases.get("healed")
    out: dict[str, list[float | None]] = {}
    for event in result.events:
        moved = out.setdefault(event.slice, [None, None, None])
        if moved[0] is None and event.at >= collapsed and event.after.offset > event.before.offset:
            moved[0] = round(event.at - collapsed, 1)
            moved[1] = sum(
                1
                for r in result.rows
                if r.slice == event.slice and collapsed <= r.arrival < event.at and r.rung == 0
            )
        if healed is not None and event.at >= healed and event.after.offset == 0:
            moved[2] = round(event.at - healed, 1)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--slices", type=int, default=20)
    parser.add_argument("--rate", type=float, default=200.0, help="outcomes per second")
    parser.add_argument("--outcomes", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--against", help="another checkout, run interleaved with this one")
    parser.add_argument("--reaction", action="store_true")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--react", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.react:
        print(json.dumps(reaction(args.react, REACTION[args.react])))
        return 0
    if args.one:
        print(json.dumps(measure(args.one, args.slices, args.rate, args.outcomes, 7)))
        return 0
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    trees = {"this checkout": here} | ({"against": args.against} if args.against else {})
    if args.reaction:
        for scenario in REACTION:
            for name, tree in trees.items():
                out = subprocess.run(
                    [
                        sys.executable,
                        os.path.join(here, "bench", "livestats_cost.py"),
                        "--react",
                        scenario,
                    ],
                    env=os.environ | {"PYTHONPATH": tree},
                    cwd=tree,
                    capture_output=True,
                    text=True,
                    check=True,
                )
                for key, (fall, served, back) in json.loads(out.stdout).items():
                    print(
                        f"{scenario:20} {name:14} {key:34} fall {fall} s after the collapse "
                        f"({served} requests on the start rung meanwhile), back {back} s "
                        "after the healing"
                    )
        return 0
    for ladder in LADDERS:
        results: dict[str, list[float]] = {name: [] for name in trees}
        for _ in range(args.rounds):
            for name, tree in trees.items():
                out = subprocess.run(
                    [
                        sys.executable,
                        os.path.join(here, "bench", "livestats_cost.py"),
                        "--one",
                        ladder,
                        "--slices",
                        str(args.slices),
                        "--rate",
                        str(args.rate),
                        "--outcomes",
                        str(args.outcomes),
                    ],
                    env=os.environ | {"PYTHONPATH": tree},
                    cwd=tree,
                    capture_output=True,
                    text=True,
                    check=True,
                )
                results[name].append(json.loads(out.stdout))
        line = ", ".join(f"{n} {statistics.median(v):.1f} us" for n, v in results.items())
        if args.against:
            ratio = statistics.median(results["against"]) / statistics.median(
                results["this checkout"]
            )
            line += f" (against / this: {ratio:.2f}x)"
        print(f"{ladder}: {args.slices} slices, {args.rate:g} outcomes/s: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
