"""Replay the recorded trace in virtual time, three ways, with ``backends.sim.virtual``.

The trace is every request of the live run: its arrival offset (wall seconds divided by the
time scale, so model seconds) and its exact body. The live drift schedule becomes drift
points at the same offsets. Three replays:

- ``routed``: each request to the pool the gateway chose for it (shadow mirrors are added to
  the speculative pool's load, since they ran there, but are not counted as answers);
- ``speculative``: every request to the speculative configuration;
- ``standard``: every request to the standard configuration.

The live run had two servers (one per pool), so each fixed replay gets two replicas of its
configuration too, with requests dealt to them in turn: every way uses the same hardware.

The replay is open loop (requests arrive at their recorded times whatever the pool does),
while the live run was closed loop; the numbers compare pools on one identical trace.
Pure apart from CPU: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from backends.sim.config import Mode, SimConfig
from backends.sim.model import DriftPoint
from backends.sim.virtual import RequestResult, TimedRequest, simulate
from backends.sim.workload import Workload
from gateway.demo.driver import Drift, Result
from gateway.demo.policy import SPEC_POOL
from gateway.demo.workload import MODEL, ORDER

WAYS = ("routed", "speculative", "standard")


@dataclass(frozen=True, slots=True)
class ReplayRow:
    """Mean time per output token (model seconds) of one workload (None: all), per replay."""

    workload: Workload | None
    requests: int
    tpot_s: dict[str, float | None]


@dataclass(frozen=True, slots=True)
class ReplayInput:
    results: Sequence[Result]
    drift_marks: dict[str, float]
    drift: Drift
    time_scale: float
    seed: int
    k: int = 4


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
    """Per workload, then for all requests, the mean TPOT under each of the three replays."""
    answered = [r for r in data.results if r.ok]
    scale = data.time_scale or 1.0
    trace = [TimedRequest(r.at / scale, r.body) for r in answered]
    spec, std = configs(data)
    by_way = {
        "routed": _routed(answered, trace, spec, std),
        "speculative": _replicas(trace, spec),
        "standard": _replicas(trace, std),
    }
    rows = []
    for workload in ORDER:
        mine = [i for i, r in enumerate(answered) if r.workload is workload]
        tpot = {way: _mean_tpot(by_way[way][i] for i in mine) for way in WAYS}
        rows.append(ReplayRow(workload, len(mine), tpot))
    everyone = range(len(answered))
    total = {way: _mean_tpot(by_way[way][i] for i in everyone) for way in WAYS}
    rows.append(ReplayRow(None, len(answered), total))
    return rows


def _routed(
    answered: Sequence[Result], trace: Sequence[TimedRequest], spec: SimConfig, std: SimConfig
) -> list[RequestResult]:
    on_spec = [i for i, r in enumerate(answered) if r.pool == SPEC_POOL]
    mirrors = [i for i, r in enumerate(answered) if r.pool != SPEC_POOL and r.mirrored]
    on_std = [i for i, r in enumerate(answered) if r.pool != SPEC_POOL]
    spec_out = simulate([trace[i] for i in on_spec + mirrors], spec)[: len(on_spec)]
    std_out = simulate([trace[i] for i in on_std], std)
    out: dict[int, RequestResult] = dict(zip(on_spec, spec_out, strict=True))
    out.update(zip(on_std, std_out, strict=True))
    return [out[i] for i in range(len(answered))]


def _replicas(trace: Sequence[TimedRequest], config: SimConfig, n: int = 2) -> list[RequestResult]:
    """``trace`` dealt round-robin to ``n`` servers of ``config``; results in trace order."""
    out: dict[int, RequestResult] = {}
    for replica in range(n):
        mine = list(range(replica, len(trace), n))
        seeded = replace(config, seed=config.seed + 1000 * replica)
        out.update(zip(mine, simulate([trace[i] for i in mine], seeded), strict=True))
    return [out[i] for i in range(len(trace))]


def _mean_tpot(results: Iterable[RequestResult]) -> float | None:
    values = [r.tpot for r in results if r.completion_tokens > 1]
    return sum(values) / len(values) if values else None
