"""How the pool scraper reads one endpoint of each engine (``gateway/measure/scrape.py``
differences what this returns). Part of acceptance signal 3; runs in the background.

- vLLM and vllm-neuron: ``/metrics``, the ``vllm:spec_decode_*`` counters (vllm-neuron's
  stay at 0) and ``vllm:generation_tokens_total``.
- TensorRT-LLM: ``/prometheus/metrics`` when the server has it (``return_perf_metrics``):
  cumulative counters, safe for any number of scrapers. Such a server drains its own
  iteration-stats queue into them, so ``/metrics`` is read only where
  ``/prometheus/metrics`` answers 404. ``/metrics`` hands each iteration to exactly one
  reader and forgets it: every read's sums are added to a running total in the shared
  state (``SharedState.drained``: Redis with several replicas, so each replica adds what it
  took and all difference the same total), which is then differenced like a counter. No
  iteration is counted twice (one read takes it) and none is lost to another replica;
  iterations the server dropped because nobody read them in time (its queue is bounded)
  show as ``lost``: the span of ``iter`` numbers drained minus the iterations seen.
- SGLang: no counters. ``/metrics`` gauges ``sglang:spec_accept_rate`` and
  ``sglang:spec_accept_length`` (its last log interval) and ``/server_info``'s mean tokens
  per step since start are shown as they are, and never differenced.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from backends.counters import (
    SpecCounters,
    drained,
    parse,
    parse_trtllm,
    sglang_gauges,
    sglang_tokens_per_step,
)
from backends.errors import BackendError, Unavailable
from backends.upstream import Upstream

log = logging.getLogger(__name__)

Drain = Callable[[str, dict[str, float], int | None, int | None], Awaitable[dict[str, float]]]


@dataclass(frozen=True, slots=True)
class Gauges:
    """What an engine without counters says of itself right now."""

    rate: float | None = None
    length: float | None = None
    lifetime_length: float | None = None


class EngineReader:
    """Reads one endpoint of a pool the way its engine shows speculation."""

    def __init__(self, upstream: Upstream, drain: Drain, timeout_s: float) -> None:
        self._upstream = upstream
        self._drain = drain
        self._timeout_s = timeout_s
        self._no_prometheus: set[str] = set()
        self.lost: dict[str, float] = {}

    async def counters(self, url: str, engine: str) -> SpecCounters | None:
        """Cumulative counters of ``url`` (None for an engine that has none)."""
        base = url.rstrip("/")
        if engine == "sglang":
            return None
        if engine != "trtllm":
            return parse(await self._get(base + "/metrics"))
        if url not in self._no_prometheus:
            try:
                return parse_trtllm(await self._get(base + "/prometheus/metrics"))
            except Unavailable as exc:
                if exc.status != 404:
                    raise
                self._no_prometheus.add(url)
                log.info("%s has no /prometheus/metrics: reading its drained /metrics", url)
        return await self._drained(url, base)

    async def _drained(self, url: str, base: str) -> SpecCounters:
        taken = drained((await self._get(base + "/metrics")).encode())
        totals = await self._drain(url, taken.fields(), taken.first, taken.last)
        self.lost[url] = totals.get("lost", 0.0)
        return SpecCounters(
            totals.get("drafts", 0.0),
            totals.get("draft_tokens", 0.0),
            totals.get("accepted_tokens", 0.0),
            totals.get("work", 0.0),
        )

    async def gauges(self, url: str) -> Gauges:
        base = url.rstrip("/")
        rate, length = sglang_gauges(await self._get(base + "/metrics"))
        try:
            lifetime = sglang_tokens_per_step((await self._get(base + "/server_info")).encode())
        except BackendError:
            lifetime = None
        return Gauges(rate, length, lifetime)

    async def _get(self, url: str) -> str:
        return await self._upstream.fetch_text(url, self._timeout_s)


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
