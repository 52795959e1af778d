"""False fallbacks and recovery times of the default (economic) guardrail, in virtual time.

    .venv/bin/python bench/guardrail_economics.py [--hours 4]

1. False fallbacks: one healthy slice (chat) replayed alone for ``--hours`` of virtual time
   at 0.25 and 0.5 requests per second, at base acceptances that put it 5-30% cheaper on
   speculation than on standard; every fall to standard is a false fallback. Each run says
   the slice's true cost ratio (from the load-neutral prices) and the falls per hour.
2. Recovery: the time and the slice's requests from the healing of a collapse to the slice
   being back on speculation, in the collapse scenarios of ``bench/scenarios/`` (the
   tool-call slice with many clients and with one API key, and the quiet slices).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gateway.replay.pricing import cells, prices
from gateway.replay.run import Replay, replay
from gateway.replay.scenario import load_scenario
from policies.compiled import load_policy

HERE = Path(__file__).parent
POLICY = load_policy((HERE / "policies" / "baseline.yaml").read_text())
HEALTHY = """
version: 1
name: healthy-{rate}-{base}
duration_s: {duration}
seed: 5
traffic:
  - {{name: chat, workload: chat, temperature: 0.5, max_tokens: 192, rate: {rate}, api_keys: 1}}
acceptance:
  - step: {{at_s: 0, workload: chat, base: {base}}}
"""
RECOVERY = {
    "tool-collapse": ("tools", 600.0),
    "tool-collapse-one-key": ("tools", 600.0),
    "quiet-collapse": ("rare-code", 900.0),
}


def false_fallbacks(hours: float) -> list[str]:
    lines = [
        "| slice rate | base acceptance | spec / standard cost | requests | falls "
        "| falls per hour |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for rate in (0.25, 0.5):
        for base in (0.45, 0.5, 0.65):
            text = HEALTHY.format(rate=rate, base=base, duration=hours * 3600)
            result = replay(POLICY, load_scenario(text))
            ratio = _ratio(result)
            falls = sum(1 for e in result.events if e.after.offset > e.before.offset)
            requests = sum(1 for r in result.rows if not r.shadow)
            lines.append(
                f"| {rate} req/s | {base} | {ratio:.3f} | {requests} | {falls} "
                f"| {falls / hours:.2f} |"
            )
            print(lines[-1], file=sys.stderr, flush=True)
    return lines


def _ratio(result: Replay) -> float:
    price = prices(result, {p: None for p in result.ladder.pools})
    (cell,) = cells(result, price, 0)
    return cell.pools["spec"] / cell.pools["standard"]


def recovery() -> list[str]:
    lines = [
        "| scenario | slice | healed at | back on speculation after | slice requests meanwhile |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, (traffic, healed) in RECOVERY.items():
        scenario = load_scenario((HERE / "scenarios" / f"{name}.yaml").read_text())
        result = replay(POLICY, scenario)
        slices = {r.slice for r in result.rows if r.traffic == traffic}
        back = [
            e.at
            for e in result.events
            if e.slice in slices and e.at > healed and e.after.offset < e.before.offset
        ]
        at = min(back) if back else None
        end = at if at is not None else scenario.duration_s
        meanwhile = sum(
            1 for r in result.rows if r.traffic == traffic and healed <= r.arrival < end
        )
        after = "never" if at is None else f"{at - healed:.0f} s"
        lines.append(f"| {name} | {traffic} | {healed:.0f} s | {after} | {meanwhile} |")
        print(lines[-1], file=sys.stderr, flush=True)
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hours", type=float, default=4.0)
    args = parser.parse_args()
    print("\n".join(false_fallbacks(args.hours)))
    print()
    print("\n".join(recovery()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
