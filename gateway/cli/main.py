"""The ``speclane`` command: serve, init, sim, demo, replay, report, policy, flags, settings and
local-vllm sub-commands."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from importlib import metadata

from backends.sim import cli as sim_cli
from gateway.cli import demo as demo_cli
from gateway.cli import flags as cli_flags
from gateway.cli import init as cli_init
from gateway.cli import policy as cli_policy
from gateway.cli import replay as cli_replay
from gateway.cli import report as cli_report
from gateway.cli import serve as cli_serve
from gateway.cli import settings as cli_settings
from gateway.cli.localvllm import command as local_vllm


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="speclane",
        description="Route each LLM request to speculative or standard decoding.",
    )
    parser.add_argument("--version", action="version", version=f"speclane {_version()}")
    commands = parser.add_subparsers(dest="command", required=True)
    cli_serve.add_parser(commands)
    cli_init.add_parser(commands)
    cli_flags.add_parser(commands)
    cli_policy.add_parser(commands)
    demo_cli.add_parser(commands)
    cli_replay.add_parser(commands)
    cli_report.add_parser(commands)
    local_vllm.add_parser(commands)
    cli_settings.add_parser(commands)
    sim_cli.add_parser(commands).set_defaults(run=sim_cli.run)
    return parser


def _version() -> str:
    try:
        return metadata.version("speclane")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        code: int = args.run(args)
        sys.stdout.flush()
    except BrokenPipeError:  # the reader stopped early (| head): what it read is the answer
        _stdout_to_devnull()
        return 0
    return code


def _stdout_to_devnull() -> None:
    """Point stdout at /dev/null, so the interpreter's last flush at exit does not fail too."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
