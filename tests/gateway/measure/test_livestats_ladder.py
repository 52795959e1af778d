"""The economic guardrail on a three-rung ladder [k7, k3, standard], driven through
``LiveStats`` with injected time: a collapse on every speculative rung reaches standard
without stalling on k3, and after the healing the slice climbs back without falling again
on evidence from before the healing."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from gateway.measure.acceptance import Labels, Outcome, Signal, Status
from gateway.measure.livestats import LiveStats
from policies.compiled import load_policy
from policies.guardrail import ON_START, Phase, SliceState
from policies.speedup import expected_tokens_per_step

POLICY = load_policy(
    """
version: 1
pools:
  k7: {kind: speculative, model: m, num_speculative_tokens: 7, endpoints: ["http://a"]}
  k3: {kind: speculative, model: m, num_speculative_tokens: 3, endpoints: ["http://b"]}
  standard: {kind: standard, model: m, endpoints: ["http://c"]}
ladder: [k7, k3, standard]
rules:
  - {name: json, match: {response_format: [json_object]}, start: k7}
  - {name: default, start: standard}
"""
)

# CPU-bound: one worker runs these one after another, at a lower priority, with time to
# spare (docs/development.md, "Tests in parallel")
pytestmark = [pytest.mark.xdist_group("cpu"), pytest.mark.timeout(600)]
LADDER = ("k7", "k3", "standard")
K = {"k7": 7, "k3": 3, "standard": None}
STEP_S = {"k7": 0.045, "k3": 0.035, "standard": 0.025}  # at batch 1; +3% per sequence
JSON = "json / slice"
CHAT = "chat / slice"
TOKENS = 129


def outcome(key: str, pool: str, a: float, epoch: int, load: float, probe: bool) -> Outcome:
    """A request of 128 decode tokens at per-token acceptance ``a`` on ``pool``, with the
    step time of an affine engine at ``load``."""
    k = K[pool]
    per_step = 1.0 if k is None else expected_tokens_per_step(a, k)
    steps = max(1, round((TOKENS - 1) / per_step))
    step_s = STEP_S[pool] * (1 + 0.03 * (k or 0) * load)
    labels = Labels("m", "json" if key == JSON else "default", key, pool, k, epoch=epoch)
    labels = Labels(
        labels.model, labels.rule, key, pool, k, epoch=epoch, probe=probe, chunk_signal=True
    )
    drafted = (k or 0) * steps
    accepted = TOKENS - 1 - steps if k else 0
    return Outcome(
        labels,
        Status.OK,
        0.0,
        steps * step_s + 0.05,
        0.05,
        step_s,
        200,
        TOKENS,
        steps + 1,
        Signal.PER_REQUEST if k else Signal.NONE,
        drafted=drafted,
        accepted=accepted,
        steps=steps,
        decode_s=steps * step_s,
        load=load,
    )


def run(acceptance: Callable[[float], float], until: float, *, explore: bool) -> LiveStats:
    """One JSON request a second (starting on k7, probes as the state says; with
    ``explore`` every tenth one rung down), one chat request a second on standard and one
    on k3, loads cycling 1-3 so that every pool's line is fitted."""
    stats = LiveStats(lambda: POLICY, load=lambda model, now: 2.0)
    t, owed, n = 0.0, 0.0, 0
    while t < until:
        load = 1.0 + n % 3
        state = stats.guards.get(JSON, ON_START)
        serving = min(state.offset, 2)
        pool, probe = LADDER[serving], False
        if state.phase is Phase.PROBING:
            owed += state.probe_share
            if owed >= 1.0:
                owed -= 1.0
                pool, probe = LADDER[serving - 1], True
        elif explore and n % 10 == 5 and serving + 1 < 3:
            pool = LADDER[serving + 1]
        stats.record(outcome(JSON, pool, acceptance(t), state.version, load, probe), t + 0.5)
        stats.record(outcome(CHAT, "standard", 0.0, 0, load, False), t + 0.6)
        stats.record(outcome(CHAT, "k3", 0.6, 0, load, False), t + 0.7)
        stats.tick(t + 0.9)
        t, n = t + 1.0, n + 1
    return stats


def falls(stats: LiveStats) -> list[tuple[float, int, int]]:
    return [(e.at, e.before.offset, e.after.offset) for e in stats.events if e.slice == JSON]


def test_a_collapse_on_every_speculative_rung_reaches_standard_at_once():
    # healthy until 120 s, then every speculative rung drafts in vain
    stats = run(lambda t: 0.92 if t < 120 else 0.02, until=160, explore=False)
    moves = falls(stats)
    assert moves, "the slice never left k7"
    at, before, after = moves[0]
    # k3, judged by k7's newest requests carried over to k=3, is barely cheaper than a
    # collapsed k7 and standard much cheaper: the slice goes straight to standard rather
    # than to k3 on the acceptance of k7's whole window (healthy but for the newest)
    assert (before, after) == (0, 2), stats.events[0].reason
    assert at < 120 + 10
    assert "standard" in stats.events[0].reason


def test_a_slice_on_a_rung_it_never_ran_on_is_judged_by_carried_over_acceptance():
    # only k7 and standard ever served the slice; after the fall to k3 (k3's own step time
    # is learned from nothing but the prior), k3's tokens per step are carried over from k7
    stats = LiveStats(lambda: POLICY, load=lambda model, now: 2.0)
    for i in range(30):
        load = 1.0 + i % 3
        stats.record(outcome(JSON, "k7", 0.92, 0, load, False), float(i))
        stats.record(outcome(CHAT, "standard", 0.0, 0, load, False), i + 0.5)
        stats.record(outcome(CHAT, "k3", 0.6, 0, load, False), i + 0.6)
    entry = stats.slices.records[JSON]
    entry.state = SliceState(offset=1, phase=Phase.FALLEN_BACK)  # served on k3
    placement = POLICY.placement("json", "m")
    assert placement is not None and placement.pool(entry.state.offset) == "k3"
    seen = stats.judge.seen(entry, placement, 30.0)
    near = seen.near
    assert near is not None and "carried over" in near.reason
    assert near.numbers["tokens_per_step"] > 3.0  # k3 at a = 0.92, not one token a step


@pytest.mark.long(7)
def test_after_the_healing_the_slice_climbs_back_and_does_not_fall_on_old_probes():
    def acceptance(t: float) -> float:
        return 0.92 if t < 120 or t >= 600 else 0.02

    stats = run(acceptance, until=1200, explore=True)
    moves = falls(stats)
    down = [m for m in moves if m[2] > m[1]]
    up = [m for m in moves if m[2] < m[1]]
    assert down and down[0][0] < 130
    # every fall after the healing is a false one
    assert [m for m in down if m[0] >= 600] == [], [e.reason for e in stats.events]
    # and it is back on k7 in bounded time
    assert up and up[-1][2] == 0 and up[-1][0] < 600 + 300, [e.reason for e in stats.events]
    assert stats.guards.get(JSON, ON_START).offset == 0
