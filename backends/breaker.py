"""A per-endpoint circuit breaker. Pure state, clock passed in.

    closed --(failure_threshold failures in a row)--> open
    open --(reset_s passed)--> half-open: one trial request at a time
    half-open --(trial succeeds)--> closed;  --(trial fails)--> open again

Written here rather than taken from a library because the ones we found read the wall clock
themselves, which makes them untestable without sleeping or patching.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(slots=True)
class Breaker:
    failure_threshold: int = 3
    reset_s: float = 5.0
    failures: int = 0
    opened_at: float | None = None
    trial_running: bool = False

    def state(self, now: float) -> BreakerState:
        if self.opened_at is None:
            return BreakerState.CLOSED
        if now - self.opened_at >= self.reset_s:
            return BreakerState.HALF_OPEN
        return BreakerState.OPEN

    def allows(self, now: float) -> bool:
        state = self.state(now)
        if state is BreakerState.CLOSED:
            return True
        return state is BreakerState.HALF_OPEN and not self.trial_running

    def begin(self, now: float) -> None:
        if self.state(now) is BreakerState.HALF_OPEN:
            self.trial_running = True

    def success(self) -> None:
        self.failures = 0
        self.opened_at = None
        self.trial_running = False

    def abandon(self) -> None:
        self.trial_running = False

    def failure(self, now: float) -> None:
        self.failures += 1
        self.trial_running = False
        if self.opened_at is not None or self.failures >= self.failure_threshold:
            self.opened_at = now
