"""Every gateway replica's traffic in the load meter: each endpoint's own count of the
requests it runs and queues, read from its metrics page and handed to
``LoadMeter.scraped`` (``gateway/measure/load.py``) with this replica's own requests in flight
there at the moment of the reading: what the endpoint counts beyond them is other
replicas' load, added to this replica's own while the reading is fresh.

Read on every pool of every ladder, standard ones included, every ``interval_s``: vLLM's and
vllm-neuron's ``vllm:num_requests_running`` plus ``vllm:num_requests_waiting``, SGLang's
``sglang:num_running_reqs`` plus ``sglang:num_queue_reqs`` (summed over engines and label
sets). TensorRT-LLM is left out: its ``/metrics`` hands each iteration's stats to one reader
only, and the pool scraper is that reader. Runs in the background; a failed read is
counted and logged at debug level, never raised. A read that got no answer at all (no
connection, or nothing within the timeout) is also an active health check: it counts as a
failure of the endpoint for the outlier detector, so a hung server that takes no traffic
is ejected too, and whole answers awaited from it are given up (``backends/pool.py``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from prometheus_client.parser import text_string_to_metric_families

from backends.errors import BackendError, Unavailable, UpstreamTimeout
from backends.pool import Endpoint, Pools
from backends.upstream import Upstream
from gateway.measure.load import LoadMeter

log = logging.getLogger(__name__)

GAUGES = frozenset(
    {
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "sglang:num_running_reqs",
        "sglang:num_queue_reqs",
    }
)
READ = frozenset({"vllm", "vllm-neuron", "sglang"})


def in_flight(text: str) -> float | None:
    """Requests an engine runs and queues, from its metrics page; None when it shows
    neither gauge."""
    total, seen = 0.0, False
    for family in text_string_to_metric_families(text):
        if family.name in GAUGES:
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
    ) -> None:
        self._pools = pools
        self._upstream = upstream
        self._load = load
        self._clock = clock
        self._timeout_s = timeout_s
        self.failures = 0

    async def scrape(self) -> None:
        """One round over every endpoint of every pool an engine's gauges can be read from."""
        endpoints = [
            e
            for name, spec in list(self._pools.specs.items())
            if spec.engine in READ
            for e in self._pools.endpoints.get(name, ())
        ]
        await asyncio.gather(*(self._read(e) for e in endpoints))

    async def _read(self, endpoint: Endpoint) -> None:
        url = endpoint.url
        try:
            text = await self._upstream.fetch_text(url.rstrip("/") + "/metrics", self._timeout_s)
            value = in_flight(text)
        except (BackendError, ValueError) as exc:
            self.failures += 1
            log.debug("load gauges of %s not read: %s", url, exc)
            if _unanswered(exc):
                self._pools.failed(endpoint)
            return
        if value is not None:
            self._load.scraped(url, value, endpoint.outstanding, self._clock())

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
