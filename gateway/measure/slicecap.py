"""Bounded slice labels for metrics. Slices are bounded (rules x bands x tool-schema
buckets) but can still run to thousands, and every label value is a series in every
replica's /metrics: the first ``cap`` slices seen keep their key as their label, and every
later one is folded into ``other``, like the OpenTelemetry SDK's cardinality limit. Tenants
and users never become labels. No I/O.
"""

from __future__ import annotations

OTHER = "other"


class SliceLabels:
    """A slice key -> its metric label; at most ``cap`` distinct labels besides ``other``."""

    __slots__ = ("_cap", "_known")

    def __init__(self, cap: int) -> None:
        self._cap = cap
        self._known: dict[str, str] = {}

    def __call__(self, key: str) -> str:
        label = self._known.get(key)
        if label is None:
            if len(self._known) >= self._cap:
                return OTHER
            label = self._known[key] = key
        return label

    def labelled(self, key: str) -> bool:
        """Whether ``key`` has its own label (per-slice gauges skip the folded ones)."""
        return key in self._known
