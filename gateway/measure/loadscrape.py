"""Every gateway replica's traffic in the load meter: each endpoint's own count of the
requests it runs and queues, read from its metrics page and handed to
``LoadMeter.scraped`` (``gateway/measure/load.py``) with this replica's own requests in flight
there at the moment of the reading: what the endpoint counts beyond them is other
replicas' load, added to this replica's own while the reading is fresh.

Read on every pool of every ladder, standard ones included, every ``interval_s``: the series
of the pool's engine that count the requests it runs and queues (``Engine.load``,
``gateway/engines/``; summed over engines and label sets). An engine with none is left out
(one whose ``/metrics`` hands what it shows to one reader only, the pool scraper). Runs in
the background; a failed read is
counted and logged at debug level, never raised. A read that got no answer at all (no
connection, or nothing within the timeout) is also an active health check: it counts as a
failure of the endpoint for the outlier detector, so a hung server that takes no traffic
is ejected too, and whole answers awaited from it are given up (``backends/pool.py``).
The same page of an endpoint that keeps vLLM's step counters also gives its mean engine step
since the last reading
(``enginesteps.py``), handed to ``on_step``: the pool's step time from its own counters.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from prometheus_client.parser import text_string_to_metric_families

from backends.errors import BackendError, Unavailable, UpstreamTimeout
from backends.pool import Endpoint, Pools
from backends.upstream import Upstream
from gateway.engines import ENGINES, Registry
from gateway.measure.enginesteps import EngineReading, EngineStep, reading, since_last
from gateway.measure.load import LoadMeter

OnStep = Callable[[str, "int | None", EngineStep], None]

log = logging.getLogger(__name__)

GAUGES = frozenset().union(*(engine.load for engine in ENGINES))


def in_flight(text: str, gauges: frozenset[str] = GAUGES) -> float | None:
    """Requests an engine runs and queues, from its metrics page (``gauges``: the series
    that count them); None when it shows none of them."""
    total, seen = 0.0, False
    for family in text_string_to_metric_families(text):
        if family.name in gauges:
            for sample in family.samples:
                total += sample.value
                seen = True
    return total if seen else None


class LoadScraper:
    """Reads every endpoint's running and waiting requests into the load meter."""

    def __init__(
        self,
        pools: Pools,
        upstream: Upstream,
        load: LoadMeter,
        clock: Callable[[], float],
        timeout_s: float = 2.0,
        on_step: OnStep | None = None,
        engines: Registry = ENGINES,
    ) -> None:
        self._pools = pools
        self._engines = engines
        self._upstream = upstream
        self._load = load
        self._clock = clock
        self._timeout_s = timeout_s
        self._on_step = on_step
        self._readings: dict[str, EngineReading] = {}
        self.failures = 0

    async def scrape(self) -> None:
        """One round over every endpoint of every pool an engine's gauges can be read from."""
        endpoints = [
            (name, e, gauges)
            for name, spec in list(self._pools.specs.items())
            if (gauges := self._engines.of(spec.engine).load)
            for e in self._pools.endpoints.get(name, ())
        ]
        await asyncio.gather(*(self._read(e, name, gauges) for name, e, gauges in endpoints))

    async def _read(
        self, endpoint: Endpoint, pool: str = "", gauges: frozenset[str] = GAUGES
    ) -> None:
        url = endpoint.url
        try:
            text = await self._upstream.fetch_text(url.rstrip("/") + "/metrics", self._timeout_s)
            value = in_flight(text, gauges)
        except (BackendError, ValueError) as exc:
            self.failures += 1
            log.debug("load gauges of %s not read: %s", url, exc)
            if _unanswered(exc):
                self._pools.failed(endpoint)
            return
        now = self._clock()
        if value is not None:
            self._load.scraped(url, value, endpoint.outstanding, now)
        if self._on_step is not None and pool:
            self._engine_step(pool, url, text, now)

    def _engine_step(self, pool: str, url: str, text: str, now: float) -> None:
        """The engine's mean step since the last reading, to ``on_step``
        (``enginesteps.py``): the pool's step time from its own counters."""
        try:
            current = reading(text, now)
        except ValueError:
            return
        if current is None:
            return
        step = since_last(self._readings, url, current)
        spec = self._pools.specs.get(pool)
        if step is not None and self._on_step is not None and spec is not None:
            self._on_step(pool, spec.k, step)

    async def run(self, interval_s: float) -> None:
        while True:
            try:
                await self.scrape()
            except Exception:  # the loop must outlive one bad round
                log.exception("load gauge scrape failed")
            await asyncio.sleep(interval_s)


def _unanswered(exc: Exception) -> bool:
    """No answer at all: a timeout, or a failure with no HTTP status (a server that answers
    404 for its metrics page is alive)."""
    return isinstance(exc, UpstreamTimeout) or (isinstance(exc, Unavailable) and not exc.status)
