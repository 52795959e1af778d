"""How soon quiet slices come back after a healing, and what their probes cost meanwhile:
``bench/scenarios/quiet-recovery.yaml`` replayed over several draws of its traffic, with
the guardrail's short probes off (``recovery_budget: 0``) and at a budget.

    .venv/bin/python bench/quiet_recovery.py [--policy bench/policies/baseline.yaml] \\
        [--scenario bench/scenarios/quiet-recovery.yaml] [--seeds 0 1 2 3 4] [--budget 0.02]

Prints, per traffic class that moved, the seconds from the scenario's ``healed`` phase to
the slice's move back up (``-``: not by the end), and the class's adaptive cost during the
``collapsed`` phase against the run without short probes.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from gateway.replay.report import summarise
from gateway.replay.run import replay
from gateway.replay.scenario import load_scenario
from policies.compiled import load_policy

BENCH = Path(__file__).parent


def run(policy_text: str, path: Path, seed: int, budget: float) -> tuple[dict[str, float], dict]:
    text = policy_text.replace("rules:", f"guardrail: {{recovery_budget: {budget}}}\nrules:", 1)
    policy = load_policy(text)
    scenario = load_scenario(path.read_text(), str(path))
    scenario = scenario.model_copy(update={"seed": scenario.seed + 1000 * seed})
    done = replay(policy, scenario)
    healed = scenario.phases["healed"]
    by_slice = {row.slice: row.traffic for row in done.rows}
    back: dict[str, float] = {}
    for e in done.events:
        if e.after.offset < e.before.offset and e.at >= healed:
            back.setdefault(by_slice.get(e.slice, e.slice), e.at - healed)
    cost = {
        c["traffic"]: c["cost"]["adaptive"]
        for c in summarise(done, policy)["cells"]
        if c["phase"] == "collapsed"
    }
    return back, cost


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policy", type=Path, default=BENCH / "policies" / "baseline.yaml")
    parser.add_argument("--scenario", type=Path, default=BENCH / "scenarios/quiet-recovery.yaml")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--budget", type=float, default=0.02)
    args = parser.parse_args()
    text = args.policy.read_text()
    classes = [t.name for t in load_scenario(args.scenario.read_text()).traffic]
    runs = {b: [run(text, args.scenario, s, b) for s in args.seeds] for b in (0.0, args.budget)}
    print("| class | short probes | back after (s) | collapse cost vs off |")
    print("| --- | --- | --- | --- |")
    for name in classes:
        if not any(name in back for back, _ in runs[0.0] + runs[args.budget]):
            continue
        for budget, label in ((0.0, "off"), (args.budget, f"on ({args.budget:g})")):
            back = ", ".join(f"{b[name]:.0f}" if name in b else "-" for b, _ in runs[budget])
            vs = ""
            if budget:
                pairs = zip(runs[budget], runs[0.0], strict=True)
                vs = ", ".join(
                    f"{(on[name] / off[name] - 1) * 100:+.1f}%" for (_, on), (_, off) in pairs
                )
            print(f"| {name} | {label} | {back} | {vs} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
