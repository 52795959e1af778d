"""The pilot report for people: one rich table per slice, its arms as rows, and the verdict
under it; then the prefix cache's hit ratio per pool and endpoint. No computation here
beyond formatting."""

from __future__ import annotations

import datetime
from typing import Any

from rich.console import Console, Group
from rich.table import Table
from rich.text import Text

from gateway.report.cache import CacheRow
from gateway.report.stats import LOSES, QUANTILES, WINS, Arm, Estimate, Report, Verdict
from policies.splitting import parent_of

_STYLE = {WINS: "bold green", LOSES: "bold red"}


def _interval(e: Estimate | None, fmt: str, scale: float = 1.0) -> str:
    """``value ±half`` for a symmetric interval, ``value [low-high]`` otherwise."""
    if e is None:
        return "-"
    value, low, high = e.value * scale, e.low * scale, e.high * scale
    if e.se is not None and abs((high - value) - (value - low)) <= 1e-9 * max(abs(value), 1):
        return f"{value:{fmt}} ±{high - value:{fmt}}"
    return f"{value:{fmt}} [{low:{fmt}}-{high:{fmt}}]"


def _cost_head(arms: list[Arm]) -> str:
    priced = all(a.cost_unit == "per token" for a in arms)
    return "cost per 1M tokens" if priced else "endpoint-ms per token"


def _cost(e: Estimate | None, unit: str) -> str:
    scale = 1e6 if unit == "per token" else 1e3
    return _interval(e, ".3g", scale)


def show(console: Console, report: Report) -> None:
    console.print(_heading(report))
    slices = sorted({a.slice for a in report.arms})
    for key in slices:
        arms = [a for a in report.arms if a.slice == key]
        verdict = next(v for v in report.verdicts if v.slice == key)
        parent = parent_of(key)  # a child of a split slice: its key sorts after its parent
        note = Text(f"split by application from {parent}", style="dim") if parent else Text()
        console.print(Group(_table(key, arms), note, _verdict(verdict)))
    if not slices:
        console.print("no requests in the records yet", style="dim")
    if report.cache:
        console.print(_cache_table(report.cache))


def _cache_table(rows: list[CacheRow]) -> Table:
    """Prompt tokens the engines' prefix caches held, per pool and endpoint."""
    table = Table(title="prefix cache", title_justify="left", title_style="bold")
    for name in ("pool", "endpoint", "requests", "prompt tokens", "cached", "hit ratio"):
        table.add_column(name, justify="left" if name in ("pool", "endpoint") else "right")
    for row in rows:
        ratio = "-" if row.hit_ratio is None else f"{row.hit_ratio:.1%}"
        table.add_row(
            row.pool if not row.endpoint else "",
            row.endpoint or "(all)",
            str(row.requests),
            f"{row.prompt_tokens:,}",
            f"{row.cached_tokens:,}",
            ratio,
        )
    return table


def _heading(report: Report) -> Text:
    span = ""
    if report.first_at is not None and report.last_at is not None:
        start = datetime.datetime.fromtimestamp(report.first_at, datetime.UTC)
        span = f", {start:%Y-%m-%d %H:%M:%S} UTC + {report.last_at - report.first_at:.0f} s"
    return Text(
        f"Pilot report: {report.records} requests{span}; intervals at "
        f"{report.confidence:.0%} confidence",
        style="bold",
    )


def _table(key: str, arms: list[Arm]) -> Table:
    """One slice: its figures as rows, its arms as columns."""
    table = Table(title=key, title_justify="left", title_style="bold")
    table.add_column("")
    for arm in arms:
        table.add_column(arm.arm + (" (speculative)" if arm.speculative else ""), justify="right")
    rows: list[tuple[str, list[str]]] = [
        ("served by", [", ".join(f"{p} {n}" for p, n in sorted(a.pools.items())) for a in arms]),
        ("requests (errors)", [f"{a.requests} ({a.errors})" for a in arms]),
        ("decode tokens/s", [_interval(a.speed, ".0f") for a in arms]),
        (_cost_head(arms), [_cost(a.cost, a.cost_unit) for a in arms]),
        *((f"latency p{q}, s", [_interval(a.latency[q], ".3f") for a in arms]) for q in QUANTILES),
        ("draft acceptance", [_interval(a.acceptance, ".2f") for a in arms]),
        ("tokens per step", [_interval(a.tokens_per_step, ".2f") for a in arms]),
        (
            "valid (finished answers)",
            [_interval(a.validity, ".0%") if a.checked else "-" for a in arms],
        ),
    ]
    for name, cells in rows:
        table.add_row(name, *cells)
    return table


def _verdict(verdict: Verdict) -> Text:
    reasons = f" ({', '.join(verdict.reasons)})" if verdict.reasons else ""
    versus = ""
    if verdict.speculative and verdict.standard:
        versus = f": {verdict.speculative} against {verdict.standard}"
    return Text(f"  {verdict.verdict}{versus}{reasons}\n", style=_STYLE.get(verdict.verdict, ""))


def as_json(report: Report) -> dict[str, Any]:
    def estimate(e: Estimate | None) -> dict[str, float] | None:
        return None if e is None else {"value": e.value, "low": e.low, "high": e.high, "n": e.n}

    return {
        "confidence": report.confidence,
        "records": report.records,
        "arms": [
            {
                "slice": a.slice,
                "arm": a.arm,
                "speculative": a.speculative,
                "pools": a.pools,
                "requests": a.requests,
                "errors": a.errors,
                "tokens_per_s": estimate(a.speed),
                "cost_per_token": estimate(a.cost),
                "cost_unit": a.cost_unit,
                "latency_s": {f"p{q}": estimate(a.latency[q]) for q in QUANTILES},
                "draft_acceptance": estimate(a.acceptance),
                "tokens_per_step": estimate(a.tokens_per_step),
                "validity": estimate(a.validity),
            }
            for a in report.arms
        ],
        "verdicts": [
            {
                "slice": v.slice,
                "speculative": v.speculative,
                "standard": v.standard,
                "verdict": v.verdict,
                "reasons": list(v.reasons),
            }
            for v in report.verdicts
        ],
        "prefix_cache": [
            {
                "pool": c.pool,
                "endpoint": c.endpoint or None,
                "requests": c.requests,
                "prompt_tokens": c.prompt_tokens,
                "cached_tokens": c.cached_tokens,
                "hit_ratio": c.hit_ratio,
            }
            for c in report.cache
        ],
    }
