"""The EAGLE-3 crossover in latency as well as cost: ``bench/scenarios/eagle3-crossover.yaml``
(k=3 and a light draft, load rising from 1 to 8 requests a second) replayed two ways on
each cost model: the adaptive gateway (the scenario's own policy) and always-standard (its
rules started on the standard pool, which a slice never climbs above).

    .venv/bin/python bench/crossover.py [--cost-model affine gpu gpu-32b] [--window-s 30]

Prints, per phase, the time per output token (p50 over the phase's requests: decode seconds
over the tokens after the first) of both runs and the adaptive run's cut against it, the
adaptive cost against always-standard's (load-neutral prices,
``gateway/replay/pricing.py``), and per window of ``--window-s`` the adaptive run's median
time to first token against always-standard's: how many windows it was above 1.5x, and the
longest run of them.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Sequence
from pathlib import Path

from backends.sim.cli import cost_for, cost_model_arg
from gateway.replay.report import summarise
from gateway.replay.run import Replay, Row, replay
from gateway.replay.scenario import Scenario, load_scenario
from policies.compiled import CompiledPolicy, load_policy

BENCH = Path(__file__).parent
SCENARIO = BENCH / "scenarios" / "eagle3-crossover.yaml"
LIMIT = 1.5  # a window's TTFT p50 above this many times always-standard's counts


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scenario", type=Path, default=SCENARIO)
    p.add_argument("--cost-model", nargs="+", default=["affine", "gpu", "gpu-32b"])
    p.add_argument("--window-s", type=float, default=30.0)
    return p.parse_args(argv)


def policies(text: str) -> dict[str, CompiledPolicy]:
    """The scenario's policy, and the same traffic served on the standard pool alone."""
    standard = text.replace("start: spec", "start: standard")
    return {"adaptive": load_policy(text), "always-standard": load_policy(standard)}


def served(done: Replay) -> list[Row]:
    return [r for r in done.rows if not r.shadow and r.done > r.first > 0]


def tpot(rows: Sequence[Row]) -> float | None:
    times = [(r.done - r.first) / (r.tokens - 1) for r in rows if r.tokens > 1]
    return statistics.median(times) if times else None


def ttft_by_window(rows: Sequence[Row], window: float) -> dict[int, float]:
    by: dict[int, list[float]] = {}
    for r in rows:
        by.setdefault(int(r.arrival // window), []).append(r.first - r.arrival)
    return {w: statistics.median(v) for w, v in by.items()}


def over(
    adaptive: dict[int, float], standard: dict[int, float], floor: float = 0.0
) -> tuple[int, int]:
    """Windows where the adaptive TTFT p50 was above ``LIMIT`` x always-standard's (and by
    at least ``floor`` seconds), and the longest run of consecutive ones."""
    count = run = longest = 0
    for w in sorted(adaptive):
        ref = standard.get(w)
        if ref is not None and adaptive[w] > LIMIT * ref and adaptive[w] - ref >= floor:
            count, run = count + 1, run + 1
            longest = max(longest, run)
        else:
            run = 0
    return count, longest


def report(scenario: Scenario, text: str, model: str, window: float) -> list[str]:
    cost = cost_for(cost_model_arg(model), scenario.model or "")
    compiled = policies(text)
    runs = {name: replay(policy, scenario, cost=cost) for name, policy in compiled.items()}
    rows = {name: served(done) for name, done in runs.items()}
    cells = summarise(runs["adaptive"], compiled["adaptive"])["cells"]
    vs_standard = {c["phase"]: c["adaptive_vs_always_standard"] for c in cells}
    bounds = sorted(scenario.phases.items(), key=lambda kv: kv[1]) + [("", scenario.duration_s)]
    lines = [f"== {scenario.name} on {model}"]
    lines.append("phase       TPOT p50 ms: adaptive  standard   cut    cost vs standard")
    for (phase, start), (_, end) in zip(bounds, bounds[1:], strict=False):
        got = {
            name: tpot([r for r in mine if start <= r.arrival < end]) for name, mine in rows.items()
        }
        a, s = got["adaptive"], got["always-standard"]
        cut = f"{1 - a / s:6.1%}" if a and s else "   -  "
        cost = vs_standard.get(phase)
        lines.append(
            f"{phase:10}  {_ms(a):>21}  {_ms(s):>8}  {cut}  "
            + (f"{cost:.3f}" if cost is not None else "-")
        )
    windows = {name: ttft_by_window(mine, window) for name, mine in rows.items()}
    count, longest = over(windows["adaptive"], windows["always-standard"])
    worst = max(
        (a / windows["always-standard"][w], w)
        for w, a in windows["adaptive"].items()
        if windows["always-standard"].get(w)
    )
    lines.append(
        f"TTFT p50 above {LIMIT}x always-standard's: {count} of {len(windows['adaptive'])} "
        f"windows of {window:g} s, longest run {longest}; worst {worst[0]:.2f}x at "
        f"{worst[1] * window:g} s"
    )
    return lines


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f}"


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    scenario = load_scenario(args.scenario.read_text(), str(args.scenario))
    policy = args.scenario.parent / (scenario.policy or "")
    text = policy.read_text()
    for model in args.cost_model:
        for line in report(scenario, text, model, args.window_s):
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
