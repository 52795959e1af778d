"""The pilot report's numbers: per slice and arm, from request records
(``gateway/measure/requestlog.py``), each with a confidence interval, and a plain verdict per
slice. Pure: no I/O, no clock.

An arm is the experiment arm a request was assigned to (intent to treat: a speculative arm's
request that the guardrail served on standard still counts for the speculative arm), or,
outside experiments, the pool that served it. Shadow mirrors are left out: nobody waited
for them.

Figures are ratios over requests, so long answers weigh by their tokens, and their intervals
come from the ratio estimator's variance (the delta method): tokens per second of decode
(tokens after the first over decode seconds), cost per output token (each request's share
of its endpoint's time, priced at its pool's ``cost_per_hour``; endpoint-seconds when a
price is missing), draft acceptance (accepted over drafted tokens) and tokens per engine
step. Latency quantiles get distribution-free intervals from order statistics, validity (of
answers that finished: one cut by ``max_tokens`` is the request's budget, not the model) a
Wilson interval.

Verdict, speculative arm against the standard one in the same slice: speculation *loses*
when it is slower, dearer, or less often valid, with confidence; it *wins* when it is faster
or cheaper with confidence and none of those; otherwise there is *not enough data yet*
(also while either arm has fewer than ``min_requests`` measured requests).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Any

from gateway.report.cache import CacheRow, cache_rows

Record = Mapping[str, Any]
WINS = "speculation wins"
LOSES = "speculation loses"
UNSURE = "not enough data yet"
QUANTILES = (50, 95, 99)
_UNCHECKED = ("skipped", "unchecked", "truncated")  # validity is of answers that finished


@dataclass(frozen=True, slots=True)
class Estimate:
    """A figure with its interval; ``se`` is its standard error (None for quantiles)."""

    value: float
    low: float
    high: float
    n: int
    se: float | None = None


@dataclass(frozen=True, slots=True)
class Arm:
    slice: str
    arm: str
    speculative: bool
    pools: dict[str, int]
    requests: int
    errors: int
    speed: Estimate | None
    cost: Estimate | None
    cost_unit: str
    latency: dict[int, Estimate | None]
    acceptance: Estimate | None
    tokens_per_step: Estimate | None
    validity: Estimate | None
    checked: int = 0


@dataclass(frozen=True, slots=True)
class Verdict:
    slice: str
    speculative: str | None
    standard: str | None
    verdict: str
    reasons: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Report:
    arms: list[Arm]
    verdicts: list[Verdict]
    confidence: float
    records: int
    first_at: float | None = None
    last_at: float | None = None
    notes: list[str] = field(default_factory=list)
    cache: list[CacheRow] = field(default_factory=list)


def ratio(pairs: Sequence[tuple[float, float]], z: float) -> Estimate | None:
    """Sum of y over sum of x for (x, y) pairs, with its delta-method interval."""
    n = len(pairs)
    sx = sum(x for x, _ in pairs)
    if n < 2 or sx <= 0:
        return None
    r = sum(y for _, y in pairs) / sx
    mean_x = sx / n
    residual = sum((y - r * x) ** 2 for x, y in pairs) / (n - 1)
    se = math.sqrt(residual / n) / mean_x
    return Estimate(r, r - z * se, r + z * se, n, se)


def quantile(values: Sequence[float], q: float, z: float) -> Estimate | None:
    """The ``q``-th percentile with an order-statistic interval; None under 5 values."""
    n = len(values)
    if n < 5:
        return None
    ordered = sorted(values)
    p = q / 100
    rank = (n - 1) * p
    low, frac = int(rank), rank - int(rank)
    value = ordered[low] + (ordered[min(low + 1, n - 1)] - ordered[low]) * frac
    spread = z * math.sqrt(n * p * (1 - p))
    j = max(math.floor(n * p - spread) - 1, 0)
    k = min(math.ceil(n * p + spread), n - 1)
    return Estimate(value, ordered[j], ordered[k], n)


def proportion(hits: int, n: int, z: float) -> Estimate | None:
    """A share with its Wilson interval."""
    if n == 0:
        return None
    p = hits / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return Estimate(
        p, max(centre - half, 0.0), min(centre + half, 1.0), n, math.sqrt(p * (1 - p) / n)
    )


def arm_of(record: Record) -> str:
    return str(record.get("arm") or record.get("pool") or "")


def summarise(records: Iterable[Record], z: float, priced: bool) -> tuple[Any, ...]:
    """(speed, cost, latency, acceptance, tokens per step, validity, checked) of one arm."""
    rows = list(records)
    ok = [r for r in rows if r.get("status") == "ok"]
    speed = [
        (float(r["decode_s"]), float(r["completion_tokens"] - 1))
        for r in ok
        if (r.get("decode_s") or 0) > 0 and (r.get("completion_tokens") or 0) > 1
    ]
    cost = [
        (float(r["completion_tokens"]), _cost(r, priced))
        for r in ok
        if r.get("serving_s") is not None and (r.get("completion_tokens") or 0) > 0
    ]
    drafts = [(float(r["drafted"]), float(r["accepted"])) for r in ok if r.get("drafted")]
    steps = [
        (float(r["steps"]), float(r["completion_tokens"] - 1))
        for r in ok
        if r.get("steps") and (r.get("completion_tokens") or 0) > 1
    ]
    checks = [c for r in ok for c in r.get("checks") or () if c[1] not in _UNCHECKED]
    valid = sum(1 for c in checks if c[1] == "valid")
    durations = [float(r["duration_s"]) for r in ok]
    latency = {q: quantile(durations, q, z) for q in QUANTILES}
    return (
        ratio(speed, z),
        ratio(cost, z),
        latency,
        ratio(drafts, z),
        ratio(steps, z),
        proportion(valid, len(checks), z),
        len(checks),
    )


def _cost(record: Record, priced: bool) -> float:
    seconds = float(record["serving_s"])
    return seconds * float(record["cost_per_hour"]) / 3600 if priced else seconds


def build(records: Iterable[Record], confidence: float = 0.95, min_requests: int = 10) -> Report:
    """The report over ``records``; shadow mirrors are left out, but for the prefix cache."""
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    records = list(records)
    kept = [r for r in records if not r.get("shadow")]
    groups: dict[tuple[str, str], list[Record]] = defaultdict(list)
    for record in kept:
        groups[str(record.get("slice") or ""), arm_of(record)].append(record)
    arms = []
    for (slice_key, arm), rows in sorted(groups.items()):
        slice_rows = [r for (s, _), rs in groups.items() if s == slice_key for r in rs]
        priced = all(r.get("cost_per_hour") is not None for r in slice_rows)
        speed, cost, latency, acceptance, per_step, validity, checked = summarise(rows, z, priced)
        pools: dict[str, int] = defaultdict(int)
        for r in rows:
            pools[str(r.get("pool"))] += 1
        served_spec = sum(1 for r in rows if r.get("k") is not None)
        arms.append(
            Arm(
                slice=slice_key,
                arm=arm,
                speculative=served_spec * 2 > len(rows) or _named_speculative(rows, arm),
                pools=dict(pools),
                requests=len(rows),
                errors=sum(1 for r in rows if r.get("status") != "ok"),
                speed=speed,
                cost=cost,
                cost_unit="per token" if priced else "endpoint-s per token",
                latency=latency,
                acceptance=acceptance,
                tokens_per_step=per_step,
                validity=validity,
                checked=checked,
            )
        )
    verdicts = [
        judge(key, [a for a in arms if a.slice == key], z, min_requests)
        for key in sorted({a.slice for a in arms})
    ]
    times = [float(r["at"]) for r in kept if r.get("at") is not None]
    return Report(
        arms,
        verdicts,
        confidence,
        len(kept),
        min(times) if times else None,
        max(times) if times else None,
        cache=cache_rows(records),
    )


def _named_speculative(rows: Sequence[Record], arm: str) -> bool:
    """An experiment arm is speculative when it names a pool that has a k."""
    return any(r.get("pool") == arm and r.get("k") is not None for r in rows)


def _z(a: Estimate | None, b: Estimate | None) -> float | None:
    """How many standard errors log(a / b) lies from 0."""
    if a is None or b is None or a.se is None or b.se is None or a.value <= 0 or b.value <= 0:
        return None
    var = (a.se / a.value) ** 2 + (b.se / b.value) ** 2
    return math.log(a.value / b.value) / math.sqrt(var) if var > 0 else None


def _validity_z(a: Estimate | None, b: Estimate | None) -> float | None:
    if a is None or b is None or a.n < 10 or b.n < 10:
        return None
    pooled = (a.value * a.n + b.value * b.n) / (a.n + b.n)
    var = pooled * (1 - pooled) * (1 / a.n + 1 / b.n)
    return (a.value - b.value) / math.sqrt(var) if var > 0 else None


def judge(slice_key: str, arms: Sequence[Arm], z: float, min_requests: int) -> Verdict:
    spec = next((a for a in arms if a.speculative), None)
    base = next((a for a in arms if not a.speculative), None)
    if spec is None or base is None:
        only = "speculative" if base is None else "standard"
        spec_arm = spec.arm if spec is not None else None
        base_arm = base.arm if base is not None else None
        return Verdict(slice_key, spec_arm, base_arm, UNSURE, (f"{only} arm only",))
    names = (slice_key, spec.arm, base.arm)
    fewest = min((a.speed.n if a.speed else 0) for a in (spec, base))
    if fewest < min_requests:
        return Verdict(*names, UNSURE, (f"{fewest} measured requests in the smaller arm",))
    faster, dearer = _z(spec.speed, base.speed), _z(spec.cost, base.cost)
    valid = _validity_z(spec.validity, base.validity)
    reasons = []
    if faster is not None and faster < -z:
        reasons.append("slower")
    if dearer is not None and dearer > z:
        reasons.append("dearer per token")
    if valid is not None and valid < -z:
        reasons.append("less often valid")
    if reasons:
        return Verdict(*names, LOSES, tuple(reasons))
    gains = []
    if faster is not None and faster > z:
        gains.append("faster")
    if dearer is not None and dearer < -z:
        gains.append("cheaper per token")
    if gains:
        return Verdict(*names, WINS, tuple(gains))
    return Verdict(*names, UNSURE, ("no difference at this confidence",))
