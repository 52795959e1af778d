"""Exploration's budget: per pool, split over the slices above it, only while needed."""

from __future__ import annotations

import pytest

from gateway.measure.steptimes import EXPLORE_PER_MINUTE, NEED_FRESH_S, StepTimes

BUDGET = EXPLORE_PER_MINUTE / 60.0


def test_nothing_is_explored_until_some_judgement_hinges_on_the_pool():
    steps = StepTimes()
    assert steps.explore_share("standard", "busy", 10.0, False, 0.05, 0.0) == 0.0
    # a quiet slice needs the pool: the busy slice above it gives most of the observations
    quiet = steps.explore_share("standard", "quiet", 0.05, True, 0.05, 1.0)
    busy = steps.explore_share("standard", "busy", 10.0, False, 0.05, 2.0)
    assert busy == pytest.approx(BUDGET / 10.05, abs=0.001)
    assert quiet == pytest.approx(busy, abs=0.001)  # one share for all, the pool's budget
    # the cap: never more than the slice's own probe_fraction
    alone = StepTimes()
    assert alone.explore_share("standard", "quiet", 0.05, True, 0.05, 0.0) == 0.05
    # the need lapses when no slice has said so for NEED_FRESH_S
    assert steps.explore_share("standard", "busy", 10.0, False, 0.05, 3.0 + NEED_FRESH_S) == 0.0
