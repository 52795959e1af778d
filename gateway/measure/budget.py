"""A token bucket with the clock passed in: the shadow mirrors' tokens-per-minute budget.

Written here because the rate-limiting libraries we looked at either wait for capacity
(a mirror must be dropped, never queued) or read the event loop's clock themselves.
"""

from __future__ import annotations


class TokenBucket:
    """Holds up to ``per_minute`` tokens, refilled continuously; ``take`` never waits."""

    __slots__ = ("_level", "_rate", "_stamp", "capacity")

    def __init__(self, per_minute: float, now: float) -> None:
        self.capacity = per_minute
        self._rate = per_minute / 60.0
        self._level = per_minute
        self._stamp = now

    def take(self, amount: float, now: float) -> bool:
        self._level = min(self.capacity, self._level + (now - self._stamp) * self._rate)
        self._stamp = now
        if amount > self._level:
            return False
        self._level -= amount
        return True
