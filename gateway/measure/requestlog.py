"""The request log ``speclane replay --log`` reads: one JSON line per request, when asked.

With ``SPECLANE_REQUEST_LOG=PATH`` every chat or completions request the gateway decides is
appended as ``{"at": <unix seconds>, "path": ..., "body": <the request>, "headers": {...}}``.
Only the headers classification reads are kept (the endpoint and tenant headers), and the
API key never: it is replaced by the tenant it hashes to. ``add`` is O(1) and never
awaits; a background task of the lifespan writes the lines about once a second, and at
most ``max_pending`` wait (more are dropped and counted), so a slow disk never slows
requests. Off by default: a request's body is the client's data.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson

log = logging.getLogger(__name__)


class RequestLog:
    """Pending lines and the file they go to."""

    def __init__(self, path: Path, keep: tuple[str, ...], max_pending: int = 10_000) -> None:
        self.path = path
        self._keep = keep
        self._pending: deque[bytes] = deque()
        self._max = max_pending
        self.dropped = 0

    def add(
        self, at: float, path: str, body: Mapping[str, Any], headers: Mapping[str, str], tenant: str
    ) -> None:
        if len(self._pending) >= self._max:
            self.dropped += 1
            return
        kept = {k: headers[k] for k in self._keep if k in headers}
        if tenant and self._keep and self._keep[-1] not in kept:
            kept[self._keep[-1]] = tenant
        line = {"at": at, "path": path, "body": body, "headers": kept}
        self._pending.append(orjson.dumps(line) + b"\n")

    def flush(self) -> None:
        if not self._pending:
            return
        lines, self._pending = self._pending, deque()
        with self.path.open("ab") as out:
            out.writelines(lines)

    async def run(self, interval_s: float = 1.0) -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                await asyncio.to_thread(self.flush)
            except OSError as exc:  # the loop must outlive a full disk
                log.warning("request log %s: %s", self.path, exc)
