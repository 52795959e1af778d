"""Conversations keep their cache: endpoint choice inside a pool, compared side by side in
replay on agent traffic.

For each agent scenario (``bench/scenarios/agents-*.yaml``: Claude-Code-like sessions over
Messages with the billing line, Codex-like sessions over Responses with ``store: false``,
and a mix with chat, JSON and summaries; pools of several endpoints; a collapse or a load
surge that moves the agents' slice mid-session) and each seed, it replays the scenario once
per strategy through the gateway's own decision code (``gateway/replay/placing.py``):
``least`` (fewest in flight, the gateway before prefix affinity), ``random``, ``sticky``
(the conversation hashed over the pool, no load bound), ``prefix`` (the live gateway's:
``backends/placement.py`` and the move price), ``follow`` (``prefix`` without the move
price) and ``oracle`` (knows every endpoint's cache). The seed is the scenario's plus the
``--seeds`` offset, and it draws every conversation (turns, sizes, words), so no one can
tune to it.

One table, a row per scenario x seed x strategy:

- ``hit``: the prefix-cache hit rate over prompt tokens of the conversations' turns from
  the third on (cached tokens over prompt tokens), and its ratio to the oracle's;
- ``TTFT p50 / p90``: those turns' time to first token, and p90's ratio to the oracle's;
- ``load``: the highest endpoint's time-averaged requests in flight over its pool's mean
  (pools that carried at least one request in flight on average);
- ``GPU-s``: every request's prefill of what its endpoint did not hold cached (the cost
  model's marginal step time of those tokens) plus its decode, priced load-neutrally as
  ``speclane replay`` prices it (``gateway/replay/pricing.py``: its steps on the pool that
  served it, at the mean load the ladder carried while it ran), shadow mirrors included;
  and its ratio to the oracle's. Every strategy serves the same turns (``turns``), since
  every conversation runs to its end and the other traffic arrives open-loop from the seed.
  ``busy`` is the engine-seconds the endpoints stepped: what the GPUs did, but it also
  rewards piling requests onto fewer endpoints (bigger batches, worse latency), so the
  comparison is on ``GPU-s``;
- ``kept / moved``: cached conversations whose slice's rung changed, kept where their cache
  is or moved (``gateway/forward/moving.py``'s price).

Targets (issue 25): hit >= 0.95 x oracle, p90 <= 1.2 x oracle, load <= 1.25, GPU-s within 3%
of the oracle. A miss is printed with a ``!``.

    .venv/bin/python bench/agent_cache.py                     # every agent scenario, seed +0
    .venv/bin/python bench/agent_cache.py --seeds 3 --only agents-codex
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gateway.replay.placing import STRATEGIES, Strategy  # noqa: E402
from gateway.replay.pricing import Prices  # noqa: E402
from gateway.replay.run import Replay, replay  # noqa: E402
from gateway.replay.scenario import Scenario, load_scenario  # noqa: E402
from policies.compiled import CompiledPolicy, load_policy  # noqa: E402

SCENARIOS = ROOT / "bench" / "scenarios"
POLICY = ROOT / "bench" / "policies" / "agents.yaml"
WARM_TURN = 3  # hit rate and TTFT from this turn of each conversation on


@dataclass(frozen=True, slots=True)
class Measured:
    """One replay's figures (the module docstring)."""

    strategy: str
    turns: int
    hit: float
    ttft_p50: float
    ttft_p90: float
    load: float
    gpu_s: float
    busy_s: float
    kept: int
    moved: int


def quantile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure(result: Replay) -> Measured:
    rows = [r for r in result.rows if r.talk and not r.shadow]
    warm = [r for r in rows if r.turn >= WARM_TURN]
    prompt = sum(r.prompt_tokens for r in warm)
    ttft = [r.first - r.arrival for r in warm]
    return Measured(
        result.placement,
        len(rows),
        sum(r.cached for r in warm) / prompt if prompt else 0.0,
        quantile(ttft, 0.5),
        quantile(ttft, 0.9),
        max_load(result),
        gpu_seconds(result),
        sum(busy for busy, _ in result.usage.values()),
        result.moves.get("kept", 0),
        result.moves.get("moved", 0) + result.moves.get("unpriced", 0),
    )


def gpu_seconds(result: Replay) -> float:
    """Prefill of the uncached prompt plus load-neutral decode, over every request."""
    pools = result.ladder.pools
    k = dict(zip(pools, result.ladder.k, strict=True))
    priced = Prices(k, dict.fromkeys(pools, 1.0), result.cost)
    total = 0.0
    for row in result.rows:
        total += priced.prefill(row, row.pool) + priced.of(row, row.pool)
    return total


def max_load(result: Replay) -> float:
    """The highest endpoint's mean requests in flight over its pool's mean."""
    worst = 0.0
    span = result.end or 1.0
    for pool in result.ladder.pools:
        areas = [area for name, (_, area) in result.usage.items() if name.startswith(pool + "#")]
        mean = statistics.fmean(areas) / span if areas else 0.0
        if mean >= 1.0:
            worst = max(worst, max(areas) / span / mean)
    return worst


def run(
    policy: CompiledPolicy, scenario: Scenario, strategies: Sequence[Strategy]
) -> list[Measured]:
    return [measure(replay(policy, scenario, placement=s)) for s in strategies]


def table(name: str, seed: int, measured: list[Measured]) -> list[str]:
    oracle = next((m for m in measured if m.strategy == "oracle"), None)
    lines = []
    for m in measured:
        hit = _ratio(m.hit, oracle.hit if oracle else 0.0, at_least=0.95)
        p90 = _ratio(m.ttft_p90, oracle.ttft_p90 if oracle else 0.0, at_most=1.2)
        gpu = _ratio(m.gpu_s, oracle.gpu_s if oracle else 0.0, at_most=1.03)
        busy = _ratio(m.busy_s, oracle.busy_s if oracle else 0.0)
        load = f"{m.load:.2f}{'!' if m.load > 1.25 else ''}"
        lines.append(
            f"| {name} | {seed} | {m.strategy} | {m.turns} | {m.hit:.1%} ({hit}) | "
            f"{m.ttft_p50:.2f} / {m.ttft_p90:.2f} ({p90}) | {load} | "
            f"{m.gpu_s:,.0f} ({gpu}) | {m.busy_s:,.0f} ({busy}) | {m.kept} / {m.moved} |"
        )
    return lines


def _ratio(value: float, oracle: float, *, at_least: float = 0.0, at_most: float = 0.0) -> str:
    if oracle <= 0:
        return "-"
    r = value / oracle
    miss = (at_least and r < at_least) or (at_most and r > at_most)
    return f"{r:.2f}x{'!' if miss else ''}"


HEAD = (
    "| scenario | seed | strategy | turns | hit, turn 3+ (x oracle) | TTFT p50 / p90 s "
    "(x oracle) | max load / pool mean | GPU-s (x oracle) | busy s (x oracle) | kept / moved |\n"
    "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=1, help="seeds per scenario (default 1)")
    parser.add_argument("--seed-offset", type=int, default=0, help="first seed's offset")
    parser.add_argument("--only", action="append", default=[], help="scenario name (repeat)")
    parser.add_argument("--policy", type=Path, default=POLICY)
    parser.add_argument(
        "--strategies", default=",".join(STRATEGIES), help="comma-separated (default: all)"
    )
    args = parser.parse_args(argv)
    policy = load_policy(args.policy.read_text(), str(args.policy))
    strategies = [s for s in STRATEGIES if s in args.strategies.split(",")]
    paths = sorted(SCENARIOS.glob("agents-*.yaml"))
    scenarios = [load_scenario(p.read_bytes(), str(p)) for p in paths]
    scenarios = [s for s in scenarios if not args.only or s.name in args.only]
    print(HEAD, flush=True)
    for scenario in scenarios:
        for n in range(args.seeds):
            seeded = scenario.model_copy(update={"seed": scenario.seed + args.seed_offset + n})
            for line in table(scenario.name, seeded.seed, run(policy, seeded, strategies)):
                print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
