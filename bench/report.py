"""Summaries of the overhead benchmark: the table, the targets, and the raw JSON.

Each cell (configuration x concurrency x mode) was measured once per round. A figure in
the table is the median over rounds; the added latency and the share of the bare proxy's
throughput are medians of per-round differences and ratios, since the configurations of
one cell ran back to back within a round and so share that round's machine conditions.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from loaders import Measurement

DIRECT, BARE, SPECLANE = "direct", "bare", "speclane"
# The targets of issue 2, item 7.
MAX_ADDED_P50_MS = 0.5
MAX_ADDED_P99_MS = 2.0
MIN_SHARE_OF_BARE = 0.85


@dataclass(frozen=True, slots=True)
class Record:
    round: int
    config: str
    concurrency: int
    mode: str
    measurement: Measurement


@dataclass(frozen=True, slots=True)
class Row:
    config: str
    concurrency: int
    mode: str
    rps: float
    p50_ms: float
    p99_ms: float
    added_p50_ms: float | None
    added_p99_ms: float | None
    share_of_bare: float | None
    cpu: dict[str, float]
    requests: int
    errors: int


def _median(values: Iterable[float]) -> float:
    return statistics.median(list(values))


def _paired(mine: dict[int, Measurement], other: dict[int, Measurement], key: str) -> float | None:
    rounds = sorted(set(mine) & set(other))
    if not rounds:
        return None
    if key == "share":
        return _median(mine[r].rps / other[r].rps for r in rounds if other[r].rps)
    return _median((getattr(mine[r], key) - getattr(other[r], key)) / 1e3 for r in rounds)


def rows(records: Sequence[Record]) -> list[Row]:
    cells: dict[tuple[str, int, str], dict[int, Measurement]] = {}
    for rec in records:
        cells.setdefault((rec.config, rec.concurrency, rec.mode), {})[rec.round] = rec.measurement
    out = []
    for (config, concurrency, mode), by_round in cells.items():
        direct = cells.get((DIRECT, concurrency, mode), {})
        bare = cells.get((BARE, concurrency, mode), {})
        ms = list(by_round.values())
        roles = {role for m in ms for role in m.cpu_s}
        cpu = {
            role: _median(p for m in ms if (p := m.cpu_percent(role)) is not None)
            for role in sorted(roles)
        }
        is_direct = config == DIRECT
        out.append(
            Row(
                config=config,
                concurrency=concurrency,
                mode=mode,
                rps=_median(m.rps for m in ms),
                p50_ms=_median(m.p50_us for m in ms) / 1e3,
                p99_ms=_median(m.p99_us for m in ms) / 1e3,
                added_p50_ms=None if is_direct else _paired(by_round, direct, "p50_us"),
                added_p99_ms=None if is_direct else _paired(by_round, direct, "p99_us"),
                share_of_bare=None if is_direct else _paired(by_round, bare, "share"),
                cpu=cpu,
                requests=sum(m.requests for m in ms),
                errors=sum(m.errors for m in ms),
            )
        )
    order = {DIRECT: 0, BARE: 1, SPECLANE: 2}
    out.sort(key=lambda r: (r.mode != "stream", r.concurrency, order.get(r.config, 9)))
    return out


def _num(value: float | None, digits: int = 2, sign: bool = False) -> str:
    if value is None:
        return "–"
    return f"{value:+.{digits}f}" if sign else f"{value:.{digits}f}"


def markdown(table: Sequence[Row]) -> str:
    head = (
        "| config | conc | mode | req/s | p50 ms | p99 ms | +p50 ms | +p99 ms "
        "| % of bare req/s | proxy CPU µs/req | CPU % loader / proxy / upstream / other |\n"
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n"
    )
    lines = []
    for r in table:
        cpu = " / ".join(
            f"{r.cpu[role]:.0f}" if role in r.cpu else "–"
            for role in ("loader", "proxy", "upstream", "other")
        )
        share = "–" if r.share_of_bare is None else f"{100 * r.share_of_bare:.0f} %"
        proxy = r.cpu.get("proxy")
        per_request = "–" if proxy is None or not r.rps else f"{proxy / 100 / r.rps * 1e6:,.0f}"
        lines.append(
            f"| {r.config} | {r.concurrency} | {r.mode} | {r.rps:,.0f} | {r.p50_ms:.2f} "
            f"| {r.p99_ms:.2f} | {_num(r.added_p50_ms, sign=True)} "
            f"| {_num(r.added_p99_ms, sign=True)} | {share} | {per_request} | {cpu} |"
        )
    return head + "\n".join(lines) + "\n"


def targets(table: Sequence[Row]) -> list[tuple[str, bool]]:
    """Each target of the issue, said for speclane, with whether it is met."""
    checks = []
    for r in table:
        if r.config != SPECLANE:
            continue
        if r.concurrency == 1 and r.added_p50_ms is not None and r.added_p99_ms is not None:
            checks.append(
                (
                    f"c=1 {r.mode}: added p50 {r.added_p50_ms:+.2f} ms "
                    f"(target <= {MAX_ADDED_P50_MS} ms)",
                    r.added_p50_ms <= MAX_ADDED_P50_MS,
                )
            )
            checks.append(
                (
                    f"c=1 {r.mode}: added p99 {r.added_p99_ms:+.2f} ms "
                    f"(target <= {MAX_ADDED_P99_MS} ms)",
                    r.added_p99_ms <= MAX_ADDED_P99_MS,
                )
            )
        if r.concurrency == 64 and r.share_of_bare is not None:
            checks.append(
                (
                    f"c=64 {r.mode}: {100 * r.share_of_bare:.0f} % of the bare proxy's req/s "
                    f"(target >= {100 * MIN_SHARE_OF_BARE:.0f} %)",
                    r.share_of_bare >= MIN_SHARE_OF_BARE,
                )
            )
    return checks


def from_json(data: dict[str, Any]) -> list[Record]:
    """The records of a file ``as_json`` wrote."""
    fields = Measurement.__slots__
    return [
        Record(
            r["round"],
            r["config"],
            r["concurrency"],
            r["mode"],
            Measurement(**{k: r[k] for k in fields}),
        )
        for r in data["records"]
    ]


def as_json(records: Sequence[Record], table: Sequence[Row]) -> dict[str, object]:
    return {
        "records": [
            {
                "round": rec.round,
                "config": rec.config,
                "concurrency": rec.concurrency,
                "mode": rec.mode,
                "rps": rec.measurement.rps,
                **{k: getattr(rec.measurement, k) for k in Measurement.__slots__},
            }
            for rec in records
        ],
        "table": [{k: getattr(r, k) for k in Row.__slots__} for r in table],
        "targets": [{"target": text, "met": met} for text, met in targets(table)],
    }
