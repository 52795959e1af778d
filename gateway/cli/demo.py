"""The ``demo`` sub-command's options. ``add_parser(commands)`` adds it to ``speclane``;
``run(args)`` checks the options and hands them to ``gateway.demo.session`` (imported only
then, so the other sub-commands do not pay for rich and the demo's modules at start-up).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from backends.sim.cli import COST_MODEL_HELP, cost_model_arg
from gateway.demo.options import Options

_HELP = "run the gateway against simulated speculative and standard pools, and report"


def add_parser(commands: Any) -> argparse.ArgumentParser:
    """Add ``demo`` to ``commands`` (from ``add_subparsers()``)."""
    parser: argparse.ArgumentParser = commands.add_parser("demo", help=_HELP, description=_HELP)
    add = parser.add_argument
    add("--duration", type=float, default=60.0, help="seconds of traffic (default 60)")
    add("--concurrency", type=int, default=8, help="requests in flight (default 8)")
    add(
        "--agents",
        type=int,
        default=1,
        help="coding agents beside them: tool use over several turns on /v1/messages (default 1)",
    )
    add("--seed", type=int, default=7, help="seed of the request mix and the sims")
    add(
        "--time-scale",
        type=float,
        default=0.25,
        help="passed to the sims: wall seconds per model second (default 0.25, so a minute "
        "of traffic is four minutes of model time)",
    )
    add("--keep", action="store_true", help="leave the stack running and print its URLs")
    add("--json", type=Path, help="also write the summary as JSON to this file")
    add("--cost-model", default="measured", help=COST_MODEL_HELP)
    parser.set_defaults(run=run)
    return parser


def run(args: argparse.Namespace) -> int:
    """Run the demo; 0 when it completed, 1 on a failure, 2 for bad options, 130 if stopped."""
    options = Options(
        duration=args.duration,
        concurrency=args.concurrency,
        agents=args.agents,
        seed=args.seed,
        time_scale=args.time_scale,
        keep=args.keep,
        json=args.json,
        cost_model=args.cost_model,
    )
    problem = _check(options)
    if problem:
        sys.stderr.write(f"speclane demo: {problem}\n")
        return 2
    from gateway.demo import session

    return session.main(options)


def _check(options: Options) -> str | None:
    if options.duration <= 0:
        return "--duration must be positive"
    if options.concurrency < 1:
        return "--concurrency must be at least 1"
    if options.agents < 0:
        return "--agents must not be negative"
    if options.time_scale <= 0:
        return "--time-scale must be positive"
    try:
        cost_model_arg(options.cost_model)
    except argparse.ArgumentTypeError as exc:
        return f"--cost-model {exc}"
    return None
