"""Running sums of observations that decay with a half-life: what the step-time fits
(``policies/steptime.py``, ``policies/stepcurve.py``) keep of a pool's observations. Pure;
time is an argument.

The sums are scaled when an observation arrives (``_decay``, O(size of the sums)), and at
the time of a question by ``_factor`` without being changed: a pool that stopped being fed
loses weight as time passes."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Decaying:
    """``w``: the plain (decayed) count of the observations, as of ``at``. A subclass scales
    its own sums in ``_scale``."""

    half_life_s: float = 300.0
    at: float = 0.0
    w: float = 0.0

    def _decay(self, now: float) -> None:
        """Bring every sum to ``now`` (before an observation at ``now`` is added)."""
        if now > self.at:
            f = self._factor(now)
            self.w *= f
            self._scale(f)
            self.at = now

    def _scale(self, f: float) -> None:
        """Multiply the subclass's sums by ``f``."""

    def _factor(self, now: float) -> float:
        return 0.5 ** (max(now - self.at, 0.0) / self.half_life_s) if self.w else 1.0

    def weight(self, now: float) -> float:
        """The observations' weight at ``now`` (decayed, also without new observations)."""
        return self.w * self._factor(now)
