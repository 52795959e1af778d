"""What exploring costs a replay: mirrors whole, and requests served away from their slice's
rung to learn there at what they cost there less what they would have cost at home."""

from __future__ import annotations

import pytest

from gateway.replay.pricing import cells, prices
from gateway.replay.report import summarise
from gateway.replay.run import Replay, Row
from gateway.replay.scenario import load_scenario
from policies.compiled import Ladder, load_policy

POLICY = load_policy(
    """
version: 1
pools:
  spec: {kind: speculative, model: m, num_speculative_tokens: 4, endpoints: ["http://a"]}
  standard: {kind: standard, model: m, endpoints: ["http://b"]}
ladder: [spec, standard]
rules:
  - {name: default, start: spec}
"""
)
SCENARIO = load_scenario(
    """
version: 1
name: tiny
duration_s: 10
seed: 1
traffic:
  - {name: chat, workload: chat, max_tokens: 16, clients: 1, think_s: 1}
"""
)
LADDER = Ladder("m", ("spec", "standard"), (4, None))


def row(index: int, pool: str, reason: str, *, probe: bool = False, shadow: bool = False) -> Row:
    rung = LADDER.pools.index(pool)
    return Row(
        index,
        "chat",
        0,
        "all",
        "s",
        "default",
        pool,
        rung,
        probe,
        shadow,
        float(index),
        reason,
        tokens=101,
        prompt_tokens=300,
        acceptance=0.2,
        load=2.0,
        context=500.0,
    )


def test_mirrors_and_requests_served_elsewhere_to_learn_are_exploration():
    plain = row(0, "spec", "rule default: on spec")
    mirrored = row(1, "spec", "on spec, mirrored to standard to learn its step time")
    mirror = row(2, "standard", mirrored.reason, shadow=True)
    explored = row(3, "standard", "on spec, served by standard to learn its step time")
    probed = row(4, "spec", "probe of spec after falling back (offset 1)", probe=True)
    short = row(5, "standard", "fallen back to standard, short probe of spec", probe=True)
    replay = Replay(SCENARIO, LADDER, {"spec": 1, "standard": 1}, [plain, mirrored, mirror])
    replay.rows += [explored, probed, short]
    price = prices(replay, {"spec": None, "standard": None})
    (cell,) = cells(replay, price, skip_first=0)
    expected = (
        price.of(mirror, "standard")
        + price.prefill(mirror, "standard")
        + price.of(explored, "standard")
        - price.of(explored, "spec")
        + price.of(probed, "spec")
        - price.of(probed, "standard")
    )
    assert cell.explored == pytest.approx(expected)
    assert cell.exploration == pytest.approx(expected / (cell.adaptive - expected))
    summary = summarise(replay, POLICY)
    assert summary["exploration"]["worst_cell_name"] == "chat/all"
    assert summary["exploration"]["share"] == pytest.approx(cell.exploration)


def test_a_mirror_pays_for_its_uncached_prompt():
    mirror = row(0, "standard", "on spec, mirrored to standard to learn its step time", shadow=True)
    replay = Replay(SCENARIO, LADDER, {"spec": 1, "standard": 1}, [mirror])
    price = prices(replay, {"spec": None, "standard": None})
    mirror.prompt_tokens, mirror.cached = 4000, 1000
    assert price.prefill(mirror, "standard") > 0
    cached = price.prefill(mirror, "standard")
    mirror.cached = 0
    assert price.prefill(mirror, "standard") == pytest.approx(cached * 4 / 3)
    (cell,) = cells(replay, price, skip_first=0)
    assert cell.explored == pytest.approx(price.of(mirror, "standard") + cached * 4 / 3)


def test_a_replay_that_explores_nothing_pays_nothing_for_it():
    replay = Replay(SCENARIO, LADDER, {"spec": 1, "standard": 1}, [row(0, "spec", "on spec")])
    (cell,) = cells(replay, prices(replay, {"spec": None, "standard": None}), skip_first=0)
    assert cell.explored == 0.0 and cell.exploration == 0.0
