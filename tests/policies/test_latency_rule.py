"""The guardrail's latency rule: a slice leaves a speculative rung before its median time
to first token there reaches ``ttft_ratio`` times the rung below's, or when it breaks the
policy's ``ttft_p50_s`` goal; with no goal only where the judge is not sure the serving rung
is the cheaper, and under a goal it does not climb back while the rung above would break it.
Pure: injected numbers, time as an argument."""

from __future__ import annotations

import pytest

from policies.economics import Judgement
from policies.guardrail import (
    MIN_EXCESS_S,
    ON_START,
    Economics,
    Latency,
    Phase,
    SliceState,
    latency_breach,
    step_economic,
)
from policies.model import Guardrail

CONFIG = Guardrail()
CHEAPER_ABOVE = Judgement(1, 0.7, -5.0, 40, "spec costs 0.70x standard")


@pytest.mark.parametrize(
    ("upper", "lower", "leaves"),
    [
        (12.0, 9.8, False),  # 1.22x: still short of 1.3x
        (13.0, 9.8, True),  # 1.33x: leaves before 1.5x
        (19.2, 9.8, True),  # llm-d's EAGLE-3 at 8 QPS: long gone
        (0.24, 0.13, False),  # 1.8x, but 0.11 s: two loads, not a queue
        (0.9, 0.3, True),  # 3x and 0.6 s
    ],
)
def test_without_a_goal_a_slice_leaves_before_its_ttft_reaches_one_and_a_half_times(
    upper: float, lower: float, leaves: bool
) -> None:
    assert (latency_breach(Latency(upper, lower, 8), CONFIG) is not None) is leaves
    seen = Economics(latency=Latency(upper, lower, 8))
    after, event = step_economic("chat", ON_START, seen, CONFIG, 100.0)
    assert (after.offset == 1 and after.phase is Phase.FALLEN_BACK) is leaves
    assert (event is not None and event.reason.startswith("slow first token")) is leaves


def test_a_goal_replaces_the_ratio() -> None:
    strict = Guardrail(ttft_p50_s=2.0)
    assert latency_breach(Latency(2.5, 1.5, 5), strict) is not None  # 1.67x and above 2 s
    assert latency_breach(Latency(1.9, 0.6, 5), strict) is None  # 3x, but within the goal
    assert latency_breach(Latency(2.5, 3.0, 5), strict) is None  # the rung below is slower
    assert latency_breach(Latency(1.1, 0.9, 5), Guardrail(ttft_ratio=1.2)) is None
    assert latency_breach(Latency(1.8, 1.0, 5), Guardrail(ttft_ratio=1.2)) is not None
    assert MIN_EXCESS_S > 0


def test_under_a_goal_no_climb_while_the_rung_above_is_slow_and_a_climb_once_it_is_not() -> None:
    goal = Guardrail(ttft_p50_s=10.0)
    fallen = SliceState(1, Phase.FALLEN_BACK, 0.0, 1)
    slow_above = Economics(above=CHEAPER_ABOVE, latency_above=Latency(13.0, 9.0, 6))
    after, event = step_economic("chat", fallen, slow_above, goal, 100.0)
    assert after.offset == 1 and (event is None or "cheaper above" not in event.reason)
    fine = Economics(above=CHEAPER_ABOVE, latency_above=Latency(9.5, 9.0, 6))
    after, event = step_economic("chat", fallen, fine, goal, 100.0)
    assert after.offset == 0 and event is not None and "cheaper above" in event.reason


SURELY_CHEAPER = Judgement(1, 0.5, -6.0, 40, "spec costs 0.50x standard")
UNSURE = Judgement(0, 0.9, -1.0, 40, "spec costs 0.90x standard")


@pytest.mark.parametrize(
    ("below", "goal", "leaves"),
    [
        (SURELY_CHEAPER, None, False),  # an idle pool below says nothing of it carrying the slice
        (UNSURE, None, True),  # where the gain fades, the queue decides
        (None, None, True),  # nothing judged yet
        (SURELY_CHEAPER, 2.0, True),  # the operator's goal holds whatever the cost
    ],
)
def test_without_a_goal_the_rule_moves_a_slice_only_where_cost_is_unsure(
    below: Judgement | None, goal: float | None, leaves: bool
) -> None:
    config = Guardrail(ttft_p50_s=goal)
    seen = Economics(below=below, latency=Latency(2.4, 0.3, 8))  # 8x, and 2.1 s
    after, event = step_economic("chat", ON_START, seen, config, 100.0)
    assert (after.offset == 1 and event is not None and "slow first token" in event.reason) is (
        leaves
    )


def test_without_a_goal_a_climb_is_made_on_cost_alone() -> None:
    fallen = SliceState(1, Phase.FALLEN_BACK, 0.0, 1)
    slow_above = Economics(above=CHEAPER_ABOVE, latency_above=Latency(13.0, 9.0, 6))
    after, event = step_economic("chat", fallen, slow_above, CONFIG, 100.0)
    assert after.offset == 0 and event is not None and "cheaper above" in event.reason
