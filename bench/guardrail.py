"""Guardrail reaction: requests and seconds from an acceptance collapse to the fallback, from
the recovery to speculation coming back, and what the fallback cost.

Method. The real stack (``speclane sim`` x2 + ``speclane serve``, started by
``gateway.demo.stack``) serves a steady, open-loop stream of one workload (the demo's code
completion requests by default: temperature 0, max_tokens 48, ``x-speclane-endpoint:
code-assist``) at ``--rate`` requests per model second. After a warm-up longer than the
guardrail window, ``POST /sim/control`` drops the speculative pool's base acceptance for that
workload to 0.05; ``--hold`` model seconds later it restores the default. Guardrail events come
from ``GET /admin/guardrail``; each request's pool, probe flag, tokens and time per output
token come from the client. To fit real-time settings into a short run, time is scaled
(``--scale``): the sims run at ``--time-scale S``, the policy's ``window_s`` and
``cooldown_s`` are multiplied by S and the request interval too; every time reported is
divided by S again, so it reads as model (real-time) seconds.

    .venv/bin/python bench/guardrail.py                      # both settings, code workload
    .venv/bin/python bench/guardrail.py --settings default --workload json --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import httpx

from backends.sim.workload import Workload
from gateway.demo.driver import Result, Target, guardrail_events, send
from gateway.demo.policy import SPEC_POOL, STANDARD_POOL, Tuning, demo_policy
from gateway.demo.stack import Stack, StackOptions
from gateway.demo.workload import MODEL, build
from policies.model import Guardrail

_DEFAULT = Guardrail()
SETTINGS = {
    "default": Tuning(
        _DEFAULT.window_s, _DEFAULT.cooldown_s, _DEFAULT.max_cooldown_s, _DEFAULT.probe_fraction
    ),
    "demo": Tuning(),  # gateway/demo/policy.py, as for a 60 s demo
}
COLLAPSED = 0.05


@dataclass(frozen=True)
class Marks:
    """Model seconds since the start: collapse, fallback, recovery, re-enable (None: never)."""

    collapse: float
    fallback: float | None
    recover: float
    enabled: float | None


async def drive(args: argparse.Namespace, tuning: Tuning, stack: Stack) -> dict[str, Any]:
    scale: float = args.scale
    warm = tuning.window_s + 10.0
    target = Target(stack.gateway_url, stack.spec_url, stack.admin_token)
    results: list[Result] = []
    marks: dict[str, float] = {}
    async with httpx.AsyncClient(timeout=httpx.Timeout(300.0, connect=5.0)) as client:
        start = time.time()

        def now() -> float:
            return (time.time() - start) / scale

        sender = asyncio.create_task(_traffic(client, target, args, now, results))
        try:
            await _sleep_until(now, warm, scale)
            await _set(client, stack.spec_url, args.workload, COLLAPSED)
            marks["collapse"] = now()
            await _sleep_until(now, warm + args.hold, scale)
            await _set(client, stack.spec_url, args.workload, None)
            marks["recover"] = now()
            events = await _wait_enabled(client, target, now, marks, start, scale, args.patience)
        finally:
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sender
    return analyse(results, events, marks, start, scale)


async def _traffic(
    client: httpx.AsyncClient,
    target: Target,
    args: argparse.Namespace,
    now: Callable[[], float],
    results: list[Result],
) -> None:
    rng = random.Random(args.seed)
    tasks: set[asyncio.Task[None]] = set()

    async def one(index: int) -> None:
        request = build(Workload(args.workload), index, rng)
        results.append(await send(client, target.gateway, request, now))

    try:
        for index in range(10**9):
            await _sleep_until(now, index / args.rate, args.scale)
            task = asyncio.create_task(one(index))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _sleep_until(now: Callable[[], float], model_s: float, scale: float) -> None:
    await asyncio.sleep(max(model_s - now(), 0.0) * scale)


async def _set(client: httpx.AsyncClient, sim: str, workload: str, value: float | None) -> None:
    response = await client.post(sim + "/sim/control", json={"acceptance": {workload: value}})
    response.raise_for_status()


async def _wait_enabled(
    client: httpx.AsyncClient,
    target: Target,
    now: Callable[[], float],
    marks: dict[str, float],
    start: float,
    scale: float,
    patience: float,
) -> list[dict[str, Any]]:
    while True:
        events = await guardrail_events(client, target)
        back = [e for e in events if _at(e, start, scale) > marks["recover"] and _is_on(e)]
        if back or now() > marks["recover"] + patience:
            await asyncio.sleep(2.0 * scale)  # let in-flight requests finish and be counted
            return events
        await asyncio.sleep(0.2)


def _at(event: dict[str, Any], start: float, scale: float) -> float:
    return (float(event["at"]) - start) / scale


def _is_on(event: dict[str, Any]) -> bool:
    return bool(event["to"]["phase"] == "on" and event["to"]["offset"] == 0)


def _tpot(results: list[Result]) -> float | None:
    values = [r.tpot_s for r in results if r.tpot_s is not None]
    return statistics.fmean(values) if values else None


def analyse(
    results: list[Result],
    events: list[dict[str, Any]],
    marks: dict[str, float],
    start: float,
    scale: float,
) -> dict[str, Any]:
    """Turn the request log and the guardrail events into the reaction numbers (model s)."""
    c, r = marks["collapse"], marks["recover"]
    falls = [_at(e, start, scale) for e in events if e["to"]["phase"] == "fallen_back"]
    fall = next((t for t in falls if t > c), None)
    on = [_at(e, start, scale) for e in events if _is_on(e)]
    enabled = next((t for t in on if t > r), None)
    m = Marks(c, fall, r, enabled)
    ok = [replace(x, tpot_s=x.tpot_s / scale) if x.tpot_s else x for x in results if x.ok]
    healthy_spec = _tpot([x for x in ok if x.pool == SPEC_POOL and x.at < c])
    fallen_std = _tpot([x for x in ok if x.pool == STANDARD_POOL and c < x.at < r])
    end_fall = fall if fall is not None else r
    collapsed = [x for x in ok if x.pool == SPEC_POOL and c <= x.at < end_fall]
    probes = [x for x in ok if x.pool == SPEC_POOL and end_fall <= x.at < r]
    end_on = enabled if enabled is not None else max((x.at for x in ok), default=r)
    missed = [x for x in ok if x.pool == STANDARD_POOL and r <= x.at < end_on]
    return {
        "marks": asdict(m),
        "requests": len(results),
        "errors": len(results) - len(ok),
        "collapse_to_fallback": {
            "seconds": None if fall is None else fall - c,
            "requests": len(collapsed),
            "tokens_on_collapsed_spec": sum(x.completion_tokens for x in collapsed),
            "extra_decode_s": _extra(collapsed, fallen_std),
        },
        "probes_while_collapsed": {
            "requests": len(probes),
            "tokens": sum(x.completion_tokens for x in probes),
            "extra_decode_s": _extra(probes, fallen_std),
        },
        "recovery_to_enabled": {
            "seconds": None if enabled is None else enabled - r,
            "requests": len([x for x in results if r <= x.at < end_on]),
            "on_standard": len(missed),
            "missed_speedup_s": _extra(missed, healthy_spec),
        },
        "tpot_ms": {
            "spec_healthy": _ms(healthy_spec),
            "spec_collapsed": _ms(_tpot(collapsed)),
            "standard_while_fallen_back": _ms(fallen_std),
        },
        "events": [
            f"{_at(e, start, scale):7.1f} s  {e['from']['phase']} -> {e['to']['phase']}: "
            f"{e['reason']}"
            for e in events
        ],
    }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


def _extra(served: list[Result], reference: float | None) -> float | None:
    """Decode seconds these requests took beyond what ``reference`` TPOT would have taken."""
    if reference is None:
        return None
    extra = sum(
        (x.completion_tokens - 1) * (x.tpot_s - reference)
        for x in served
        if x.tpot_s is not None and x.completion_tokens > 1
    )
    return round(extra, 2)


def run_one(args: argparse.Namespace, name: str) -> dict[str, Any]:
    tuning = SETTINGS[name]
    scaled = tuning.scaled(args.scale)
    with tempfile.TemporaryDirectory(prefix="speclane-bench-") as tmp:
        stack = Stack(
            Path(tmp),
            StackOptions(
                policy=lambda spec, std: demo_policy(spec, std, scaled, MODEL),
                seed=args.seed,
                time_scale=args.scale,
            ),
        )
        try:
            stack.start()
            out = asyncio.run(drive(args, tuning, stack))
        finally:
            stack.stop()
    out["settings"] = {"name": name, **asdict(tuning)}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--settings", choices=[*SETTINGS, "both"], default="both")
    parser.add_argument("--workload", choices=["code", "json", "tools"], default="code")
    parser.add_argument("--rate", type=float, default=2.0, help="requests per model second")
    parser.add_argument("--scale", type=float, default=0.1, help="sim time scale")
    parser.add_argument("--hold", type=float, default=90.0, help="model s the collapse lasts")
    parser.add_argument("--patience", type=float, default=900.0, help="model s to wait after")
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    names = list(SETTINGS) if args.settings == "both" else [args.settings]
    runs = []
    for name in names:
        out = run_one(args, name)
        out["traffic"] = {k: getattr(args, k) for k in ("workload", "rate", "scale", "hold")}
        print(json.dumps(out, indent=2))
        runs.append(out)
    if args.json:
        args.json.write_text(json.dumps(runs, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
