"""Which acceptance signal each pool's outcomes actually carried, for ``/readyz`` and the
admin API: the policy says what a pool's engine can give (``policies/engines.py``), this
says what it gave. O(1) per outcome; no I/O."""

from __future__ import annotations

from gateway.measure.acceptance import Outcome, Status


class SignalsSeen:
    """Per pool: outcomes by signal, and the signal of the newest one."""

    __slots__ = ("_counts", "_last")

    def __init__(self) -> None:
        self._counts: dict[str, dict[str, int]] = {}
        self._last: dict[str, str] = {}

    def record(self, outcome: Outcome) -> None:
        if outcome.status is not Status.OK:
            return
        pool, signal = outcome.labels.pool, outcome.signal.value
        counts = self._counts.setdefault(pool, {})
        counts[signal] = counts.get(signal, 0) + 1
        self._last[pool] = signal

    def of(self, pool: str) -> dict[str, object]:
        return {"last": self._last.get(pool), "counts": dict(self._counts.get(pool, {}))}
