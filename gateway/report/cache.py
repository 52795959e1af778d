"""The report's prefix-cache figures: per pool and endpoint, prompt tokens the engine's
cache held over prompt tokens, from the outcome records (``cached_tokens``, where the
answer said). Shadow mirrors count: they are served from the same caches. Pure."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class CacheRow:
    """One pool (``endpoint`` empty) or one endpoint of it."""

    pool: str
    endpoint: str
    requests: int
    prompt_tokens: int
    cached_tokens: int

    @property
    def hit_ratio(self) -> float | None:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else None


def cache_rows(records: Iterable[Mapping[str, Any]]) -> list[CacheRow]:
    """Each pool's row, then its endpoints' rows, pools by name; only records that say how
    much was cached."""
    tally: defaultdict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0, 0])
    for record in records:
        cached, prompt = record.get("cached_tokens"), record.get("prompt_tokens")
        if not isinstance(cached, int) or not isinstance(prompt, int) or prompt <= 0:
            continue
        for key in (
            (str(record.get("pool")), ""),
            (str(record.get("pool")), str(record.get("endpoint") or "?")),
        ):
            tally[key][0] += 1
            tally[key][1] += prompt
            tally[key][2] += min(cached, prompt)
    return [CacheRow(pool, endpoint, *tally[pool, endpoint]) for pool, endpoint in sorted(tally)]
