"""The demo's progress display: elapsed time, requests per workload, the current pool split
and guardrail events as they happen. Reads the run's state; never changes it."""

from __future__ import annotations

import asyncio
from typing import Any

from rich.console import Group, RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from gateway.demo.driver import Drift, Result, RunState
from gateway.demo.policy import SPEC_POOL, rung_name
from gateway.demo.workload import LABELS, ORDER

RECENT_S = 10.0  # the pool split covers this much, or a sixth of a shorter run
SHOWN_EVENTS = 8


async def keep_drawing(live: Live, state: RunState, drift: Drift, every: float = 0.25) -> None:
    """Redraw until cancelled (the display has no thread of its own)."""
    while True:
        live.update(render(state, drift), refresh=True)
        await asyncio.sleep(every)


def render(state: RunState, drift: Drift) -> RenderableType:
    elapsed = min(state.elapsed(), state.duration_s)
    results = list(state.results)
    head = Text.assemble(
        ("speclane demo  ", "bold"),
        f"{elapsed:5.1f} s / {state.duration_s:g} s   {len(results)} requests   ",
        _drift_note(state, drift),
    )
    bar = ProgressBar(total=state.duration_s, completed=elapsed, width=60)
    recent = max(min(RECENT_S, state.duration_s / 6), 0.5)
    return Group(head, bar, _workloads(results, state.elapsed(), recent), _events(state))


def _drift_note(state: RunState, drift: Drift) -> Text:
    marks = state.drift_marks
    if "recover" in marks:
        return Text(f"code acceptance recovered at {marks['recover']:.1f} s", style="green")
    if "collapse" in marks:
        return Text(f"code acceptance collapsed at {marks['collapse']:.1f} s", style="red")
    return Text(f"code acceptance collapses at {drift.collapse_at * state.duration_s:.1f} s")


def _workloads(results: list[Result], now: float, recent_s: float) -> Table:
    title = f"requests (pool split over the last {recent_s:.3g} s)"
    table = Table(title=title, title_justify="left")
    for name in ("workload", "done", "errors", "on spec", "on standard"):
        table.add_column(name, justify="left" if name == "workload" else "right")
    recent = [r for r in results if now - r.done_at <= recent_s and r.pool]
    for workload in ORDER:
        mine = [r for r in results if r.workload is workload]
        spec, std = _split([r for r in recent if r.workload is workload])
        errors = sum(not r.ok for r in mine)
        table.add_row(LABELS[workload], str(len(mine)), str(errors), spec, std)
    spec, std = _split(recent)
    table.add_row(Text("all", style="bold"), str(len(results)), "", spec, std)
    return table


def _split(results: list[Result]) -> tuple[str, str]:
    if not results:
        return "-", "-"
    share = sum(r.pool == SPEC_POOL for r in results) / len(results)
    return f"{share:.0%}", f"{1 - share:.0%}"


def _events(state: RunState) -> RenderableType:
    if not state.events:
        return Text("guardrail: no events yet", style="dim")
    table = Table(title="guardrail events", title_justify="left")
    for name in ("at", "slice", "from → to", "reason"):
        table.add_column(name, justify="right" if name == "at" else "left")
    for event in state.events[-SHOWN_EVENTS:]:
        at, *rest = event_row(event, state.wall_start)
        table.add_row(f"{at:+.1f} s", *rest)
    return table


def event_row(event: dict[str, Any], wall_start: float) -> tuple[float, str, str, str]:
    """(time since start, slice, from → to, reason) of one /admin/guardrail event."""
    rule = str(event["slice"]).split(" / ", 1)[0]
    before, after = event["from"], event["to"]
    moves = (
        f"{rung_name(rule, before['offset'], before['phase'])} → "
        f"{rung_name(rule, after['offset'], after['phase'])}"
    )
    return float(event["at"]) - wall_start, str(event["slice"]), moves, str(event["reason"])
