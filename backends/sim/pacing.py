"""When a simulated answer's tokens leave the server, and vLLM's timing metrics of them.

``Chunker`` groups engine steps into SSE chunks as vLLM's output processor does with
``--stream-interval``; ``timings`` computes ``--enable-per-request-metrics``' fields from
the engine's timestamps of one request.

Pure: no I/O, no clock reads (timestamps come in).
"""

from __future__ import annotations

from collections.abc import Iterable

from backends.sim.engine import StepEvent, Timestamps
from backends.sim.responses import Timings

Span = tuple[int, int, bool]  # first token, end token, finished


class Chunker:
    """Which steps' tokens go out together, as vLLM's output processor decides: at once
    for the first token and when the answer is finished, otherwise once ``interval``
    tokens are waiting (``--stream-interval`` counts tokens, not steps)."""

    __slots__ = ("_begin", "_interval")

    def __init__(self, interval: int) -> None:
        self._interval = interval
        self._begin: int | None = None

    def add(self, event: StepEvent) -> Span | None:
        begin = event.start if self._begin is None else self._begin
        end = event.start + event.tokens
        if event.finished or event.start == 0 or end - begin >= self._interval:
            self._begin = None
            return begin, end, event.finished
        self._begin = begin
        return None


def spans(events: Iterable[StepEvent], interval: int) -> list[Span]:
    chunker = Chunker(interval)
    return [span for event in events if (span := chunker.add(event)) is not None]


def timings(times: Timestamps, tokens: int) -> Timings:
    """vLLM's ``build_per_request_timing_metrics``: TTFT from scheduling (queue time apart),
    decode time from the first token to the last, inter-token latency over the decode, and
    tokens per second over scheduling to the last token. A missing timestamp gives null."""
    out: Timings = {}
    ms = 1000.0
    if times.scheduled and times.first_token:
        out["time_to_first_token_ms"] = (times.first_token - times.scheduled) * ms
    if times.first_token and times.last_token:
        decode = times.last_token - times.first_token
        out["generation_time_ms"] = decode * ms
        if tokens > 1:
            out["mean_itl_ms"] = decode / (tokens - 1) * ms
    if times.queued and times.scheduled:
        out["queue_time_ms"] = (times.scheduled - times.queued) * ms
    if times.scheduled and times.last_token and times.last_token > times.scheduled:
        out["tokens_per_second"] = tokens / (times.last_token - times.scheduled)
    return out
