"""Prefill in the price where the engines keep a prefix cache (``gateway/replay/pinned.py``,
``pricing.py``): what each pool would have held comes from the same conversations replayed
pinned to it."""

from __future__ import annotations

from pathlib import Path

import pytest

from backends.sim.model import CostModel
from gateway.replay.pinned import held, pinned_policy
from gateway.replay.pricing import cells, prices
from gateway.replay.report import summarise
from gateway.replay.run import replay
from gateway.replay.scenario import load_scenario
from policies.compiled import load_policy

BENCH = Path(__file__).parents[3] / "bench"
POLICY = load_policy((BENCH / "policies" / "baseline.yaml").read_text())
LADDER = ["spec", "standard"]

# the draft stops agreeing at once: the adaptive gateway moves the agents' slice
SESSIONS = """
version: 1
name: pinned
duration_s: 240
seed: 5
prefix_caching: true
kv_cache_tokens: 40000
traffic:
  - name: agent
    api: responses
    workload: tools
    max_tokens: 32
    tools: [{name: shell}]
    clients: 3
    think_s: 0.5
    session: {min_turns: 4, max_turns: 6, first_tokens: 4000, last_tokens: 20000,
              system_tokens: 300, sessions: 2}
acceptance:
  - step: {at_s: 0, workload: tools, base: 0.05}
"""
SCENARIO = load_scenario(SESSIONS)


@pytest.mark.parametrize("pool", LADDER)
def test_a_pinned_policy_serves_everything_on_its_pool_and_never_moves_it(pool):
    done = replay(pinned_policy(POLICY, pool, LADDER), SCENARIO, cost=CostModel())
    assert {r.pool for r in done.rows} == {pool}
    assert not any(r.shadow or r.probe for r in done.rows)
    assert done.events == []
    assert done.endpoints[pool] == 2  # the whole ladder's endpoints: load-neutral


def test_held_is_what_each_turn_prefilled_with_every_turn_on_one_pool():
    on_pool = held(POLICY, SCENARIO, CostModel(), "pool")
    on_ladder = held(POLICY, SCENARIO, CostModel(), "ladder")
    assert set(on_pool) == set(on_ladder) == set(LADDER)
    done = replay(pinned_policy(POLICY, "standard", LADDER), SCENARIO, cost=CostModel())
    rows = {(r.talk, r.turn): r for r in done.rows}
    assert on_ladder["standard"] == {t: r.prompt_tokens - r.cached for t, r in rows.items()}
    later = [r for (_, turn), r in rows.items() if turn > 1]
    assert len(later) >= 6
    # a later turn finds its history cached
    assert sum(r.cached for r in later) > 0.6 * sum(r.prompt_tokens for r in later)
    # twice the memory: conversations one endpoint could not hold stay cached
    assert sum(on_ladder["standard"].values()) < sum(on_pool["standard"].values())


def test_no_prefix_cache_or_no_conversations_hold_nothing():
    uncached = SCENARIO.model_copy(update={"prefix_caching": False})
    assert held(POLICY, uncached, CostModel(), "pool") == {}
    chat = load_scenario((BENCH / "scenarios" / "steady-mix.yaml").read_text())
    assert held(POLICY, chat, CostModel(), "pool") == {}


def test_held_puts_every_requests_prefill_in_every_price():
    done = replay(POLICY, SCENARIO, cost=CostModel())
    price = prices(done, {})
    on = held(POLICY, SCENARIO, CostModel(), "ladder")
    without, with_ = cells(done, price, 0), cells(done, price, 0, on)
    served = [r for r in done.rows if not r.shadow]
    added = sum(price.prefill(r, r.pool) for r in served)
    assert added > 0
    assert sum(c.adaptive for c in with_) == pytest.approx(sum(c.adaptive for c in without) + added)
    for pool in LADDER:
        extra = sum(price.prefill_of(on[pool][(r.talk, r.turn)], pool) for r in served)
        got = sum(c.pools[pool] for c in with_) - sum(c.pools[pool] for c in without)
        assert got == pytest.approx(extra)
    summary = summarise(done, POLICY, on)
    assert summary["cost"]["adaptive"] == pytest.approx(sum(c.adaptive for c in with_))
