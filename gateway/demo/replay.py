"""Price the recorded trace load-neutrally, four ways, like ``speclane replay`` does.

Every answered request of the live run is priced on each pool with the sims' own step-time
model (``ReplayInput.cost``: the curve measured for the demo model's size unless the demo
ran another;
``gateway/replay/pricing.py``): its decode (tokens after the first) takes
(T - 1) / E engine steps, E = 1 on the standard pool and the Leviathan expected tokens per
step at the request's true per-token acceptance (the simulator's model, drift included)
on the speculative one, each step at the load the run actually carried (requests in flight
per server over both servers while it ran), shared by that many sequences. The ways:

- ``routed``: each request on the pool the gateway chose (shadow mirrors cost extra);
- ``speculative`` and ``standard``: every request on that pool, at the same load;
- ``oracle``: per workload and phase (before, during and after the drift), the cheaper pool.

The same load for every way keeps capacity out of it: the comparison is about routing.
Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from backends.sim.config import Mode, SimConfig
from backends.sim.model import (
    CostModel,
    DriftPoint,
    StepCost,
    build_profile,
    expected_tokens_per_step,
)
from backends.sim.workload import Workload
from gateway.demo.driver import Drift, Result
from gateway.demo.policy import SPEC_POOL
from gateway.demo.workload import MODEL, ORDER
from gateway.replay.pricing import step_seconds

WAYS = ("routed", "speculative", "standard", "oracle")
_SERVERS = 2


@dataclass(frozen=True, slots=True)
class ReplayRow:
    """Decode cost (model seconds of one server, load-neutral) of one workload (None: all)."""

    workload: Workload | None
    requests: int
    cost: dict[str, float | None]


@dataclass(frozen=True, slots=True)
class ReplayInput:
    results: Sequence[Result]
    drift_marks: dict[str, float]
    drift: Drift
    time_scale: float
    seed: int
    k: int = 4
    cost: StepCost = field(default_factory=CostModel)


def configs(data: ReplayInput) -> tuple[SimConfig, SimConfig]:
    """The speculative and standard sims as the live run configured them, drift included."""
    scale = data.time_scale or 1.0
    points = []
    if "collapse" in data.drift_marks:
        at = data.drift_marks["collapse"] / scale
        points.append(DriftPoint(Workload.CODE, at, data.drift.collapsed))
    if "recover" in data.drift_marks:
        at = data.drift_marks["recover"] / scale
        points.append(DriftPoint(Workload.CODE, at, data.drift.healthy))
    names = (MODEL,)
    spec = SimConfig(Mode.SPECULATIVE, data.k, names, data.seed, drift=tuple(points))
    std = SimConfig(Mode.STANDARD, data.k, names, data.seed + 1)
    return spec, std


def replay(data: ReplayInput) -> list[ReplayRow]:
    """Per workload, then for all requests, the cost of each way."""
    answered = [r for r in data.results if r.ok]
    scale = data.time_scale or 1.0
    spec, _ = configs(data)
    loads = _loads(data.results)
    marks = sorted(data.drift_marks.values())
    priced: list[tuple[Workload, int, float, float, float]] = []
    for r in answered:
        profile = build_profile(
            r.body, seed=0, index=0, max_tokens=2, now_s=r.at / scale, drift=spec.drift
        )
        a = profile.acceptance
        context = profile.prompt_tokens + r.completion_tokens / 2
        load = loads.get(r.index, 1.0)
        decode = max(r.completion_tokens - 1, 0)
        on_spec = decode / expected_tokens_per_step(a, data.k)
        cost_spec = on_spec * step_seconds(data.cost, load, data.k, context) / load
        cost_std = decode * step_seconds(data.cost, load, None, context) / load
        routed = cost_spec if r.pool == SPEC_POOL else cost_std
        if r.pool != SPEC_POOL and r.mirrored:
            routed += cost_spec
        phase = sum(1 for m in marks if m <= r.at)
        priced.append((r.workload, phase, routed, cost_spec, cost_std))
    rows = [_row(w, [p for p in priced if p[0] is w]) for w in ORDER]
    return [*rows, _row(None, priced)]


def _row(
    workload: Workload | None, priced: list[tuple[Workload, int, float, float, float]]
) -> ReplayRow:
    if not priced:
        return ReplayRow(workload, 0, dict.fromkeys(WAYS))
    oracle: dict[tuple[Workload, int], list[float]] = {}
    for w, phase, _, spec, std in priced:
        cell = oracle.setdefault((w, phase), [0.0, 0.0])
        cell[0] += spec
        cell[1] += std
    cost: dict[str, float | None] = {
        "routed": sum(p[2] for p in priced),
        "speculative": sum(p[3] for p in priced),
        "standard": sum(p[4] for p in priced),
        "oracle": sum(min(c) for c in oracle.values()),
    }
    return ReplayRow(workload, len(priced), cost)


def _loads(results: Sequence[Result]) -> dict[int, float]:
    """Each request's mean requests in flight per server over both servers while it ran."""
    spans = [(r.at, r.done_at) for r in results if r.done_at > r.at]
    out = {}
    for r in results:
        if r.done_at <= r.at:
            continue
        overlap = sum(
            min(r.done_at, e) - max(r.at, s) for s, e in spans if s < r.done_at and e > r.at
        )
        out[r.index] = max(overlap / (r.done_at - r.at) / _SERVERS, 1.0)
    return out
