"""Scenarios nobody wrote: random traffic for ``bench/decision_quality.py``, to check a change
to the decision on mixes the committed scenarios do not hold.

    .venv/bin/python bench/random_scenarios.py --count 12 --seed 1 --out /tmp/random
    .venv/bin/python bench/decision_quality.py --policy bench/policies/baseline.yaml \
        --scenario /tmp/random/*.yaml

Each scenario runs 10, 15 or 20 minutes in three phases, with two to five classes of
traffic drawn from the six workloads (prompt and answer sizes, temperatures, clients and
think times drawn around each workload's usual), half of them changing their clients at a
phase boundary, and about half changing acceptance: a step at a boundary, a ramp over the
run, or a flap over the middle phase. The same ``--seed`` writes the same files.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path
from typing import Any

import yaml

# workload: (temperature, max_tokens, prompt_tokens), each the middle of its draw
WORKLOADS = {
    "json": (0.0, 128, 300),
    "tools": (0.0, 96, 400),
    "code": (0.0, 256, 1500),
    "chat": (0.7, 256, 600),
    "creative": (1.0, 300, 300),
    "summarise": (0.2, 200, 7000),
}
LOW_TEMPERATURES = (0.0, 0.0, 0.2, 0.3)


def scenario(rng: random.Random, name: str) -> dict[str, Any]:
    """One random scenario, as a scenario file's mapping."""
    duration = rng.choice([600, 900, 1200])
    cuts = sorted(rng.sample(range(120, duration - 120, 30), 2))
    traffic, acceptance = [], []
    for j in range(rng.randint(2, 5)):
        workload = rng.choice(list(WORKLOADS))
        traffic.append(_traffic(rng, f"{workload}{j}", workload, cuts))
        change = _acceptance(rng, workload, duration, cuts)
        if change is not None:
            acceptance.append(change)
    doc: dict[str, Any] = {
        "version": 1,
        "name": name,
        "description": "random traffic (bench/random_scenarios.py)",
        "duration_s": duration,
        "seed": rng.randint(1, 999),
        "phases": {"a": 0, "b": cuts[0], "c": cuts[1]},
        "traffic": traffic,
    }
    if acceptance:
        doc["acceptance"] = acceptance
    return doc


def _traffic(rng: random.Random, name: str, workload: str, cuts: list[int]) -> dict[str, Any]:
    temperature, max_tokens, prompt = WORKLOADS[workload]
    if workload in ("json", "tools", "code", "summarise"):
        temperature = rng.choice(LOW_TEMPERATURES)
    out: dict[str, Any] = {
        "name": name,
        "workload": workload,
        "temperature": temperature,
        "max_tokens": int(max_tokens * rng.uniform(0.5, 2.0)),
        "prompt_tokens": int(prompt * rng.uniform(0.5, 2.5)),
        "clients": rng.randint(1, 6),
        "think_s": round(rng.uniform(0.1, 3.0), 1),
        "users": 50,
        "api_keys": rng.randint(1, 4),
    }
    if workload == "tools":
        out["tools"] = [{"name": "lookup", "parameters": {"q": "string"}}]
    if rng.random() < 0.5:
        out["schedule"] = [{"at_s": rng.choice(cuts), "clients": rng.randint(1, 16)}]
    return out


def _acceptance(
    rng: random.Random, workload: str, duration: int, cuts: list[int]
) -> dict[str, Any] | None:
    draw = rng.random()
    if draw < 0.25:
        at = rng.choice(cuts)
        return {
            "step": {"at_s": at, "workload": workload, "base": round(rng.uniform(0.03, 0.9), 2)}
        }
    if draw < 0.4:
        start, end = rng.sample([0.1, 0.3, 0.5, 0.7, 0.85], 2)
        ramp = {"from_s": 0, "to_s": duration, "start": start, "end": end, "every_s": 20}
        return {"ramp": {"workload": workload, **ramp}}
    if draw < 0.5:
        period = rng.choice([30, 60, 120])
        flap = {"from_s": cuts[0], "to_s": cuts[1], "period_s": period, "low": 0.05, "high": 0.8}
        return {"flap": {"workload": workload, **flap}}
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=12)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    for i in range(args.count):
        name = f"random{args.seed}-{i}"
        text = yaml.safe_dump(scenario(rng, name), sort_keys=False)
        (args.out / f"{name}.yaml").write_text(text)
    print(f"{args.count} scenarios in {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
