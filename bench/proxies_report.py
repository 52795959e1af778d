"""The tables and targets of bench/proxies.py (issue 14).

Every figure is a median over rounds of a per-round value; added latency is taken against
direct, and ratios between two configurations within the same round, since the
configurations of one cell ran back to back and share that round's machine conditions.
"""

from __future__ import annotations

import os
import platform
import statistics
from collections.abc import Callable, Iterable, Sequence

import report
from loaders import Measurement
from procs import cpu_model

ORDER = (
    "direct",
    "bare",
    "bare-2w",
    "vllm-router",
    "litellm",
    "speclane",
    "speclane@base",
    "speclane-asm",
    "speclane-asm@base",
    "speclane-2w",
    "speclane-asm-2w",
)
# issue 14's targets
MAX_ADDED_P50_VS_BARE = 1.2
MIN_SHARE_OF_BARE = 0.9
MAX_CPU_MS = 0.5
MIN_TIMES_LITELLM = 40.0
MIN_WORKER_SCALING = 1.7
MIN_SHARE_OF_ROUTER = 0.4

Cells = dict[tuple[str, int, str], dict[int, Measurement]]


def cells(records: Iterable[report.Record]) -> Cells:
    out: Cells = {}
    for rec in records:
        out.setdefault((rec.config, rec.concurrency, rec.mode), {})[rec.round] = rec.measurement
    return out


def _median(values: Iterable[float]) -> float | None:
    listed = list(values)
    return statistics.median(listed) if listed else None


def _per_round(
    table: Cells, a: str, b: str, conc: int, mode: str, f: Callable[..., float | None]
) -> float | None:
    mine, other = table.get((a, conc, mode), {}), table.get((b, conc, mode), {})
    values = [f(mine[r], other[r]) for r in sorted(set(mine) & set(other))]
    return _median(v for v in values if v is not None)


def added_ms(table: Cells, config: str, conc: int, mode: str, key: str) -> float | None:
    return _per_round(
        table, config, "direct", conc, mode, lambda m, d: (getattr(m, key) - getattr(d, key)) / 1e3
    )


def ratio(table: Cells, a: str, b: str, conc: int, mode: str) -> float | None:
    """``a``'s req/s over ``b``'s."""
    return _per_round(table, a, b, conc, mode, lambda m, o: m.rps / o.rps if o.rps else None)


def added_ratio(table: Cells, a: str, b: str, mode: str) -> float | None:
    """``a``'s added p50 at c=1 over ``b``'s, both against direct in the same round."""
    mine, other = table.get((a, 1, mode), {}), table.get((b, 1, mode), {})
    direct = table.get(("direct", 1, mode), {})
    values = []
    for r in sorted(set(mine) & set(other) & set(direct)):
        theirs = other[r].p50_us - direct[r].p50_us
        if theirs > 0:
            values.append((mine[r].p50_us - direct[r].p50_us) / theirs)
    return _median(values)


def cpu_ms(table: Cells, config: str, conc: int, mode: str) -> float | None:
    ms = table.get((config, conc, mode), {}).values()
    return _median(
        1e3 * m.cpu_s["proxy"] / m.requests for m in ms if "proxy" in m.cpu_s and m.requests
    )


def rps(table: Cells, config: str, conc: int, mode: str) -> float | None:
    return _median(m.rps for m in table.get((config, conc, mode), {}).values())


def _f(value: float | None, fmt: str) -> str:
    return "–" if value is None else format(value, fmt)


def summary(table: Cells, how: dict[str, str]) -> str:
    head = (
        "| proxy | runs with | JSON c=1 +p50 / +p99 ms | JSON c=64 req/s "
        "| stream c=1 +p50 / +p99 ms | stream c=64 req/s | CPU ms/request c=64 JSON / stream |\n"
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |\n"
    )
    names = sorted({c for c, _, _ in table}, key=lambda c: (ORDER + (c,)).index(c))
    lines = []
    for name in names:
        cols = []
        for mode in ("json", "stream"):
            p50, p99 = (added_ms(table, name, 1, mode, k) for k in ("p50_us", "p99_us"))
            added = "–" if p50 is None else f"{p50:+.2f} / {_f(p99, '+.2f')}"
            cols += [added, _f(rps(table, name, 64, mode), ",.0f")]
        cpu = " / ".join(_f(cpu_ms(table, name, 64, m), ".2f") for m in ("json", "stream"))
        if name == "direct":
            cols[0] = cols[2] = "–"
        lines.append(f"| {name} | {how.get(name, '')} | {' | '.join(cols)} | {cpu} |")
    return head + "\n".join(lines) + "\n"


def _speclane_cells(table: Cells) -> list[tuple[str, str]]:
    """(config, mode) of speclane on one process, as measured."""
    return [
        (config, mode)
        for config, mode in (("speclane", "stream"), ("speclane", "json"), ("speclane-asm", "json"))
        if (config, 1, mode) in table or (config, 64, mode) in table
    ]


def targets(table: Cells) -> list[tuple[str, bool | None]]:
    """Each target of issue 14 with whether it is met (None: not measured)."""
    out: list[tuple[str, bool | None]] = []

    def at_most(text: str, value: float | None, limit: float, unit: str = "x") -> None:
        shown = _f(value, ".2f") + unit
        out.append(
            (
                f"{text}: {shown} (target <= {limit}{unit})",
                None if value is None else value <= limit,
            )
        )

    def at_least(text: str, value: float | None, limit: float) -> None:
        shown = _f(value, ".2f") + "x"
        out.append(
            (f"{text}: {shown} (target >= {limit}x)", None if value is None else value >= limit)
        )

    for config, mode in _speclane_cells(table):
        at_most(
            f"c=1 {config} {mode}: added p50 over the bare proxy's",
            added_ratio(table, config, "bare", mode),
            MAX_ADDED_P50_VS_BARE,
        )
    for config, mode in _speclane_cells(table):
        if mode == "json":
            at_least(
                f"c=64 {config} json: req/s over the bare proxy's",
                ratio(table, config, "bare", 64, mode),
                MIN_SHARE_OF_BARE,
            )
        at_most(
            f"c=64 {config} {mode}: CPU per request",
            cpu_ms(table, config, 64, mode),
            MAX_CPU_MS,
            " ms",
        )
    for config, mode in _speclane_cells(table):
        for conc in (1, 64):
            at_least(
                f"c={conc} {config} {mode}: req/s over LiteLLM's",
                ratio(table, config, "litellm", conc, mode),
                MIN_TIMES_LITELLM,
            )
    for config, mode in _speclane_cells(table):
        many = f"{config}-2w"
        if (many, 64, mode) not in table:
            continue
        at_least(
            f"c=64 {many} {mode}: req/s over one process's",
            ratio(table, many, config, 64, mode),
            MIN_WORKER_SCALING,
        )
        at_least(
            f"c=64 {many} {mode}: req/s over vllm-router's",
            ratio(table, many, "vllm-router", 64, mode),
            MIN_SHARE_OF_ROUTER,
        )
    return out


def machine(others: Sequence[tuple[str, float]]) -> str:
    busy = ", ".join(f"{name} {pct:.0f}%" for name, pct in others) or "nothing"
    return (
        f"{os.cpu_count()} cores ({cpu_model()}), {platform.system()} "
        f"{platform.release()}, Python {platform.python_version()}; load average "
        f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}; other processes before the first "
        f"round (% of one core): {busy}"
    )


def line(rec: report.Record) -> str:
    m = rec.measurement
    cpu = " ".join(f"{role} {p:.0f}%" for role in m.cpu_s if (p := m.cpu_percent(role)) is not None)
    per = (
        f"  {1e3 * m.cpu_s['proxy'] / m.requests:.2f} ms/req"
        if "proxy" in m.cpu_s and m.requests
        else ""
    )
    errors = f"  ERRORS {m.errors}" if m.errors else ""
    return (
        f"  {rec.config:<18} {m.rps:8,.0f} req/s  p50 {m.p50_us / 1e3:7.2f} ms  "
        f"p99 {m.p99_us / 1e3:7.2f} ms{per}  (cpu {cpu}){errors}"
    )


def render(records: Sequence[report.Record], machine_info: str, how: dict[str, str]) -> str:
    table = cells(records)
    out = ["", machine_info, "", summary(table, how), report.markdown(report.rows(records))]
    for text, met in targets(table):
        mark = "–      " if met is None else "MET    " if met else "NOT MET"
        out.append(f"  {mark}  {text}")
    return "\n".join(out)
