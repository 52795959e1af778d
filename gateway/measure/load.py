"""Load as the economic guardrail needs it: requests in flight per endpoint, over time.

Two views, both from the pools' own in-flight counts (``Endpoint.outstanding``, which the
gateway raises when it sends a request and lowers when the answer ends, shadow mirrors
included), sampled every ``interval_s`` by a background task:

- per endpoint, the time integral of in-flight requests (kept for ``history_s``), so an
  outcome's mean load over its life is (integral at its end - integral at its start) / its
  duration: the batch its step times were measured at;
- per model, a smoothed mean of in-flight requests per endpoint over the model's whole
  ladder: the load a slice is judged at. It does not depend on where the slice itself is
  routed (moving a slice between rungs moves load between pools, not over the ladder), so
  judging at it does not make slices flap.

An endpoint's own count of the requests it runs and queues (``vllm:num_requests_running``
plus ``..._waiting``, read by ``gateway/measure/loadscrape.py``) also counts other gateway
replicas' requests: an endpoint's load is the larger of the two while the reading is
fresh. Never awaits on the request path; ``sample`` is O(endpoints).
"""

from __future__ import annotations

import asyncio
import math
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field


@dataclass(slots=True)
class Smoothed:
    """An exponentially weighted mean over time of a piecewise-constant signal."""

    tau_s: float = 10.0
    value: float | None = None
    last: float = 0.0
    at: float = 0.0

    def observe(self, now: float, value: float) -> None:
        if self.value is None:
            self.value, self.last, self.at = value, value, now
            return
        if now > self.at:
            keep = math.exp(-(now - self.at) / self.tau_s)
            self.value = self.value * keep + self.last * (1.0 - keep)
            self.at = now
        self.last = value


@dataclass(slots=True)
class _Endpoint:
    count: float = 0.0
    area: float = 0.0
    at: float = 0.0
    scraped: float = 0.0
    scraped_at: float = -math.inf
    history: deque[tuple[float, float]] = field(default_factory=deque)

    def area_at(self, t: float) -> float:
        """The integral up to ``t``, interpolated between samples."""
        if t >= self.at:
            return self.area + self.count * (t - self.at)
        times = [h[0] for h in self.history]
        i = bisect_left(times, t)
        if i == 0:
            return self.history[0][1] if self.history else 0.0
        (t0, a0), (t1, a1) = self.history[i - 1], self.history[i]
        return a0 + (a1 - a0) * (t - t0) / (t1 - t0) if t1 > t0 else a1


class LoadMeter:
    """In-flight requests per endpoint and per ladder (module docstring)."""

    def __init__(
        self,
        counts: Callable[[], Mapping[str, Sequence[tuple[str, int]]]],
        ladders: Callable[[], Mapping[str, Sequence[str]]],
        *,
        tau_s: float = 10.0,
        gauge_fresh_s: float = 15.0,
        history_s: float = 900.0,
    ) -> None:
        self._history_s = history_s
        self._counts = counts
        self._ladders = ladders
        self._tau_s = tau_s
        self._fresh_s = gauge_fresh_s
        self._endpoints: dict[str, _Endpoint] = {}
        self._models: dict[str, Smoothed] = {}

    def sample(self, now: float) -> None:
        """Read every endpoint's in-flight count; integrate and smooth."""
        per_pool: dict[str, list[float]] = {}
        for pool, endpoints in self._counts().items():
            loads = per_pool.setdefault(pool, [])
            for raw, outstanding in endpoints:
                url = raw.rstrip("/")
                e = self._endpoints.get(url)
                if e is None:
                    e = self._endpoints[url] = _Endpoint(at=now)
                e.area += e.count * (now - e.at)
                e.at = now
                e.history.append((now, e.area))
                while e.history and e.history[0][0] < now - self._history_s:
                    e.history.popleft()
                count = float(outstanding)
                if now - e.scraped_at <= self._fresh_s:
                    count = max(count, e.scraped)
                e.count = count
                loads.append(count)
        for model, pools in self._ladders().items():
            loads = [x for p in pools for x in per_pool.get(p, ())]
            if loads:
                smoothed = self._models.setdefault(model, Smoothed(self._tau_s))
                smoothed.observe(now, sum(loads) / len(loads))

    def scraped(self, url: str, running: float, now: float) -> None:
        """A fresh reading of the requests one endpoint runs and queues, by its own count."""
        e = self._endpoints.setdefault(url.rstrip("/"), _Endpoint(at=now))
        e.scraped, e.scraped_at = running, now

    def mean(self, url: str, since: float, now: float) -> float | None:
        """Mean in-flight requests on ``url`` between ``since`` and ``now`` (at least 1: the
        request itself)."""
        e = self._endpoints.get(url.rstrip("/"))
        if now - since <= 0 or e is None:
            return None
        return max((e.area_at(now) - e.area_at(since)) / (now - since), 1.0)

    def ladder(self, model: str, now: float) -> float | None:
        """The smoothed mean in-flight requests per endpoint over ``model``'s ladder."""
        smoothed = self._models.get(model)
        return None if smoothed is None else smoothed.value

    async def run(self, clock: Callable[[], float], interval_s: float) -> None:
        while True:
            self.sample(clock())
            await asyncio.sleep(interval_s)
