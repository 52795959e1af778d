"""A running gateway's startup and shutdown, as named steps (uvicorn's ``startup`` and
``shutdown``, one level down: the app's lifespan).

``startup`` lists every step in order, in one place: each service that has something to
open or to close, each background task (``lifecycle.py``) and the SIGHUP handler. Each step
registers its own shutdown on one ``AsyncExitStack`` as it starts, so shutdown runs the
steps in the reverse order of startup by construction: the tasks stop before the services
they use, mirrors and checks still waiting are drained and recorded before the outcome log
writes its last lines, and traces are exported last. A step that fails to start stops the
ones before it; one that fails to stop does not keep the others from stopping.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

from gateway.lifecycle import discover, tick, watch_policy
from gateway.measure.load import SAMPLE_EVERY_S
from gateway.services import Services

Action = Callable[[], Awaitable[None] | None]


class Steps:
    """Started steps, each with its way to stop; ``started`` and ``stopped`` name them in
    the order they ran."""

    def __init__(self, stack: AsyncExitStack) -> None:
        self._stack = stack
        self.started: list[str] = []
        self.stopped: list[str] = []

    async def open(self, name: str, stop: Action, start: Action | None = None) -> None:
        """Run ``start`` (if any); ``stop`` runs at shutdown, in reverse order."""
        if start is not None:
            await _done(start())
        self.started.append(name)
        self._stack.push_async_callback(self._stop, name, stop)

    def task(self, name: str, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` in the background; cancelled, and awaited, at shutdown."""
        running = asyncio.create_task(work, name=name)
        self.started.append(name)
        self._stack.push_async_callback(self._cancel, name, running)

    async def _stop(self, name: str, stop: Action) -> None:
        self.stopped.append(name)
        await _done(stop())

    async def _cancel(self, name: str, running: asyncio.Task[None]) -> None:
        self.stopped.append(name)
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)


@asynccontextmanager
async def running(services: Services) -> AsyncIterator[Steps]:
    """The gateway started for the block, and stopped after it; the steps, to read."""
    async with AsyncExitStack() as stack:
        steps = Steps(stack)
        await startup(services, steps)
        yield steps


async def startup(services: Services, steps: Steps) -> None:
    """Every step of a gateway's start, in order (shutdown is the reverse)."""
    settings = services.settings
    await steps.open("tracing", services.telemetry.shutdown)  # spans exported last
    await steps.open("upstream", services.upstream.close, services.upstream.start)
    await steps.open("shared-state", services.state.close, services.state.start)
    await steps.open("response-pins", services.pins.close)
    await steps.open("prefix-map", services.prefixes.close)
    await steps.open("outcome-log", services.outcomes.flush)  # what mirrors and checks left
    await steps.open("checks", services.checks.close)  # records what waits, unchecked
    await steps.open("shadow", services.shadow.close)
    if services.request_log is not None:
        await steps.open("request-log", services.request_log.flush)
    steps.task("policy-watch", watch_policy(services))
    steps.task("guardrail-tick", tick(services))
    steps.task("endpoint-discovery", discover(services))
    steps.task("pool-scrape", services.scraper.run(settings.real_s(settings.scrape_interval_s)))
    steps.task("load-meter", services.load.run(services.clock, settings.real_s(SAMPLE_EVERY_S)))
    steps.task("outcome-log-writer", services.outcomes.run())
    steps.task("metrics-push", services.telemetry.run())
    if services.load_scraper is not None:
        steps.task(
            "load-gauges", services.load_scraper.run(settings.real_s(settings.scrape_interval_s))
        )
    if services.request_log is not None:
        steps.task("request-log-writer", services.request_log.run())
    reload = services.policy.requested.set
    await steps.open("sighup", _ignore_sighup, lambda: _on_sighup(reload))


def _on_sighup(reload: Callable[[], None]) -> None:
    """SIGHUP reloads the policy (where the loop can take signals)."""
    with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, reload)


def _ignore_sighup() -> None:
    with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
        asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)


async def _done(result: Awaitable[None] | None) -> None:
    if inspect.isawaitable(result):
        await result
