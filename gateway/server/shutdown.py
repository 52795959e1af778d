"""The end of serving: a graceful stop on SIGTERM.

In order: the gate starts draining at once, so ``/readyz`` answers 503 and every new request
to the OpenAI routes is refused with 503, ``Retry-After`` and ``Connection: close`` (a client
retries elsewhere); after ``delay_s``, for load balancers to see it, the port closes and
uvicorn drains: idle connections are closed, answers in flight (streams included) have
``drain_s`` to finish, then the lifespan stops the background work, and the process exits 0.
SIGINT (an operator at a terminal) skips the delay; a second signal skips it too.

Must not: decide anything about requests; the gate does that.

Explained for operators, with its numbers, in docs/operations.md ("Stopping").
"""

from __future__ import annotations

import logging
import signal
import time
from types import FrameType

import uvicorn

from gateway.gate import Gate

log = logging.getLogger(__name__)


class DrainingServer(uvicorn.Server):
    """uvicorn's server with the delay in front of its graceful stop."""

    def __init__(self, config: uvicorn.Config, gate: Gate, delay_s: float) -> None:
        super().__init__(config)
        self._gate = gate
        self._delay_s = delay_s
        self._stop_at: float | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        first = not self._gate.draining
        self._gate.draining = True
        if first and sig == signal.SIGTERM and self._delay_s > 0:
            log.info("SIGTERM: draining; the port closes in %.1f s", self._delay_s)
            self._stop_at = time.monotonic() + self._delay_s
            return
        super().handle_exit(sig, frame)
        # uvicorn raises a signal it handled again once stopped, which would end the process
        # by that signal: a graceful stop is a normal exit here.
        self._captured_signals.clear()

    async def on_tick(self, counter: int) -> bool:
        if self._stop_at is not None and time.monotonic() >= self._stop_at:
            self.should_exit = True
        return await super().on_tick(counter)
