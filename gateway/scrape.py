"""Acceptance signal 3: the speculative pools' own counters, scraped and differenced.

Every ``interval_s`` each speculative endpoint's ``/metrics`` is read; the pool's draft and
accepted token counts since the last scrape are the pool-level acceptance, a cross-check
shown in metrics and on the admin API. When the requests a pool served without a
per-request signal (``speed``: e.g. vllm-neuron reports no draft tokens per request) all
belonged to one slice, the counts are that slice's evidence (``LiveStats.pool_counters``).
Runs in the background; a failed scrape is logged and counted, never raised.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from backends.counters import SpecCounters, parse
from backends.errors import BackendError
from backends.pool import Pools
from backends.upstream import Upstream
from gateway.livestats import LiveStats

log = logging.getLogger(__name__)


class PoolScraper:
    """Keeps the last reading per endpoint and the last difference per pool."""

    def __init__(
        self,
        pools: Pools,
        upstream: Upstream,
        stats: LiveStats,
        wall: Callable[[], float],
        published: dict[str, float],
        timeout_s: float = 2.0,
    ) -> None:
        self._pools = pools
        self._upstream = upstream
        self._stats = stats
        self._wall = wall
        self._timeout_s = timeout_s
        self._published = published
        self._readings: dict[str, SpecCounters] = {}
        self.latest: dict[str, SpecCounters] = {}
        self.failures = 0

    async def scrape(self) -> None:
        """One round over every speculative pool."""
        for name, spec in list(self._pools.specs.items()):
            if not spec.speculative:
                continue
            delta = SpecCounters()
            readings = await asyncio.gather(
                *(self._read(url) for url in spec.endpoints), return_exceptions=False
            )
            for url, reading in zip(spec.endpoints, readings, strict=True):
                if reading is None:
                    continue
                earlier = self._readings.get(url)
                self._readings[url] = reading
                if earlier is not None:
                    delta = delta.plus(reading.minus(earlier))
            if delta.draft_tokens:
                self.latest[name] = delta
                self._published[name] = delta.accepted_tokens / delta.draft_tokens
                self._stats.pool_counters(
                    name, int(delta.draft_tokens), int(delta.accepted_tokens), self._wall()
                )

    async def _read(self, url: str) -> SpecCounters | None:
        try:
            text = await self._upstream.fetch_text(url.rstrip("/") + "/metrics", self._timeout_s)
        except BackendError as exc:
            self.failures += 1
            log.debug("scrape of %s failed: %s", url, exc)
            return None
        try:
            return parse(text)
        except ValueError as exc:
            self.failures += 1
            log.warning("cannot parse %s/metrics: %s", url, exc)
            return None

    async def run(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self.scrape()
            except Exception:  # the loop must outlive one bad round
                log.exception("pool counter scrape failed")
