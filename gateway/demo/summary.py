"""What a demo run showed, as plain values: per-workload numbers, guardrail events, the replay
comparison and shadow traffic; ``as_json`` gives the ``--json`` file. Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from backends.sim.workload import Workload
from gateway.demo.driver import Result, RunState
from gateway.demo.live import event_row
from gateway.demo.policy import SPEC_POOL
from gateway.demo.replay import ReplayRow
from gateway.demo.workload import LABELS, ORDER
from gateway.report import render as pilot_render
from gateway.report.stats import Report

_SHADOW_LINE = re.compile(r"^speclane_shadow_mirrors_total\{(?P<labels>[^}]*)\}\s+(?P<n>\S+)$")
_RESULT_LABEL = re.compile(r'result="(?P<result>[^"]*)"')


@dataclass(frozen=True, slots=True)
class WorkloadRow:
    """Client-side numbers of one workload; times in wall-clock seconds."""

    workload: str
    label: str
    requests: int
    errors: int
    spec_share: float | None
    mean_acceptance_length: float | None
    ttft_p50_wall_s: float | None
    ttft_p99_wall_s: float | None
    tpot_p50_wall_s: float | None
    tpot_p99_wall_s: float | None


@dataclass(frozen=True, slots=True)
class EventRow:
    """One guardrail transition; ``at_s`` is seconds since the run started."""

    at_s: float
    slice: str
    moves: str
    reason: str
    from_phase: str
    to_phase: str
    numbers: dict[str, float]


@dataclass(frozen=True, slots=True)
class ShadowLine:
    """Creative traffic: answered by standard, a sample mirrored to speculation."""

    creative_requests: int
    mirrored_decisions: int
    mirrors: dict[str, int]
    measured_in_window: int
    window_acceptance: float | None
    window_s: float


@dataclass(frozen=True, slots=True)
class Summary:
    options: dict[str, Any]
    stack: dict[str, Any]
    drift: dict[str, float]
    total_requests: int
    workloads: list[WorkloadRow]
    events: list[EventRow]
    replay: list[ReplayRow]
    shadow: ShadowLine
    pilot: Report


def percentile(values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100), interpolated between closest ranks."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def workload_row(workload: Workload, results: Sequence[Result]) -> WorkloadRow:
    mine = [r for r in results if r.workload is workload]
    ok = [r for r in mine if r.ok]
    served = [r for r in mine if r.pool]
    spec = [r for r in ok if r.pool == SPEC_POOL and r.spec_steps]
    steps = sum(r.spec_steps for r in spec)
    ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
    tpot = [r.tpot_s for r in ok if r.tpot_s is not None]
    return WorkloadRow(
        workload=workload.value,
        label=LABELS[workload],
        requests=len(mine),
        errors=len(mine) - len(ok),
        spec_share=sum(r.pool == SPEC_POOL for r in served) / len(served) if served else None,
        mean_acceptance_length=1 + sum(r.accepted for r in spec) / steps if steps else None,
        ttft_p50_wall_s=percentile(ttft, 50),
        ttft_p99_wall_s=percentile(ttft, 99),
        tpot_p50_wall_s=percentile(tpot, 50),
        tpot_p99_wall_s=percentile(tpot, 99),
    )


def shadow_line(
    results: Sequence[Result], stats: Mapping[str, Any], metrics: str, window_s: float
) -> ShadowLine:
    """From the client's decisions, the gateway's /admin/stats and its /metrics text."""
    creative = [r for r in results if r.rule == "creative"]
    measured, acceptance = 0, None
    for entry in stats.get("slices", {}).values():
        if entry.get("rule") != "creative":
            continue
        pool = entry.get("pools", {}).get(SPEC_POOL)
        if pool:
            measured += int(pool.get("measured") or 0)
            acceptance = pool.get("acceptance")
    return ShadowLine(
        creative_requests=len(creative),
        mirrored_decisions=sum(r.mirrored for r in creative),
        mirrors=mirror_counts(metrics),
        measured_in_window=measured,
        window_acceptance=acceptance,
        window_s=window_s,
    )


def mirror_counts(metrics: str) -> dict[str, int]:
    """``speclane_shadow_mirrors_total`` by result (started, dropped_*, failed)."""
    out: dict[str, int] = {}
    for line in metrics.splitlines():
        match = _SHADOW_LINE.match(line)
        if not match:
            continue
        label = _RESULT_LABEL.search(match["labels"])
        if label and 'pool="canary"' not in match["labels"]:
            out[label["result"]] = out.get(label["result"], 0) + int(float(match["n"]))
    return out


def summarise(
    state: RunState,
    *,
    options: dict[str, Any],
    stack: dict[str, Any],
    replay: list[ReplayRow],
    shadow: ShadowLine,
    pilot: Report,
) -> Summary:
    results = state.results
    events = [
        EventRow(
            *event_row(e, state.wall_start),
            from_phase=str(e["from"]["phase"]),
            to_phase=str(e["to"]["phase"]),
            numbers=dict(e.get("numbers") or {}),
        )
        for e in state.events
    ]
    return Summary(
        options=options,
        stack=stack,
        drift=dict(state.drift_marks),
        total_requests=len(results),
        workloads=[workload_row(w, results) for w in ORDER],
        events=events,
        replay=replay,
        shadow=shadow,
        pilot=pilot,
    )


def as_json(summary: Summary) -> dict[str, Any]:
    body = asdict(summary)
    body["pilot"] = pilot_render.as_json(summary.pilot)
    body["replay"] = [
        {
            "workload": row.workload.value if row.workload else "all",
            "requests": row.requests,
            "decode_cost_s": row.cost,
        }
        for row in summary.replay
    ]
    body["guardrail_events"] = body.pop("events")
    return body
