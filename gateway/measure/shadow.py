"""Shadow measurement: mirror a request to a speculative pool in the background, measure the
mirror like any request, and never let it touch the client's answer.

Mirrors are owned tasks: at most ``max_concurrency`` at once, within a token budget per
minute, and only while the target pool's endpoints are not busy; otherwise they are dropped
and counted. A mirror starts only after the client's own stream has its first event, so it
cannot delay the answer; it has its own timeout, and the lifespan cancels the rest on
shutdown.

Correctness canary: at temperature 0 speculative decoding must not change the output. When
the client's request was greedy, the mirror's text is compared with the text the client got;
the exact-match rate per slice is kept, and a slice whose mismatches pass the threshold gets
a guardrail event.

Explained for operators, with its numbers, in docs/operations.md ("Flags, shadow
measurement and the admin API").
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import orjson

from backends.errors import BackendError
from backends.pool import Pools
from gateway.errors import ApiError
from gateway.measure.acceptance import Fold, Labels, Outcome
from gateway.measure.budget import TokenBucket
from gateway.measure.telemetry import Telemetry
from gateway.server.streaming import Relay

log = logging.getLogger(__name__)
_HEADERS = {"content-type": "application/json", "accept": "text/event-stream"}


@dataclass(frozen=True, slots=True)
class ShadowLimits:
    max_concurrency: int = 8
    tokens_per_minute: float = 200_000
    max_outstanding: int = 16
    timeout_s: float = 120.0


@dataclass(frozen=True, slots=True)
class CanaryLimits:
    """Alarm when greedy mismatches exceed ``max_mismatch`` over ``min_samples`` compared."""

    max_mismatch: float = 0.1
    min_samples: int = 20


@dataclass(slots=True)
class CanaryCounts:
    compared: int = 0
    matched: int = 0
    alarmed: bool = False

    @property
    def rate(self) -> float | None:
        return self.matched / self.compared if self.compared else None


class ShadowRunner:
    """Starts, bounds, measures and drains shadow mirrors."""

    def __init__(
        self,
        pools: Pools,
        clock: Callable[[], float],
        record: Callable[[Outcome], None],
        telemetry: Telemetry,
        limits: ShadowLimits = ShadowLimits(),
        canary: CanaryLimits = CanaryLimits(),
        alarm: Callable[[str, CanaryCounts], None] | None = None,
    ) -> None:
        self._pools = pools
        self._clock = clock
        self._record = record
        self._telemetry = telemetry
        self._limits = limits
        self._canary = canary
        self._alarm = alarm
        self._budget = TokenBucket(limits.tokens_per_minute, clock())
        self._tasks: set[asyncio.Task[None]] = set()
        self.canary: dict[str, CanaryCounts] = {}

    @property
    def in_flight(self) -> int:
        return len(self._tasks)

    def mirror(
        self,
        pool: str,
        path: str,
        payload: dict[str, Any],
        labels: Labels,
        cost_tokens: int,
        primary_text: asyncio.Future[str] | None = None,
    ) -> bool:
        """Start a mirror unless a bound says no; True when it started."""
        reason = self._refusal(pool, cost_tokens)
        if reason is not None:
            self._telemetry.mirror(pool, reason)
            return False
        body = orjson.dumps(payload | {"stream": True, "stream_options": {"include_usage": True}})
        task = asyncio.create_task(
            self._run(pool, path, body, replace(labels, pool=pool, shadow=True), primary_text)
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        self._telemetry.mirror(pool, "started")
        return True

    def _refusal(self, pool: str, cost_tokens: int) -> str | None:
        if len(self._tasks) >= self._limits.max_concurrency:
            return "dropped_concurrency"
        endpoints = self._pools.candidates(pool)
        if not endpoints or endpoints[0].outstanding >= self._limits.max_outstanding:
            return "dropped_pool_busy"
        if not self._budget.take(cost_tokens, self._clock()):
            return "dropped_budget"
        return None

    async def _run(
        self,
        pool: str,
        path: str,
        body: bytes,
        labels: Labels,
        primary_text: asyncio.Future[str] | None,
    ) -> None:
        try:
            async with asyncio.timeout(self._limits.timeout_s):
                opened = await self._pools.open((pool,), path, body, _HEADERS)
                self._telemetry.opened(pool, shadow=True)
                served = replace(labels, k=opened.spec.k, endpoint=opened.endpoint.url)
                relay = Relay(
                    opened,
                    Fold(served, self._clock()),
                    include_usage=True,
                    clock=self._clock,
                    on_done=self._record,
                )
                answer = await relay.collect(chat=path.endswith("chat/completions"))
        except (BackendError, ApiError, TimeoutError) as exc:
            self._telemetry.mirror(pool, "failed")
            log.info("shadow mirror to %s failed: %s", pool, exc)
            return
        if primary_text is not None:
            await self._compare(labels.slice, answer_text(answer), primary_text)

    async def _compare(self, slice_key: str, mirrored: str, primary: asyncio.Future[str]) -> None:
        try:
            expected = await asyncio.wait_for(asyncio.shield(primary), self._limits.timeout_s)
        except (TimeoutError, asyncio.CancelledError):
            return
        counts = self.canary.setdefault(slice_key, CanaryCounts())
        counts.compared += 1
        counts.matched += mirrored == expected
        result = "match" if mirrored == expected else "mismatch"
        self._telemetry.mirror("canary", result)
        if mirrored != expected:
            log.warning("canary: greedy output differs on speculation for slice %s", slice_key)
        failing = (
            counts.compared >= self._canary.min_samples
            and 1 - counts.matched / counts.compared > self._canary.max_mismatch
        )
        if failing and not counts.alarmed and self._alarm is not None:
            self._alarm(slice_key, counts)
        counts.alarmed = failing

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def answer_text(answer: dict[str, Any]) -> str:
    """The text of the first choice of a chat or completions body."""
    choices = answer.get("choices") or [{}]
    choice = choices[0]
    message = choice.get("message")
    text = message.get("content") if isinstance(message, dict) else choice.get("text")
    return text or ""
