"""A PNG per replay: for each traffic class, the rung each request was served on and the
acceptance over time, with the scenario's phases and the guardrail's events marked.

Needs matplotlib (``pip install matplotlib``); without it ``draw`` says so and returns
False. It is imported at call time, so the gateway never loads it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gateway.plotting import pyplot
from gateway.replay.run import Replay

_MAX_CLASSES = 10


def draw(replay: Replay, path: Path) -> bool:
    """Write the chart to ``path``; False when matplotlib is not installed."""
    plt = pyplot()
    if plt is None:
        return False
    classes = [t.name for t in replay.scenario.traffic][:_MAX_CLASSES]
    fig, axes = plt.subplots(
        len(classes), 1, figsize=(11, 1.9 * len(classes) + 0.8), sharex=True, squeeze=False
    )
    for ax, name in zip(axes[:, 0], classes, strict=True):
        _panel(ax, replay, name)
    axes[-1, 0].set_xlabel("virtual seconds")
    fig.suptitle(f"{replay.scenario.name}: rung served (dots, left) and acceptance (right)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def _panel(ax: Any, replay: Replay, name: str) -> None:
    rows = sorted((r for r in replay.rows if r.traffic == name), key=lambda r: r.arrival)
    rungs = replay.ladder.pools
    normal = [r for r in rows if not r.probe and not r.shadow]
    probes = [r for r in rows if r.probe or r.shadow]
    ax.scatter([r.arrival for r in normal], [r.rung for r in normal], s=3, c="tab:blue")
    ax.scatter([r.arrival for r in probes], [r.rung for r in probes], s=8, c="tab:orange")
    ax.set_yticks(range(len(rungs)), rungs, fontsize=7)
    ax.set_ylim(len(rungs) - 0.5, -0.5)
    ax.set_ylabel(name, fontsize=8)
    right = ax.twinx()
    right.plot([r.arrival for r in rows], [r.acceptance for r in rows], c="tab:green", lw=0.8)
    right.set_ylim(0, 1)
    right.set_ylabel("per-token acceptance", fontsize=7)
    for phase, at in replay.scenario.phase_marks():
        ax.axvline(at, c="grey", ls="--", lw=0.8)
        ax.text(at, -0.45, f" {phase}", fontsize=7, va="top", color="grey")
    slices = {r.slice for r in rows}
    for event in replay.events:
        if event.slice in slices:
            down = event.after.offset > event.before.offset
            ax.axvline(event.at, c="tab:red" if down else "tab:green", lw=0.6, alpha=0.7)
