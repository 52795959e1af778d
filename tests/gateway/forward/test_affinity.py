"""A request's affinity, as the gateway and the replay build it: the endpoints that hold its
conversation (beyond the opening), the prompt tokens a block stands for, and the pools'
prices, asked only when some endpoint holds the conversation; the prices as the live
statistics give them."""

from __future__ import annotations

import dataclasses

from backends.placement import Costs
from gateway.forward.affinity import affinity_of, prices, unplaced
from gateway.measure.livestats import LiveStats
from policies.features import Features, PromptHashes
from tests.gateway.measure.test_livestats import KEY, POLICY, outcome

# 120 blocks of 256 bytes, the opening 2,000 bytes (7 whole blocks): ~7k tokens
FEATURES = Features(
    endpoint="/v1/chat/completions",
    model="m",
    prompt_tokens=7_000,
    prompt=PromptHashes(chain=tuple(range(120)), opening=(2_000 << 32) | 5, size=30_720, turn=8),
)
COSTS = {"spec": Costs(1e-5, lambda n: 0.02 + 0.001 * n, 30.0)}


class Asked:
    def __init__(self) -> None:
        self.times = 0

    def __call__(self) -> dict[str, Costs]:
        self.times += 1
        return COSTS


def test_the_holders_are_the_endpoints_sent_more_than_the_opening_or_the_opening_itself():
    asked = Asked()
    held = {"a": 7, "b": 100}  # a holds the system prompt only
    known = affinity_of(FEATURES, held, "c", 0.25, asked)
    assert known.holders == frozenset({"b", "c"}) and known.held == held
    assert known.costs == COSTS and asked.times == 1
    assert abs(known.block_tokens - 7_000 * 256 / 30_720) < 1e-9


def test_nothing_held_asks_no_prices():
    asked = Asked()
    known = affinity_of(FEATURES, {"a": 7}, None, 0.25, asked)
    assert known.holders == frozenset() and known.costs == {} and asked.times == 0


def test_a_prompt_under_one_block_is_placed_by_its_opening_alone():
    short = dataclasses.replace(FEATURES, prompt=PromptHashes(opening=9, size=100))
    assert unplaced(short, 0.5) is not None and unplaced(short, 0.5).opening == 9
    assert unplaced(FEATURES, 0.5) is None


def test_the_live_statistics_price_each_pool_they_have_step_times_for():
    stats = LiveStats(lambda: POLICY)
    assert prices(stats.views, None, KEY, 0.0)() == {}  # no turns learned yet
    assert prices(stats.views, 60.0, KEY, 0.0)() == {}  # no step times yet
    for i in range(30):
        for pool, load in (("spec", 1 + i % 4), ("standard", 1 + i % 3)):
            seen = outcome(0.9, pool=pool)
            seen = dataclasses.replace(
                seen, steps=10, decode_s=0.3 + 0.01 * load, load=float(load), prefill=20.0 * i
            )
            stats.record(seen, 100.0 + i / 2)
    costs = prices(stats.views, 60.0, KEY, 116.0)()
    assert set(costs) == {"spec", "standard"}
    assert costs["standard"].steps == 60.0  # a token a step
    assert costs["spec"].steps < 60.0  # speculation gives more than one
    for pool in costs.values():
        assert pool.prefill_s > 0 and pool.step_s(4) > pool.step_s(1) > 0
