"""The correctness canary (step 7's side): at temperature 0 speculative decoding must not
change the output. When a client's request was greedy and a shadow mirror
(``gateway/forward/shadow.py``) went to speculation, the mirror's text is compared with the
text the client got; the exact-match rate per slice is kept, and a slice whose mismatches
pass the threshold raises an alarm once (``Feedback.canary_failed``: a guardrail event),
again only after it has recovered below it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass

from gateway.measure.telemetry import Telemetry

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class CanaryLimits:
    """Alarm when greedy mismatches exceed ``max_mismatch`` over ``min_samples`` compared."""

    max_mismatch: float = 0.1
    min_samples: int = 20


@dataclass(slots=True)
class CanaryCounts:
    compared: int = 0
    matched: int = 0
    alarmed: bool = False

    @property
    def rate(self) -> float | None:
        return self.matched / self.compared if self.compared else None


class Canary:
    """Greedy answers compared with their speculative mirrors, per slice."""

    def __init__(
        self,
        telemetry: Telemetry,
        limits: CanaryLimits = CanaryLimits(),
        alarm: Callable[[str, CanaryCounts], None] | None = None,
    ) -> None:
        self._telemetry = telemetry
        self._limits = limits
        self._alarm = alarm
        self.counts: dict[str, CanaryCounts] = {}

    async def compare(
        self, slice_key: str, mirrored: str, primary: asyncio.Future[str], timeout_s: float
    ) -> None:
        """Compare once the client's answer is there (within ``timeout_s``); an answer that
        failed or never came is not compared."""
        try:
            expected = await asyncio.wait_for(asyncio.shield(primary), timeout_s)
        except (TimeoutError, asyncio.CancelledError):
            return
        counts = self.counts.setdefault(slice_key, CanaryCounts())
        counts.compared += 1
        counts.matched += mirrored == expected
        result = "match" if mirrored == expected else "mismatch"
        self._telemetry.mirror("canary", result)
        if mirrored != expected:
            log.warning("canary: greedy output differs on speculation for slice %s", slice_key)
        failing = (
            counts.compared >= self._limits.min_samples
            and 1 - counts.matched / counts.compared > self._limits.max_mismatch
        )
        if failing and not counts.alarmed and self._alarm is not None:
            self._alarm(slice_key, counts)
        counts.alarmed = failing
