"""Slice keys: a rule's name plus banded features, the unit live statistics are kept by. Pure.

Requests that offer tools also carry a bucket of their tool-schema fingerprint (a hash of
the tool names and definitions): ``tools:NN``, at most ``tool_schemas`` buckets, so the
number of slices stays bounded however many schemas clients invent.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import dataclass

from policies.features import Features


def _short(value: float) -> str:
    if value >= 1000 and value % 1000 == 0:
        return f"{int(value // 1000)}k"
    return f"{value:g}"


def _temperature_labels(edges: Sequence[float]) -> tuple[str, ...]:
    if not edges:
        return ("t*",)
    labels = [f"t<={_short(edges[0])}"]
    labels += [f"t{_short(lo)}-{_short(hi)}" for lo, hi in zip(edges, edges[1:], strict=False)]
    return (*labels, f"t>{_short(edges[-1])}")


def _context_labels(edges: Sequence[int]) -> tuple[str, ...]:
    if not edges:
        return ("ctx*",)
    labels = [f"ctx<{_short(edges[0])}"]
    labels += [f"ctx{_short(lo)}-{_short(hi)}" for lo, hi in zip(edges, edges[1:], strict=False)]
    return (*labels, f"ctx>={_short(edges[-1])}")


@dataclass(frozen=True, slots=True)
class Slicer:
    """Band edges and their labels, computed once per policy."""

    temperature: tuple[float, ...]
    context_tokens: tuple[int, ...]
    temperature_labels: tuple[str, ...]
    context_labels: tuple[str, ...]
    tool_schemas: int = 0

    @classmethod
    def of(
        cls, temperature: Sequence[float], context_tokens: Sequence[int], tool_schemas: int = 0
    ) -> Slicer:
        return cls(
            tuple(temperature),
            tuple(context_tokens),
            _temperature_labels(temperature),
            _context_labels(context_tokens),
            tool_schemas,
        )

    def key(self, rule: str, features: Features) -> str:
        t = self.temperature_labels[bisect_left(self.temperature, features.temperature)]
        c = self.context_labels[bisect_right(self.context_tokens, features.prompt_tokens)]
        fingerprint = features.tools_fingerprint
        if self.tool_schemas and fingerprint:
            bucket = int(fingerprint[:8], 16) % self.tool_schemas
            return f"{rule} / {t} / {c} / tools:{bucket:02x}"
        return f"{rule} / {t} / {c}"
