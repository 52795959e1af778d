"""``speclane local-vllm up|down|status|record``: options, and the steps of each."""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from gateway.cli.localvllm import install, models, servers
from gateway.cli.localvllm.stackfile import POLICY, StackState, policy_text
from gateway.cli.localvllm.steps import StepError, say, tail

_HELP = "a real vLLM stack (CPU build, tiny local models) on loopback, for tests and trials"


def add_parser(commands: Any) -> argparse.ArgumentParser:
    """Add ``local-vllm`` and its sub-commands to ``commands`` (from ``add_subparsers()``)."""
    parser: argparse.ArgumentParser = commands.add_parser(
        "local-vllm", help=_HELP, description=_HELP
    )
    actions = parser.add_subparsers(dest="action", required=True)
    up = actions.add_parser("up", help="install, build, start and wait (reuses what is cached)")
    _common(up)
    up.add_argument("--servers", default="standard,ngram,draft", help="which servers to run")
    up.add_argument("--model-name", default="tiny", help="the model name every server serves")
    up.add_argument("--seed", type=int, default=0, help="seed of the tiny models")
    up.add_argument("--train-steps", type=int, default=models.DEFAULT_PARAMS.train_steps)
    up.add_argument("--distill-steps", type=int, default=models.DEFAULT_PARAMS.distill_steps)
    up.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16")
    up.add_argument("--timeout", type=float, default=300.0, help="seconds to wait for readiness")
    up.set_defaults(run=_resolved(_up))
    for name, run, text in (
        ("down", _down, "stop the servers by their PIDs"),
        ("status", _status, "show each server and whether it answers"),
    ):
        _common(actions.add_parser(name, help=text)).set_defaults(run=_resolved(run))
    record = actions.add_parser("record", help="capture real responses as test fixtures")
    _common(record)
    record.add_argument("--out", type=Path, required=True, help="fixture directory")
    record.set_defaults(run=_resolved(_record))
    return parser


def _common(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    cache = install.default_cache()
    parser.add_argument(
        "--cache-dir", type=Path, default=cache, help=f"venv and models (default {cache})"
    )
    parser.add_argument(
        "--run-dir", type=Path, help="state file, policy and logs (default CACHE_DIR/local-vllm)"
    )
    return parser


def _resolved(run: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """``run`` with ``--run-dir`` defaulting to the cache directory's ``local-vllm``."""

    def with_run_dir(args: argparse.Namespace) -> int:
        if args.run_dir is None:
            args.run_dir = args.cache_dir / "local-vllm"
        return run(args)

    return with_run_dir


def _up(args: argparse.Namespace) -> int:
    started = time.monotonic()
    wanted = [n.strip() for n in args.servers.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in servers.KINDS]
    if unknown or "standard" not in wanted:
        say(f"--servers: names from {sorted(servers.KINDS)}, standard included; got {wanted}")
        return 2
    logs = args.run_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    try:
        python = install.ensure(install.venv_path(args.cache_dir), logs / "install.log")
        params = models.ModelParams(args.seed, args.train_steps, args.distill_steps, args.dtype)
        pair = models.ensure(args.cache_dir, python, params, logs / "models.log")
    except (StepError, OSError) as exc:
        say(f"failed: {exc}")
        return 1
    state, fresh = _start_missing(args, wanted, python, pair, logs)
    problems = servers.wait_ready(fresh, args.timeout, say) if fresh else []
    if problems:
        for problem in problems:
            say(problem)
        for server in fresh:
            say(f"{server.name} log, last lines:\n{tail(Path(server.log))}")
            servers.stop(server)
        return 1
    say(
        f"up in {time.monotonic() - started:.0f} s: "
        + ", ".join(f"{s.name} {s.url}" for s in state.servers)
        + f"; policy {state.policy}"
    )
    return 0


def _start_missing(
    args: argparse.Namespace,
    wanted: list[str],
    python: Path,
    pair: models.Models,
    logs: Path,
) -> tuple[StackState, list[servers.Server]]:
    """Start the wanted servers that are not running (on their old port when it is free);
    save the state at once, so ``down`` finds them even if they never become ready."""
    old = StackState.load(args.run_dir)
    cores = sorted(os.sched_getaffinity(0))
    kept: dict[str, servers.Server] = {}
    if old is not None:
        kept = {s.name: s for s in old.servers if s.name in wanted and servers.is_vllm(s.pid)}
    fresh: list[servers.Server] = []
    for index, name in enumerate(wanted):
        if name in kept:
            continue
        earlier = old.server(name) if old is not None else None
        port = earlier.port if earlier and _port_free(earlier.port) else _free_port()
        core = cores[index % len(cores)]
        log = logs / f"{name}.log"
        argv = servers.argv(python, servers.KINDS[name], pair, args.model_name, port)
        pid = servers.start(argv, servers.server_env(_environment(), core), log)
        fresh.append(servers.Server(name, servers.KINDS[name].k, pid, port, core, str(log)))
        say(f"started {name} (pid {pid}, port {port}, core {core})")
    running = {**kept, **{s.name: s for s in fresh}}
    state = StackState(
        model=args.model_name,
        venv=str(python.parent.parent),
        target=str(pair.target),
        draft=str(pair.draft),
        policy=str(args.run_dir / POLICY),
        servers=[running[n] for n in wanted],
    )
    state.save(args.run_dir)
    (args.run_dir / POLICY).write_text(policy_text(state))
    return state, fresh


def _status(args: argparse.Namespace) -> int:
    state = StackState.load(args.run_dir)
    if state is None:
        say(f"no stack in {args.run_dir}")
        return 3
    ready = 0
    with httpx.Client(timeout=2.0) as client:
        for s in state.servers:
            if servers.healthy(client, s):
                ready += 1
                condition = "ready"
            else:
                condition = "starting" if servers.is_vllm(s.pid) else "stopped"
            k = f"k={s.k}" if s.k else "no speculation"
            say(f"{s.name:9} {condition:8} {s.url}  pid {s.pid}  core {s.core}  {k}  {s.log}")
    say(f"policy {state.policy}")
    return 0 if ready == len(state.servers) else 1


def _down(args: argparse.Namespace) -> int:
    state = StackState.load(args.run_dir)
    if state is None:
        say(f"no stack in {args.run_dir}")
        return 0
    for server in state.servers:
        say(f"{server.name} (pid {server.pid}): {servers.stop(server)}")
    (args.run_dir / "state.json").unlink(missing_ok=True)
    return 0


def _record(args: argparse.Namespace) -> int:
    from gateway.cli.localvllm import record

    state = StackState.load(args.run_dir)
    if state is None:
        say(f"no stack in {args.run_dir}: run `speclane local-vllm up` first")
        return 3
    record.record_all(state, args.out, say)
    return 0


def _environment() -> dict[str, str]:
    # The servers run with this process's environment plus their own variables; nothing
    # here is a setting of the gateway, so this is no second reader of SPECLANE_* values.
    return dict(os.environ)  # noqa: TID251


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _port_free(port: int) -> bool:
    import socket

    with socket.socket() as s:
        # as the server will: a port whose old connections linger in TIME_WAIT is free
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True
