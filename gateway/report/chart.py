"""The pilot report as a PNG: for each slice, every arm's decode speed, cost per token and
p95 latency as bars with their intervals, the verdict in the slice's title.

Needs matplotlib (``pip install 'speclane[charts]'``); without it ``draw`` says so by returning
False. It is imported at call time, so the gateway never loads it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gateway.plotting import pyplot
from gateway.report.stats import Arm, Estimate, Report

_MAX_SLICES = 12
_COLOURS = {True: "tab:orange", False: "tab:blue"}


def draw(report: Report, path: Path) -> bool:
    """Write the chart to ``path``; False when matplotlib is not installed."""
    plt = pyplot()
    if plt is None:
        return False
    slices = sorted({a.slice for a in report.arms})[:_MAX_SLICES] or ["(no requests)"]
    fig, axes = plt.subplots(len(slices), 3, figsize=(12, 2.4 * len(slices) + 0.8), squeeze=False)
    for row, key in zip(axes, slices, strict=True):
        arms = [a for a in report.arms if a.slice == key]
        verdict = next((v.verdict for v in report.verdicts if v.slice == key), "")
        row[0].set_ylabel(f"{key}\n{verdict}", fontsize=7)
        unit = arms[0].cost_unit if arms else "per token"
        _bars(row[0], arms, lambda a: a.speed, "decode tokens/s", 1.0)
        _bars(row[1], arms, lambda a: a.cost, f"cost {unit} (x1e6)", 1e6)
        _bars(row[2], arms, lambda a: a.latency.get(95), "latency p95 (s)", 1.0)
    fig.suptitle(
        f"Pilot report: {report.records} requests, intervals at {report.confidence:.0%}",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def _bars(ax: Any, arms: list[Arm], pick: Any, title: str, scale: float) -> None:
    names: list[str] = []
    values: list[float] = []
    errors: list[list[float]] = [[], []]
    colours: list[str] = []
    for arm in arms:
        e: Estimate | None = pick(arm)
        names.append(arm.arm)
        colours.append(_COLOURS[arm.speculative])
        if e is None:
            values.append(0.0)
            errors[0].append(0.0)
            errors[1].append(0.0)
            continue
        values.append(e.value * scale)
        errors[0].append(max(e.value - e.low, 0.0) * scale)
        errors[1].append(max(e.high - e.value, 0.0) * scale)
    ax.bar(names, values, yerr=errors, color=colours, capsize=4)
    ax.set_title(title, fontsize=8)
    ax.tick_params(labelsize=7)
