"""Replay against live: one scenario and one policy in virtual time (``speclane replay``)
and through real gateways in front of time-scaled simulators (``bench/live_scenarios.py``),
and whether they decide alike.

    .venv/bin/python bench/parity.py --policy bench/policies/mixed.yaml \\
        --scenario bench/scenarios/surge-mix.yaml [--scenario ...] [--time-scale 0.25] \\
        [--max-delay-s 30] [--max-cost-gap 0.03] [--cost-model gpu-32b] [--out DIR]

Per scenario it prints adaptive / oracle for both runs, each slice's moves between rungs side
by side with their times (scenario seconds; a probing phase is not a move), and a verdict:

- the same moves for every slice, in the same order, each live within ``--max-delay-s`` of
  replay's (a move that one run makes within ``--max-delay-s`` of the scenario's end and the
  other does not is not a difference: the other still had that long to make it);
- adaptive / oracle within ``--max-cost-gap`` of each other.

Live, each request carries the id the replay gave the same client's same request
(``replayed_ids``): what the gateway draws from a request's id (exploration,
probes, mirrors) is then drawn alike, and the two runs differ in serving and measuring only.

Exit status 1 when a scenario's verdict fails. A replay that does something live serving
does not (or the reverse) is a bug in one of them: ``gateway/replay/replicas.py`` says what
the replay reproduces of a running gateway.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from live_scenarios import Ids, add_cost_model, run_one, said

from backends.sim.cli import cost_for, cost_model_arg
from gateway.replay.report import summarise
from gateway.replay.run import Replay, replay
from gateway.replay.scenario import load_scenario
from policies.compiled import load_policy


@dataclass(frozen=True, slots=True)
class Move:
    """A slice's move between rungs: when, and from which rung offset to which."""

    slice: str
    at: float
    before: int
    after: int

    def __str__(self) -> str:
        return f"{self.at:.1f} s: {self.before} -> {self.after}"


def moves(events: list[dict[str, Any]]) -> dict[str, list[Move]]:
    """Each slice's rung changes in time order (phase-only transitions left out)."""
    out: dict[str, list[Move]] = {}
    for e in sorted(events, key=lambda e: float(e["at"])):
        before, after = (int(e[end].rsplit("/", 1)[1]) for end in ("from", "to"))
        if before != after:
            out.setdefault(e["slice"], []).append(Move(e["slice"], float(e["at"]), before, after))
    return out


@dataclass(frozen=True, slots=True)
class Verdict:
    ok: bool
    problems: tuple[str, ...]
    rows: tuple[tuple[str, str, str, str], ...]  # slice, replay, live, delay


def compare(
    replayed: dict[str, Any],
    live: dict[str, Any],
    max_delay_s: float,
    max_cost_gap: float,
    ends_at: float = float("inf"),
) -> Verdict:
    problems: list[str] = []
    rows: list[tuple[str, str, str, str]] = []
    ours, theirs = moves(replayed["events"]), moves(live["events"])
    for key in sorted(set(ours) | set(theirs)):
        a, b = ours.get(key, []), theirs.get(key, [])
        for i in range(max(len(a), len(b))):
            left = a[i] if i < len(a) else None
            right = b[i] if i < len(b) else None
            delay = ""
            if left is None or right is None:
                made = left or right
                if made is not None and made.at > ends_at - max_delay_s:
                    rows.append((key, str(left or "-"), str(right or "-"), "near the end"))
                    continue
                problems.append(
                    f"{key}: move {i + 1} only in {'live' if left is None else 'replay'}"
                )
            elif (left.before, left.after) != (right.before, right.after):
                problems.append(f"{key}: move {i + 1} differs ({left} / {right})")
            else:
                delay = f"{right.at - left.at:+.1f} s"
                if abs(right.at - left.at) > max_delay_s:
                    problems.append(f"{key}: move {i + 1} {delay} apart")
            rows.append((key, str(left or "-"), str(right or "-"), delay))
    gap = abs(_v(replayed, "adaptive_vs_oracle") - _v(live, "adaptive_vs_oracle"))
    if gap > max_cost_gap:
        problems.append(f"adaptive / oracle {gap:.3f} apart")
    return Verdict(not problems, tuple(problems), tuple(rows))


def replayed_ids(replayed: Replay) -> Ids:
    """The request id a replay gave each client's n-th request, by (class, client, n).
    Sent with the same requests live, they draw what the gateway draws from a request's id
    (exploration, probes, mirrors, rollouts) as the replay drew it: the two runs then differ
    in what serving and measuring do, not in which requests chance picked."""
    ids: Ids = {}
    asked: dict[tuple[str, int], int] = {}
    for row in sorted((r for r in replayed.rows if not r.shadow), key=lambda r: r.index):
        number = asked.get((row.traffic, row.client), 0)
        asked[(row.traffic, row.client)] = number + 1
        ids[(row.traffic, row.client, number)] = f"{replayed.scenario.name}-{row.index}"
    return ids


def report(name: str, replayed: dict[str, Any], live: dict[str, Any], verdict: Verdict) -> str:
    lines = [
        f"### {name}",
        "",
        "| | replay | live |",
        "| --- | --- | --- |",
        *(
            f"| {name.replace('_', ' ').replace(' vs ', ' / ')} | {_v(replayed, name):.3f} | "
            f"{_v(live, name):.3f} |"
            for name in _RATIOS
        ),
        f"| worst class x phase | {_worst(replayed)} | {_worst(live)} |",
        f"| requests, mirrors | {replayed['requests']}, {replayed['mirrors']} | "
        f"{live['requests']}, {live['mirrors']} |",
        "",
        f"live: mirrors by result {live.get('mirror_results') or {}}, "
        f"client errors {live.get('errors') or {}}",
        "",
        "| slice | replay move | live move | live - replay |",
        "| --- | --- | --- | --- |",
        *(f"| {key} | {a} | {b} | {d} |" for key, a, b, d in verdict.rows),
        "",
        "verdict: " + ("same decisions" if verdict.ok else "; ".join(verdict.problems)),
        "",
        *told(replayed, live, verdict),
    ]
    return "\n".join(lines)


def told(replayed: dict[str, Any], live: dict[str, Any], verdict: Verdict) -> list[str]:
    """Around the first move of each slice the runs disagree on, what each run's gateway
    told that slice's clients, ten seconds at a time: the judgement behind the difference."""
    out = []
    ours, theirs = moves(replayed["events"]), moves(live["events"])
    for key in sorted(set(ours) | set(theirs)):
        if not any(p.startswith(f"{key}:") for p in verdict.problems):
            continue
        first = min(m.at for m in [*ours.get(key, []), *theirs.get(key, [])])
        out += [f"what {key} was told (replay / live):"]
        a, b = replayed["said"].get(key, {}), live["said"].get(key, {})
        for at in sorted({*a, *b}):
            if first - 20 <= at <= first + 30:
                out.append(f"  {at} s: {a.get(at, '-')} / {b.get(at, '-')}")
        out.append("")
    return out


_RATIOS = ("adaptive_vs_oracle", "adaptive_vs_always_standard", "adaptive_vs_always_speculative")


def _v(summary: dict[str, Any], name: str) -> float:
    return float(summary["verdict"][name])


def _worst(summary: dict[str, Any]) -> str:
    verdict = summary["verdict"]
    worst = verdict.get("worst_cell_vs_always_standard")
    return "-" if worst is None else f"{worst:.3f} ({verdict.get('worst_cell')})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policy", type=Path, required=True)
    parser.add_argument("--scenario", type=Path, action="append", required=True)
    parser.add_argument("--time-scale", type=float, default=0.25)
    parser.add_argument("--method", default="draft_model", help="the simulators' proposer")
    parser.add_argument("--seed", type=int, default=0, help="offset of the scenario's seed")
    parser.add_argument("--max-delay-s", type=float, default=30.0)
    parser.add_argument("--max-cost-gap", type=float, default=0.03)
    parser.add_argument("--out", type=Path, help="write each scenario's two summaries here")
    add_cost_model(parser)
    args = parser.parse_args()
    policy = load_policy(args.policy.read_text(), str(args.policy))
    failed = 0
    for path in args.scenario:
        scenario = load_scenario(path.read_text(), str(path))
        scenario = scenario.model_copy(update={"seed": scenario.seed + 1000 * args.seed})
        model = scenario.model or next(iter(policy.ladders))
        cost = cost_for(cost_model_arg(args.cost_model), model)
        run = replay(policy, scenario, cost=cost)
        replayed = summarise(run, policy) | {"said": said(run.rows)}
        live = run_one(path, args.policy, args, replayed_ids(run))
        verdict = compare(
            replayed, live, args.max_delay_s, args.max_cost_gap, ends_at=scenario.duration_s
        )
        print(report(scenario.name, replayed, live, verdict), flush=True)
        failed += not verdict.ok
        if args.out:
            args.out.mkdir(parents=True, exist_ok=True)
            both = {"replay": replayed, "live": live, "ok": verdict.ok}
            both["problems"] = list(verdict.problems)
            (args.out / f"{scenario.name}-parity.json").write_text(json.dumps(both, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
