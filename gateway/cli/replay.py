"""``speclane replay``: run scenarios against a policy in virtual time and price the result.

    speclane replay --policy FILE --scenario FILE... [--log REQUESTS.jsonl] [--out DIR] [--json]
        [--cost-model measured|affine|gpu|gpu-32b|gpu:SUMMARY.json]

For each scenario: a table line (adaptive against the oracle, always-standard,
always-speculative and the best static pool per class), ``DIR/NAME.json`` with the full
summary (every class x phase, every guardrail event) and ``DIR/NAME.png`` (needs
matplotlib). Command-line edge only: reads files, writes results; the work is in
``gateway/replay``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from backends.sim.cli import COST_MODEL_HELP, cost_model_arg
from gateway.replay.chart import draw
from gateway.replay.report import TABLE_HEAD, markdown_row, summarise
from gateway.replay.run import read_log, replay
from gateway.replay.scenario import load_scenario
from policies.compiled import load_policy
from policies.problems import PolicyError


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("replay", help="replay traffic scenarios in virtual time")
    parser.add_argument("--policy", type=Path, required=True, help="policy file")
    parser.add_argument("--scenario", type=Path, required=True, nargs="+", help="scenario files")
    parser.add_argument(
        "--log",
        type=Path,
        help="a gateway's request log (SPECLANE_REQUEST_LOG): its requests arrive at their "
        "recorded offsets instead of the scenario's traffic",
    )
    parser.add_argument("--out", type=Path, help="write NAME.json and NAME.png here")
    parser.add_argument("--cost-model", type=cost_model_arg, default=None, help=COST_MODEL_HELP)
    parser.add_argument("--json", action="store_true", help="print the summaries as JSON")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        policy = load_policy(args.policy.read_text(), str(args.policy))
        scenarios = [load_scenario(path.read_bytes(), str(path)) for path in args.scenario]
        log = read_log(args.log.read_text()) if args.log else []
    except (OSError, ValueError, PolicyError) as exc:
        sys.stderr.write(f"{exc}\n")
        return 1
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
    summaries = []
    if not args.json:
        sys.stdout.write(TABLE_HEAD + "\n")
    for scenario in scenarios:
        try:
            result = replay(policy, scenario, log, args.cost_model)
        except ValueError as exc:
            sys.stderr.write(f"{scenario.name}: {exc}\n")
            return 1
        summary = summarise(result, policy)
        for why, n in sorted(result.skipped.items()):
            sys.stderr.write(f"{scenario.name}: left out {n} logged request(s): {why}\n")
        summaries.append(summary)
        if not args.json:
            sys.stdout.write(markdown_row(summary) + "\n")
            sys.stdout.flush()
        if args.out:
            (args.out / f"{scenario.name}.json").write_text(json.dumps(summary, indent=1))
            if not draw(result, args.out / f"{scenario.name}.png"):
                sys.stderr.write("charts need matplotlib (pip install matplotlib)\n")
    if args.json:
        sys.stdout.write(json.dumps(summaries, indent=1) + "\n")
    return 0
