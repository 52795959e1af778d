"""Checking structured answers without holding up the event loop (step 7's side).

A short answer (up to ``inline_bytes``) is checked at once, when its request finishes: a
parse and a compiled validation take microseconds. A longer one is checked in a worker
thread and its outcome recorded when the check is done; at most ``max_pending`` wait at
once, and answers beyond ``max_bytes`` or beyond that queue are counted as ``skipped``
rather than checked late. Only answers the client got are checked: not cancelled or failed
ones, not shadow mirrors.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace

from gateway.measure.acceptance import Outcome, Status
from gateway.measure.validity import TOOL_CALL, Collected, Expectation, Schemas


class Checks:
    def __init__(
        self,
        record: Callable[[Outcome], None],
        *,
        inline_bytes: int = 64 * 1024,
        max_bytes: int = 4 * 1024 * 1024,
        max_pending: int = 4,
    ) -> None:
        self.schemas = Schemas()
        self._record = record
        self._inline = inline_bytes
        self._max_bytes = max_bytes
        self._max_pending = max_pending
        self._tasks: set[asyncio.Task[None]] = set()

    def finish(
        self, outcome: Outcome, expectation: Expectation | None, collected: Collected | None
    ) -> None:
        """Record ``outcome``, with the checks of its answer when it has one to check."""
        if (
            expectation is None
            or collected is None
            or outcome.status is not Status.OK
            or outcome.labels.shadow
        ):
            self._record(outcome)
            return
        if collected.size <= self._inline:
            checked = self.schemas.check(expectation, collected.choices())
            self._record(replace(outcome, checks=checked))
            return
        if collected.size > self._max_bytes or len(self._tasks) >= self._max_pending:
            kind = expectation.format or TOOL_CALL
            self._record(replace(outcome, checks=((kind, "skipped"),)))
            return
        task = asyncio.get_running_loop().create_task(self._later(outcome, expectation, collected))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _later(
        self, outcome: Outcome, expectation: Expectation, collected: Collected
    ) -> None:
        try:
            checked = await asyncio.to_thread(self.schemas.check, expectation, collected.choices())
        except asyncio.CancelledError:
            self._record(outcome)
            raise
        self._record(replace(outcome, checks=checked))

    async def close(self) -> None:
        """Record what is still waiting, unchecked (shutdown)."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
