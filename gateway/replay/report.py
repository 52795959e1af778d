"""What a replay showed, as a JSON-ready summary and a Markdown table. Pure.

Targets (issue 11, for the default policy): adaptive within 5% of the oracle overall,
never more than 2% dearer than always-standard in any class x phase once the guardrail has
seen ``min_samples`` requests of it, and cheaper than always-speculative overall.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from gateway.replay.pinned import Held
from gateway.replay.pricing import Cell, Totals, cells, prices, totals
from gateway.replay.run import Replay
from policies.compiled import CompiledPolicy

ORACLE_MARGIN = 1.05
CELL_MARGIN = 1.02


@dataclass(frozen=True, slots=True)
class Verdict:
    vs_oracle: float
    vs_standard: float
    vs_speculative: float
    worst_cell: float
    worst_cell_name: str

    @property
    def misses(self) -> list[str]:
        out = []
        if self.vs_oracle > ORACLE_MARGIN:
            out.append(f"{self.vs_oracle:.3f}x the oracle")
        if self.worst_cell > CELL_MARGIN:
            out.append(f"{self.worst_cell_name} {self.worst_cell:.3f}x always-standard")
        if self.vs_speculative >= 1.0:
            out.append("not cheaper than always-speculative")
        return out


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else 1.0


def summarise(replay: Replay, policy: CompiledPolicy, held: Held | None = None) -> dict[str, Any]:
    """Everything ``speclane replay`` reports, as plain values; with ``held`` (each pool's
    uncached prompt tokens per conversation turn, ``pinned.py``), every price counts
    prefill (``pricing.py``)."""
    price = prices(replay, {p: policy.pools[p].cost_per_hour for p in replay.ladder.pools})
    skip = _min_samples(replay, policy)
    table = cells(replay, price, skip, held)
    total = totals(table, replay.ladder.pools)
    verdict = _verdict(table, total, replay)
    return {
        "scenario": replay.scenario.name,
        "description": replay.scenario.description,
        "ladder": list(replay.ladder.pools),
        "endpoints": replay.endpoints,
        "requests": sum(1 for r in replay.rows if not r.shadow),
        "mirrors": sum(1 for r in replay.rows if r.shadow),
        "probes": sum(1 for r in replay.rows if r.probe),
        "exploration": _exploration(table),
        "skipped": dict(replay.skipped),
        "min_samples": skip,
        "cost": {
            "adaptive": total.adaptive,
            "oracle": total.oracle,
            "best_static": total.best_static,
            **{f"always:{p}": v for p, v in total.pools.items()},
        },
        "verdict": {
            "adaptive_vs_oracle": verdict.vs_oracle,
            "adaptive_vs_always_standard": verdict.vs_standard,
            "adaptive_vs_always_speculative": verdict.vs_speculative,
            "best_static_vs_oracle": _ratio(total.best_static, total.oracle),
            "worst_cell_vs_always_standard": verdict.worst_cell,
            "worst_cell": verdict.worst_cell_name,
            "misses": verdict.misses,
        },
        "cells": [_cell_json(c, replay) for c in table],
        "events": [
            {
                "at": t.at,
                "slice": t.slice,
                "from": f"{t.before.phase.value}/{t.before.offset}",
                "to": f"{t.after.phase.value}/{t.after.offset}",
                "reason": t.reason,
            }
            for t in replay.events
        ],
    }


def _exploration(table: list[Cell]) -> dict[str, Any]:
    """What exploring (mirrors, probes, requests explored one rung down) added to the
    scenario's cost and to its dearest cell's, each as a share of the cost without it."""
    explored = sum(c.explored for c in table)
    rest = sum(c.adaptive for c in table) - explored
    worst = max(table, key=lambda c: c.exploration, default=None)
    return {
        "share": explored / rest if rest > 0 else 0.0,
        "worst_cell": worst.exploration if worst is not None else 0.0,
        "worst_cell_name": f"{worst.traffic}/{worst.phase}" if worst is not None else "",
    }


def _min_samples(replay: Replay, policy: CompiledPolicy) -> int:
    rules = Counter(r.rule for r in replay.rows)
    if not rules:
        return policy.file.guardrail.min_samples
    rule = policy.rule(rules.most_common(1)[0][0])
    return rule.guardrail.min_samples if rule else policy.file.guardrail.min_samples


def _verdict(table: list[Cell], total: Totals, replay: Replay) -> Verdict:
    standard = replay.ladder.pools[-1]
    top = replay.ladder.pools[0]
    worst, name = 0.0, ""
    for c in table:
        if c.late_requests == 0:
            continue
        ratio = _ratio(c.late_adaptive, c.late_pools[standard])
        if ratio > worst:
            worst, name = ratio, f"{c.traffic}/{c.phase}"
    return Verdict(
        vs_oracle=_ratio(total.adaptive, total.oracle),
        vs_standard=_ratio(total.adaptive, total.pools[standard]),
        vs_speculative=_ratio(total.adaptive, total.pools[top]),
        worst_cell=worst,
        worst_cell_name=name,
    )


def _cell_json(cell: Cell, replay: Replay) -> dict[str, Any]:
    standard = replay.ladder.pools[-1]
    return {
        "traffic": cell.traffic,
        "phase": cell.phase,
        "slices": sorted(cell.slices),
        "requests": cell.requests,
        "mirrors": cell.mirrors,
        "exploration": cell.exploration,
        "served_on": dict(cell.on_pool),
        "oracle_pool": cell.oracle_pool(),
        "adaptive_vs_oracle": _ratio(cell.adaptive, cell.oracle),
        "adaptive_vs_always_standard": _ratio(cell.adaptive, cell.pools[standard]),
        "late_adaptive_vs_always_standard": (
            _ratio(cell.late_adaptive, cell.late_pools[standard]) if cell.late_requests else None
        ),
        "cost": {"adaptive": cell.adaptive, **dict(cell.pools)},
    }


def markdown_row(summary: dict[str, Any]) -> str:
    """One line of the decision-quality table."""
    v = summary["verdict"]
    misses = "; ".join(v["misses"]) or "all targets met"
    return (
        f"| {summary['scenario']} | {summary['requests']} | {v['adaptive_vs_oracle']:.3f} "
        f"| {v['adaptive_vs_always_standard']:.3f} | {v['adaptive_vs_always_speculative']:.3f} "
        f"| {v['best_static_vs_oracle']:.3f} | {v['worst_cell_vs_always_standard']:.3f} "
        f"({v['worst_cell']}) | {summary['probes']} | {len(summary['events'])} | {misses} |"
    )


TABLE_HEAD = (
    "| scenario | requests | adaptive / oracle | adaptive / always-standard "
    "| adaptive / always-speculative | best static / oracle "
    "| worst class x phase / always-standard (after min_samples) | probes | events | misses |\n"
    "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
)
