"""One demo session, start to finish: start the stack, drive traffic under the live display,
gather the gateway's view, replay the trace, print the summary, stop the stack.

The stack is stopped in ``finally`` whatever happens (error, Ctrl-C, SIGTERM, SIGHUP),
unless ``--keep`` asked to leave it running. Outside the event loop SIGTERM and SIGHUP raise
``KeyboardInterrupt``; inside it they cancel the run, as ``asyncio.run`` does for Ctrl-C.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import tempfile
from dataclasses import asdict
from pathlib import Path
from types import FrameType
from typing import Any

import httpx
import orjson
from rich.console import Console
from rich.live import Live

from backends.sim.cli import cost_for, cost_model_arg
from gateway.demo import driver, report
from gateway.demo.driver import Drift, RunState, Target
from gateway.demo.live import keep_drawing, render
from gateway.demo.options import Options
from gateway.demo.policy import Tuning, demo_policy, for_duration
from gateway.demo.replay import ReplayInput, replay
from gateway.demo.stack import Stack, StackError, StackOptions
from gateway.demo.summary import Summary, as_json, shadow_line, summarise
from gateway.demo.workload import MODEL, Mix
from gateway.report.stats import build


def main(options: Options) -> int:
    console = Console()
    if not console.is_terminal:  # a file or a pipe: wide enough for the summary tables
        console = Console(width=120)
    tuning = for_duration(options.duration)
    workdir = Path(tempfile.mkdtemp(prefix="speclane-demo-"))
    stack = Stack(
        workdir,
        StackOptions(
            policy=lambda spec, std: demo_policy(spec, std, tuning, MODEL),
            seed=options.seed,
            time_scale=options.time_scale,
            keep=options.keep,
            cost_model=options.cost_model,
        ),
    )
    previous = _stop_on_signals()
    try:
        return _session(console, options, tuning, stack)
    except StackError as exc:
        console.print(f"[red]the demo stack did not start:[/red] {exc}")
        return 1
    except httpx.HTTPError as exc:
        console.print(f"[red]the demo stack stopped answering:[/red] {exc!r}")
        return 1
    except (KeyboardInterrupt, asyncio.CancelledError):
        console.print("[yellow]interrupted: stopping the demo stack[/yellow]")
        return 130
    finally:
        _restore(previous)
        if options.keep and stack.children:
            _print_kept(console, stack, workdir)
        else:
            stack.stop()
            shutil.rmtree(workdir, ignore_errors=True)


def _session(console: Console, options: Options, tuning: Tuning, stack: Stack) -> int:
    stack.spawn()
    with console.status("starting two simulated pools and the gateway..."):
        stack.wait_ready()
    console.print(
        f"gateway {stack.gateway_url}, speculative pool {stack.spec_url}, "
        f"standard pool {stack.standard_url}; {options.duration:g} s of traffic at "
        f"concurrency {options.concurrency}"
    )
    summary = asyncio.run(_drive(console, options, tuning, stack))
    _stop_on_signals()  # the loop's own handlers went away with it
    report.show(console, summary)
    if options.json is not None:
        options.json.write_bytes(orjson.dumps(as_json(summary), option=orjson.OPT_INDENT_2))
        console.print(f"summary written to {options.json}")
    return 0


async def _drive(console: Console, options: Options, tuning: Tuning, stack: Stack) -> Summary:
    _cancel_on_signals(asyncio.current_task())
    drift = Drift()
    state = RunState(options.duration)
    target = Target(stack.gateway_url, stack.spec_url, stack.admin_token)
    with Live(render(state, drift), console=console, auto_refresh=False, transient=True) as live:
        drawer = asyncio.create_task(keep_drawing(live, state, drift))
        try:
            await driver.run(
                target,
                Mix(options.seed),
                state,
                concurrency=options.concurrency,
                drift=drift,
                agents=options.agents,
                seed=options.seed,
                poll_s=max(0.1, min(0.5, options.duration / 60)),
            )
        finally:
            drawer.cancel()
            await asyncio.gather(drawer, return_exceptions=True)
    async with httpx.AsyncClient(timeout=10) as client:
        stats = await driver.admin_get(client, target, "/admin/stats")
        records = await driver.admin_get(client, target, "/admin/outcomes")
        metrics = (await client.get(stack.gateway_url + "/metrics")).text
    cost = cost_for(cost_model_arg(options.cost_model), MODEL)
    rows = replay(
        ReplayInput(
            state.results, state.drift_marks, drift, options.time_scale, options.seed, cost=cost
        )
    )
    return summarise(
        state,
        options=_options_json(options, tuning, drift),
        stack=dict(stack.describe()),
        replay=rows,
        shadow=shadow_line(state.results, stats, metrics, tuning.window_s),
        pilot=build(records.get("outcomes") or []),
    )


def _options_json(options: Options, tuning: Tuning, drift: Drift) -> dict[str, Any]:
    out: dict[str, Any] = asdict(options)
    out["json"] = str(options.json) if options.json else None
    out["guardrail"] = asdict(tuning)
    out["drift"] = asdict(drift)
    return out


def _print_kept(console: Console, stack: Stack, workdir: Path) -> None:
    console.print("[bold]the stack keeps running (--keep):[/bold]")
    for name, info in stack.describe().items():
        console.print(f"  {name:12} {info['url']}  pid {info['pid']}")
    pids = " ".join(str(c.process.pid) for c in stack.children)
    console.print(f"  admin token  {stack.admin_token}")
    console.print(
        f"  try: curl -H 'authorization: Bearer {stack.admin_token}' "
        f"{stack.gateway_url}/admin/guardrail"
    )
    console.print(f"  policy and logs in {workdir}; stop with: kill {pids}")


_Handler = signal.Handlers | int | None | Any


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _stop_on_signals() -> dict[int, _Handler]:
    """Turn SIGTERM and SIGHUP into KeyboardInterrupt, so that ``finally`` cleans up."""
    previous: dict[int, _Handler] = {}
    for sig in (signal.SIGTERM, signal.SIGHUP):
        previous[sig] = signal.signal(sig, _interrupt)
    return previous


def _cancel_on_signals(task: asyncio.Task[Any] | None) -> None:
    loop = asyncio.get_running_loop()
    if task is not None:
        for sig in (signal.SIGTERM, signal.SIGHUP):
            loop.add_signal_handler(sig, task.cancel)


def _restore(previous: dict[int, _Handler]) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler)
