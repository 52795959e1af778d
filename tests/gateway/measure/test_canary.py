"""The correctness canary: greedy texts compared per slice, one alarm when mismatches pass
the threshold, and none for answers that never came."""

from __future__ import annotations

import asyncio

import pytest

from gateway.measure.canary import Canary, CanaryCounts, CanaryLimits
from gateway.measure.telemetry import Telemetry

pytestmark = pytest.mark.anyio


def _answered(text: str) -> asyncio.Future[str]:
    future = asyncio.get_running_loop().create_future()
    future.set_result(text)
    return future


async def test_mismatches_past_the_threshold_raise_one_alarm_until_the_slice_recovers():
    alarms: list[tuple[str, int]] = []
    canary = Canary(
        Telemetry.build(),
        CanaryLimits(max_mismatch=0.2, min_samples=4),
        lambda key, counts: alarms.append((key, counts.compared)),
    )
    for mirrored in ("a", "b", "b", "b", "b"):
        await canary.compare("s", mirrored, _answered("a"), 1.0)
    assert alarms == [("s", 4)]  # once, at the fourth comparison, not again at the fifth
    for _ in range(20):
        await canary.compare("s", "a", _answered("a"), 1.0)
    assert not canary.counts["s"].alarmed
    assert canary.counts["s"].rate == pytest.approx(21 / 25)


async def test_an_answer_that_failed_or_never_came_is_not_compared():
    canary = Canary(Telemetry.build(), CanaryLimits(min_samples=1))
    failed = asyncio.get_running_loop().create_future()
    failed.cancel()
    await canary.compare("s", "a", failed, 1.0)
    await canary.compare("s", "a", asyncio.get_running_loop().create_future(), 0.01)
    assert canary.counts == {}
    assert CanaryCounts().rate is None
