"""First tokens against always-standard on every scenario: the latency rule's yardstick, as
``decision_quality.py`` is the cost rules'. Each scenario is replayed twice on each cost
model, by the adaptive gateway (the policy as written) and by always-standard (its rules
started on the standard pool, which a slice never climbs above), and each traffic class's
median time to first token is compared per window: how many windows of a class had the
adaptive run above 1.5x always-standard's (the issue's bound) and by at least the latency
rule's 0.5 s (``MIN_EXCESS_S``: a smaller gap is two loads, not a queue), the longest run
of them in one class, and the worst ratio. A window counts where both runs served the
class at least ``MIN_REQUESTS`` times in it. Beside it, the adaptive cost against the
oracle, so a change to the rule shows what it buys in first tokens and what it costs.

    .venv/bin/python bench/first_tokens.py --policy bench/policies/baseline.yaml \\
        [--scenario ...] [--cost-model affine gpu gpu-32b] [--window-s 30] [--jobs N]

Prints one markdown row per scenario and cost model, and the totals per cost model.
"""

from __future__ import annotations

import argparse
import os
import statistics
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from crossover import LIMIT, over, policies, served

from backends.sim.cli import cost_for, cost_model_arg
from gateway.replay.report import summarise
from gateway.replay.run import Row, replay
from gateway.replay.scenario import load_scenario
from policies.guardrail import MIN_EXCESS_S

BENCH = Path(__file__).parent
MIN_REQUESTS = 3  # a class's requests in a window, in each run, for the window to count
HEAD = (
    "| scenario | cost model | adaptive / oracle | class windows above 1.5x always-standard "
    "| longest run | worst |\n| --- | --- | --- | --- | --- | --- |"
)


@dataclass(frozen=True, slots=True)
class Found:
    scenario: str
    model: str
    vs_oracle: float
    above: int
    windows: int
    longest: int
    worst: float
    worst_at: str


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--policy", type=Path, required=True)
    p.add_argument("--scenario", type=Path, nargs="*")
    p.add_argument("--cost-model", nargs="+", default=["affine", "gpu", "gpu-32b"])
    p.add_argument("--window-s", type=float, default=30.0)
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    return p.parse_args(argv)


def by_class(rows: Sequence[Row], window: float) -> dict[str, dict[int, float]]:
    """Each traffic class's median time to first token per window, over the windows where
    it had at least ``MIN_REQUESTS`` requests."""
    kept: dict[str, dict[int, list[float]]] = {}
    for r in rows:
        kept.setdefault(r.traffic, {}).setdefault(int(r.arrival // window), []).append(
            r.first - r.arrival
        )
    return {
        traffic: {w: statistics.median(v) for w, v in windows.items() if len(v) >= MIN_REQUESTS}
        for traffic, windows in kept.items()
    }


def compare(
    adaptive: dict[str, dict[int, float]],
    standard: dict[str, dict[int, float]],
    window: float,
    floor: float = MIN_EXCESS_S,
) -> tuple[int, int, int, float, str]:
    """Windows above ``LIMIT`` x always-standard's and by at least ``floor`` seconds (the
    rule's own floor: a smaller gap is two loads, not a queue), over every class; the
    windows compared; the longest run in one class; and the worst ratio with where it was."""
    above = compared = longest = 0
    worst, where = 0.0, ""
    for traffic, mine in sorted(adaptive.items()):
        theirs = standard.get(traffic, {})
        both = {w: t for w, t in mine.items() if w in theirs}
        count, run = over(both, theirs, floor)
        above, compared, longest = above + count, compared + len(both), max(longest, run)
        for w, t in both.items():
            if theirs[w] > 0 and t / theirs[w] > worst:
                worst, where = t / theirs[w], f"{traffic} at {w * window:g} s"
    return above, compared, longest, worst, where


def measure(path: Path, policy_path: Path, model: str, window: float) -> Found:
    """One scenario on one cost model, under its own policy where it names one (as
    ``decision_quality.py`` replays it), else ``policy_path``."""
    scenario = load_scenario(path.read_bytes(), str(path))
    own = path.parent / scenario.policy if scenario.policy else policy_path
    compiled = policies(own.read_text())
    cost = cost_for(cost_model_arg(model), scenario.model or "")
    runs = {name: replay(policy, scenario, cost=cost) for name, policy in compiled.items()}
    vs_oracle = summarise(runs["adaptive"], compiled["adaptive"])["verdict"]["adaptive_vs_oracle"]
    classes = {name: by_class(served(done), window) for name, done in runs.items()}
    above, compared, longest, worst, where = compare(
        classes["adaptive"], classes["always-standard"], window
    )
    return Found(scenario.name, model, vs_oracle, above, compared, longest, worst, where)


def row(found: Found) -> str:
    share = found.above / found.windows if found.windows else 0.0
    return (
        f"| {found.scenario} | {found.model} | {found.vs_oracle:.3f} | "
        f"{found.above} of {found.windows} ({share:.1%}) | {found.longest} | "
        f"{found.worst:.2f}x ({found.worst_at}) |"
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    paths = args.scenario or sorted((BENCH / "scenarios").glob("*.yaml"))
    jobs = [(p, args.policy, m, args.window_s) for p in paths for m in args.cost_model]
    print(HEAD, flush=True)
    with ProcessPoolExecutor(max_workers=max(args.jobs, 1)) as pool:
        found = list(pool.map(measure, *zip(*jobs, strict=True)))
    for f in found:
        print(row(f), flush=True)
    for model in args.cost_model:
        mine = [f for f in found if f.model == model]
        above, windows = sum(f.above for f in mine), sum(f.windows for f in mine)
        within = sum(f.vs_oracle <= 1.03 for f in mine)
        print(
            f"{model}: {above} of {windows} class windows above {LIMIT}x always-standard "
            f"in {sum(f.above > 0 for f in mine)} of {len(mine)} scenarios; "
            f"within 3% of the oracle in {within}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
