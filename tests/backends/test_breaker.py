"""The circuit breaker with a fake clock."""

from __future__ import annotations

from backends.breaker import Breaker, BreakerState


def test_opens_after_threshold_then_half_opens_one_trial():
    b = Breaker(failure_threshold=3, reset_s=5)
    for t in range(2):
        b.failure(float(t))
    assert b.allows(2.0)
    b.failure(2.0)
    assert b.state(2.0) is BreakerState.OPEN and not b.allows(6.9)
    assert b.state(7.0) is BreakerState.HALF_OPEN and b.allows(7.0)
    b.begin(7.0)
    assert not b.allows(7.1)  # one trial at a time
    b.failure(7.2)
    assert b.state(7.3) is BreakerState.OPEN and b.state(12.3) is BreakerState.HALF_OPEN
    b.begin(12.3)
    b.success()
    assert b.state(12.4) is BreakerState.CLOSED and b.failures == 0


def test_success_resets_the_count_and_abandon_frees_the_trial():
    b = Breaker(failure_threshold=2, reset_s=1)
    b.failure(0.0)
    b.success()
    b.failure(0.1)
    assert b.state(0.2) is BreakerState.CLOSED
    b.failure(0.2)
    b.begin(1.3)
    b.abandon()
    assert b.allows(1.3)
