"""How the pool scraper reads one endpoint of each engine (``gateway/measure/scrape.py``
differences what this returns). Part of acceptance signal 3; runs in the background.

Each engine's module says how its pages show speculation (``Engine.figures``,
``gateway/engines/``): cumulative counters, differenced here like any counter, or gauges
shown as they are (``Engine.gauged``). A reader is made once per engine, so it may keep
what it learnt of an endpoint (a page it lacks). Counters an engine hands to one reader only
and forgets are added up in the shared state (``Drain``: with several replicas each adds
what it took, and all difference the same total; ``tallied`` is its arithmetic).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from backends.counters import SpecCounters
from backends.upstream import Upstream
from gateway.engines import ENGINES, Engine, Gauges, Registry
from gateway.engines.engine import Drain, Figures

__all__ = ["Drain", "EngineReader", "Gauges", "tallied"]


class EngineReader:
    """Reads one endpoint of a pool the way its engine shows speculation."""

    def __init__(
        self, upstream: Upstream, drain: Drain, timeout_s: float, engines: Registry = ENGINES
    ) -> None:
        self._fetch: Callable[[str], Awaitable[str]] = lambda url: upstream.fetch_text(
            url, timeout_s
        )
        self._drain = drain
        self._engines = engines
        self._readers: dict[str, Figures] = {}

    def engine(self, name: str) -> Engine:
        return self._engines.of(name)

    async def read(self, url: str, engine: Engine) -> SpecCounters | Gauges | None:
        """What ``url`` shows now (None for an engine that shows nothing)."""
        if engine.figures is None:
            return None
        reader = self._readers.get(engine.name)
        if reader is None:
            reader = self._readers[engine.name] = engine.figures(self._fetch, self._drain)
        return await reader.read(url)

    @property
    def lost(self) -> dict[str, float]:
        """Per endpoint read drained-on-read: iterations the server dropped unread."""
        return {url: n for reader in self._readers.values() for url, n in reader.lost.items()}


def tallied(
    totals: dict[str, float], add: dict[str, float], first: int | None, last: int | None
) -> dict[str, float]:
    """``totals`` with one drained read added (``drained``'s arithmetic, shared by both
    stores)."""
    out = dict(totals)
    for name, value in add.items():
        out[name] = out.get(name, 0.0) + value
    if first is not None:
        out["first"] = min(out.get("first", float(first)), float(first))
    if last is not None:
        out["last"] = max(out.get("last", float(last)), float(last))
    if "first" in out and "last" in out:
        span = out["last"] - out["first"] + 1.0
        out["lost"] = max(span - out.get("iterations", 0.0), 0.0)
    return out
