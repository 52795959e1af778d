"""Shadow mirrors: send a copy of a request to a speculative pool in the background, measure
the mirror like any request, and never let it touch the client's answer.

Mirrors are owned tasks: at most ``max_concurrency`` at once, within a token budget per
minute, and only while the target pool's endpoints are not busy; otherwise they are dropped
and counted. A mirror starts only after the client's own stream has its first event, so it
cannot delay the answer; it has its own timeout, and the lifespan cancels the rest on
shutdown.

When the client's request was greedy, the mirror's text goes to the correctness canary
(``gateway/measure/canary.py``) to be compared with the text the client got (chat and
completions). A mirror is relayed as its API's stream is (``gateway/forward/relay.py``): a
chat or text completion assembled, a Messages or Responses stream read event by event to its
end, in its API's dialect, and measured the same way.

Explained for operators, with its numbers, in docs/operations.md ("Flags, shadow
measurement and the admin API").
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

import orjson

from backends.errors import BackendError
from backends.placement import Affinity
from backends.pool import Pools
from gateway.apis import Api
from gateway.engines import ENGINES, Registry
from gateway.errors import UpstreamErrorEvent
from gateway.forward.relay import Relay
from gateway.measure.acceptance import Fold, Labels
from gateway.measure.answer import Measurement
from gateway.measure.budget import TokenBucket
from gateway.measure.canary import Canary
from gateway.measure.checks import Checks
from gateway.measure.completions import answer_text
from gateway.measure.telemetry import Telemetry
from gateway.settings import Settings

log = logging.getLogger(__name__)
_HEADERS = {"content-type": "application/json", "accept": "text/event-stream"}


@dataclass(frozen=True, slots=True)
class ShadowLimits:
    max_concurrency: int = 8
    tokens_per_minute: float = 200_000
    max_outstanding: int = 16
    timeout_s: float = 120.0

    @classmethod
    def of(cls, settings: Settings) -> ShadowLimits:
        return cls(
            settings.shadow_max_concurrency,
            settings.shadow_tokens_per_minute,
            settings.shadow_max_outstanding,
            settings.shadow_timeout_s,
        )


class Admission:
    """Whether a mirror may start, by ``ShadowLimits``: mirrors in flight, the target pool's
    least busy endpoint (by this gateway's own count), and the token budget a minute. Pure;
    ``now`` is an argument (the replay admits its mirrors by the same rules)."""

    __slots__ = ("_budget", "limits")

    def __init__(self, limits: ShadowLimits, now: float) -> None:
        self.limits = limits
        self._budget = TokenBucket(limits.tokens_per_minute, now)

    def refusal(
        self, running: int, least_outstanding: int | None, cost_tokens: int, now: float
    ) -> str | None:
        """Why not (a metric's label), or None: the mirror starts and its tokens are spent."""
        if running >= self.limits.max_concurrency:
            return "dropped_concurrency"
        if least_outstanding is None or least_outstanding >= self.limits.max_outstanding:
            return "dropped_pool_busy"
        if not self._budget.take(cost_tokens, now):
            return "dropped_budget"
        return None


_LIMITS = ("max_tokens", "max_completion_tokens", "max_output_tokens")


def short_probe(payload: dict[str, Any], limit: str, tokens: int) -> dict[str, Any]:
    """``payload`` asking for at most ``tokens`` output tokens, whichever way it names the
    limit, or by its API's own ``limit`` field (``Api.limit``) when it names none (the
    guardrail's short probes: their tokens per step, not their answer)."""
    capped = {key: min(payload[key], tokens) for key in _LIMITS if _count(payload.get(key))}
    if not capped:
        capped = {limit: tokens}
    return payload | capped


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


class Prefilled(Protocol):
    """Told each mirror's prompt once its stream opens (``Feedback.prefilled``)."""

    def __call__(
        self, url: str, prompt_tokens: int, now: float, *, computed: int | None = None
    ) -> None: ...


class ShadowRunner:
    """Starts, bounds, measures and drains shadow mirrors."""

    def __init__(
        self,
        pools: Pools,
        clock: Callable[[], float],
        checks: Checks,
        telemetry: Telemetry,
        limits: ShadowLimits = ShadowLimits(),
        canary: Canary | None = None,
        prefilled: Prefilled | None = None,
        engines: Registry = ENGINES,
    ) -> None:
        self._pools = pools
        self._engines = engines
        self._clock = clock
        self._checks = checks  # a mirror's outcome is recorded, its answer not checked
        self._telemetry = telemetry
        self._limits = limits
        self.canary = canary or Canary(telemetry)
        self._prefilled = prefilled  # told each mirror's prompt, once its stream opens
        self._admission = Admission(limits, clock())
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    def mirror(
        self,
        pool: str,
        api: Api,
        payload: dict[str, Any],
        labels: Labels,
        cost_tokens: int,
        primary_text: asyncio.Future[str] | None = None,
        prompt_tokens: int = 0,
        affinity: Affinity | None = None,
    ) -> bool:
        """Start a mirror of a request to ``api`` unless a bound says no; True when it
        started. With an ``affinity``, the mirror goes to the endpoint of ``pool`` its
        conversation's opening picks (``backends/placement.py``), so the mirrors of one long
        conversation find its prefix cached there after the first; the prefix map does not
        learn of it (it keeps where the client's answers were served)."""
        reason = self._refusal(pool, cost_tokens)
        if reason is not None:
            self._telemetry.mirror(pool, reason)
            return False
        streamed: dict[str, Any] = {"stream": True}
        if not api.events:  # a chunk stream: usage asked for, as the relay does
            streamed["stream_options"] = {"include_usage": True}
        if api.stores:  # nobody can name a mirror's answer: the engine is to keep none
            streamed |= {"store": False, "background": False}  # vLLM: background needs store
        body = orjson.dumps(payload | streamed)
        mirrored = replace(labels, pool=pool, shadow=True)
        task = asyncio.create_task(
            self._run(pool, api, body, mirrored, primary_text, prompt_tokens, affinity)
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        self._telemetry.mirror(pool, "started")
        return True

    def _refusal(self, pool: str, cost_tokens: int) -> str | None:
        endpoints = self._pools.candidates(pool)
        least = endpoints[0].outstanding if endpoints else None
        return self._admission.refusal(len(self._tasks), least, cost_tokens, self._clock())

    async def _run(
        self,
        pool: str,
        api: Api,
        body: bytes,
        labels: Labels,
        primary_text: asyncio.Future[str] | None,
        prompt_tokens: int,
        affinity: Affinity | None,
    ) -> None:
        started = self._clock()  # its first token is timed from here, as a request's is
        try:
            async with asyncio.timeout(self._limits.timeout_s):
                opened = await self._pools.open(
                    (pool,), api.path, body, _HEADERS, opening=api.opening, affinity=affinity
                )
                self._telemetry.opened(pool, shadow=True)
                if self._prefilled is not None:
                    url = opened.endpoint.url
                    computed = affinity.uncached(url) if affinity is not None else None
                    self._prefilled(url, prompt_tokens, self._clock(), computed=computed)
                served = replace(labels, k=opened.spec.k, endpoint=opened.endpoint.url)
                engine = self._engines.of(opened.spec.engine)
                fold = Fold(served, started, started)
                measurement = Measurement(fold, self._clock, self._checks, engine=engine)
                relay = Relay(opened, measurement, api.dialect, clock=self._clock, shape=api.shape)
                if api.assemble is None:  # read to its end, measured, and dropped
                    async for _ in relay.sse():
                        pass
                    return
                answer = await relay.collect(chat=api.assemble == "chat")
        except (BackendError, UpstreamErrorEvent, TimeoutError) as exc:
            self._telemetry.mirror(pool, "failed")
            log.info("shadow mirror to %s failed: %s", pool, exc)
            return
        if primary_text is not None:
            mirrored = answer_text(answer)
            await self.canary.compare(labels.slice, mirrored, primary_text, self._limits.timeout_s)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
