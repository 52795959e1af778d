"""What each request came to, for the pilot report (``speclane report``): the newest records
in memory for ``GET /admin/outcomes``, and, when asked (``SPECLANE_OUTCOME_LOG``), every one
as a line of JSON in a size-capped file that rotates once (``FILE`` and ``FILE.1``). (The
request log, ``requestlog.py``, is another thing: the requests themselves, for replay.)

A record holds numbers and labels only: never a prompt, an answer, an API key or a user id;
the tenant appears as a hash. Recording keeps the finished ``Outcome`` as it is (no work on
the request path); it becomes JSON when read or written, and the file is written by the
lifespan's task every second, in a worker thread.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson

from gateway.measure.acceptance import Outcome

log = logging.getLogger(__name__)
Price = Callable[[str], "float | None"]


def record(outcome: Outcome, at: float, price: float | None) -> dict[str, Any]:
    """One outcome as the report reads it."""
    labels = outcome.labels
    tenant = hashlib.sha256(labels.tenant.encode()).hexdigest()[:16] if labels.tenant else ""
    return {
        "at": round(at, 3),
        "request_id": labels.request_id,
        "model": labels.model,
        "rule": labels.rule,
        "slice": labels.slice,
        "arm": labels.arm,
        "pool": labels.pool,
        "endpoint": labels.endpoint,
        "k": labels.k,
        "shadow": labels.shadow,
        "probe": labels.probe,
        "tenant": tenant,
        "status": outcome.status.value,
        "signal": outcome.signal.value,
        "finish_reason": outcome.finish_reason,
        "prompt_tokens": outcome.prompt_tokens,
        "cached_tokens": outcome.cached_tokens,
        "completion_tokens": outcome.completion_tokens,
        "duration_s": outcome.duration_s,
        "ttft_s": outcome.ttft_s,
        "tpot_s": outcome.tpot_s,
        "decode_s": outcome.decode_s,
        "admission_s": outcome.admission_s,
        "queue_s": outcome.queue_s,
        "steps": outcome.steps,
        "drafted": outcome.drafted,
        "accepted": outcome.accepted,
        "serving_s": outcome.serving_s,
        "cost_per_hour": price,
        "checks": [list(check) for check in outcome.checks],
    }


class OutcomeLog:
    """The newest ``keep`` records, and the file when there is one."""

    def __init__(
        self,
        price: Price,
        *,
        keep: int = 10_000,
        path: Path | None = None,
        max_bytes: int = 100 * 1024 * 1024,
    ) -> None:
        self._price = price
        self._recent: deque[tuple[float, Outcome]] = deque(maxlen=keep)
        self._pending: list[tuple[float, Outcome]] = []
        self._path = path
        self._max_bytes = max_bytes

    def add(self, outcome: Outcome, at: float) -> None:
        entry = (at, outcome)
        self._recent.append(entry)
        if self._path is not None:
            self._pending.append(entry)

    def recent(self, since: float = 0.0, limit: int | None = None) -> list[dict[str, Any]]:
        """Records newer than ``since``, oldest first; the newest ``limit`` of them."""
        chosen = [e for e in self._recent if e[0] > since]
        if limit is not None:
            chosen = chosen[-limit:]
        return [record(o, at, self._price(o.labels.pool)) for at, o in chosen]

    def _lines(self, entries: list[tuple[float, Outcome]]) -> Iterator[bytes]:
        for at, outcome in entries:
            yield orjson.dumps(record(outcome, at, self._price(outcome.labels.pool))) + b"\n"

    def flush(self) -> None:
        """Write what is pending, rotating first when the file would pass its cap."""
        if self._path is None or not self._pending:
            return
        entries, self._pending = self._pending, []
        data = b"".join(self._lines(entries))
        path = self._path
        try:
            size = path.stat().st_size if path.exists() else 0
            if size and size + len(data) > self._max_bytes:
                path.replace(path.with_name(path.name + ".1"))
            with path.open("ab") as out:
                out.write(data[: self._max_bytes])
        except OSError as exc:  # a full or read-only disk must not stop the gateway
            log.warning("request log %s: %s; %d records dropped", path, exc, len(entries))

    async def run(self, interval_s: float = 1.0) -> None:
        """The lifespan's writer: flushes in a worker thread, and once more when stopped."""
        try:
            while True:
                await asyncio.sleep(interval_s)
                await asyncio.to_thread(self.flush)
        finally:
            self.flush()
