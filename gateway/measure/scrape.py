"""Acceptance signal 3: the speculative pools' own counters, scraped and differenced.

Every ``interval_s`` (and once at start) each speculative endpoint is read the way its
engine shows speculation (``gateway/measure/engine_scrape.py``, ``Engine.figures``:
cumulative counters, counters drained on read, or gauges); the pool's draft and
accepted token counts since the last scrape are the pool-level acceptance, a cross-check
shown in metrics and on the admin API. When the requests a pool served without a
per-request signal (``speed``) all belonged to one slice, the counts are that slice's
evidence (``LiveStats.pool_counters``). Runs in the background; a failed scrape is logged
and counted, never raised.

What ``/metrics`` shows per pool (``PoolReading``) is the acceptance over the differences of
the last ``window_s``, never an old value kept forever: a pool that stops drafting or stops
answering its scrapes drops out once its last differences are older than the window, and
``fed_at`` says when drafts last came in. Before a second reading of any endpoint exists,
the first reading's lifetime totals stand in (``basis="lifetime"``). An engine's gauge
(``Engine.gauged``) stands as it is (``basis="gauge"``).

A pool that drafted and then decodes on (``work``: generated tokens or iterations) through
``OFF_AFTER`` scrapes in a row without a draft is said to have speculation off
(``speculation``: an engine's speculation gate may do that for good, or above a batch
size; ``gateway/engines/``); it is logged once, shown on ``/admin/pools`` and
``/readyz``, and says ``on`` again when drafts come back.

Explained for operators, with its numbers, in docs/measuring.md ("Engines").
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from backends.counters import SpecCounters
from backends.errors import BackendError
from backends.pool import Pools
from backends.upstream import Upstream
from gateway.engines import ENGINES, Engine, Registry
from gateway.measure.engine_scrape import Drain, EngineReader, Gauges, tallied
from gateway.measure.livestats import LiveStats
from gateway.measure.telemetry import PoolReading

log = logging.getLogger(__name__)
OFF_AFTER = 3


@dataclass(slots=True)
class _History:
    """One pool's recent differences: (wall time, draft tokens, accepted tokens), and how
    many scrapes in a row it decoded without drafting since it last drafted."""

    deltas: deque[tuple[float, float, float]] = field(default_factory=deque)
    fed_at: float | None = None
    dry: int = 0
    off_since: float | None = None

    def add(self, now: float, delta: SpecCounters) -> None:
        self.deltas.append((now, delta.draft_tokens, delta.accepted_tokens))
        self.fed_at = now

    def reading(self, now: float, window_s: float) -> PoolReading | None:
        while self.deltas and self.deltas[0][0] < now - window_s:
            self.deltas.popleft()
        drafted = sum(d for _, d, _ in self.deltas)
        if not drafted:
            return None
        accepted = sum(a for _, _, a in self.deltas)
        return PoolReading(accepted / drafted, self.fed_at, "window")

    def speculation(self) -> str:
        if self.fed_at is None:
            return "unknown"
        return "off" if self.off_since is not None else "on"


class PoolScraper:
    """Keeps the last reading per endpoint and the recent differences per pool."""

    def __init__(
        self,
        pools: Pools,
        upstream: Upstream,
        stats: LiveStats,
        wall: Callable[[], float],
        published: dict[str, PoolReading],
        timeout_s: float = 2.0,
        window_s: float = 60.0,
        drain: Drain | None = None,
        engines: Registry = ENGINES,
    ) -> None:
        self._pools = pools
        self._stats = stats
        self._wall = wall
        self.window_s = window_s
        self._published = published
        self._reader = EngineReader(upstream, drain or _local_drain(), timeout_s, engines)
        self._readings: dict[str, SpecCounters] = {}
        self._history: dict[str, _History] = {}
        self.latest: dict[str, SpecCounters] = {}
        self.gauges: dict[str, Gauges] = {}
        self.failures = 0

    @property
    def lost(self) -> dict[str, float]:
        """Per endpoint read drained-on-read: iterations the server dropped unread."""
        return dict(self._reader.lost)

    def speculation(self, pool: str) -> dict[str, object]:
        history = self._history.get(pool)
        if history is None:
            return {"state": "unknown", "since": None}
        return {"state": history.speculation(), "since": history.off_since}

    async def scrape(self) -> None:
        """One round over every speculative pool."""
        now = self._wall()
        for name, spec in list(self._pools.specs.items()):
            if not spec.speculative:
                continue
            urls = [e.url for e in self._pools.endpoints.get(name, ())]
            engine = self._reader.engine(spec.engine)
            if engine.gauged:
                await self._gauges(name, urls, now, engine)
                continue
            readings = await asyncio.gather(*(self._read(url, engine) for url in urls))
            delta, first = SpecCounters(), SpecCounters()
            for url, reading in zip(urls, readings, strict=True):
                if reading is None:
                    continue
                earlier = self._readings.get(url)
                self._readings[url] = reading
                if earlier is None:
                    first = first.plus(reading)
                else:
                    delta = delta.plus(reading.minus(earlier))
            self._publish(name, now, delta, first)

    def _publish(self, name: str, now: float, delta: SpecCounters, first: SpecCounters) -> None:
        history = self._history.setdefault(name, _History())
        if delta.draft_tokens:
            history.add(now, delta)
            self.latest[name] = delta
            drafted, accepted = int(delta.draft_tokens), int(delta.accepted_tokens)
            self._stats.pool_counters(name, drafted, accepted, now)
        self._watch(name, history, delta, now)
        shown = history.reading(now, self.window_s)
        if shown is None and history.fed_at is None and first.acceptance is not None:
            shown = PoolReading(first.acceptance, now, "lifetime")
        if shown is None:
            self._published.pop(name, None)
        else:
            self._published[name] = shown

    def _watch(self, name: str, history: _History, delta: SpecCounters, now: float) -> None:
        """Speculation that stopped: decoding goes on, drafts do not come."""
        if delta.draft_tokens:
            if history.off_since is not None:
                log.warning("pool %s drafts again: speculation is on", name)
            history.dry, history.off_since = 0, None
            return
        if history.fed_at is None or delta.work <= 0:
            return
        history.dry += 1
        if history.dry >= OFF_AFTER and history.off_since is None:
            history.off_since = now
            log.warning(
                "pool %s decodes without drafting (%d scrapes): speculation is off; an "
                "engine's speculation gate may keep it off until the server restarts",
                name,
                history.dry,
            )

    async def _gauges(self, name: str, urls: list[str], now: float, engine: Engine) -> None:
        """An engine's gauges as they are (the first endpoint that answers)."""
        for url in urls:
            try:
                gauges = await self._reader.read(url, engine)
            except BackendError as exc:
                self.failures += 1
                log.debug("scrape of %s failed: %s", url, exc)
                continue
            if not isinstance(gauges, Gauges):
                return
            self.gauges[name] = gauges
            if gauges.rate is not None:
                self._published[name] = PoolReading(gauges.rate, now, "gauge")
            return

    async def _read(self, url: str, engine: Engine) -> SpecCounters | None:
        try:
            reading = await self._reader.read(url, engine)
        except BackendError as exc:
            self.failures += 1
            log.debug("scrape of %s failed: %s", url, exc)
            return None
        except ValueError as exc:
            self.failures += 1
            log.warning("cannot parse what %s shows of speculation: %s", url, exc)
            return None
        return reading if isinstance(reading, SpecCounters) else None

    async def run(self, interval_s: float) -> None:
        while True:
            try:
                await self.scrape()
            except Exception:  # the loop must outlive one bad round
                log.exception("pool counter scrape failed")
            await asyncio.sleep(interval_s)


def _local_drain() -> Drain:
    """A drained-read tally of this process alone (tools that run without shared state)."""
    totals: dict[str, dict[str, float]] = {}

    async def drain(
        key: str, add: dict[str, float], first: int | None, last: int | None
    ) -> dict[str, float]:
        totals[key] = tallied(totals.get(key, {}), add, first, last)
        return dict(totals[key])

    return drain
