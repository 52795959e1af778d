"""Step 6 of a request: measure it. A pure fold over upstream stream events -> ``Outcome``.

Acceptance comes from the best signal the request carries (DESIGN.md, "Measuring acceptance"):

1. ``per_request``: vLLM >= 0.29's ``metrics.speculative_decoding`` on the final usage chunk.
2. ``chunks``: vLLM sends one chunk per engine step holding every token accepted in that step.
   The first content chunk comes from prefill with one token, so with T completion tokens in
   C content chunks the mean acceptance length is L = (T - 1) / (C - 1), drafted tokens are
   k * (C - 1) and accepted ones T - C. Biased upward when the server merges steps into one
   chunk (``--stream-interval`` > 1, or a reader that lags behind the socket): fewer chunks
   for the same tokens read as longer acceptance. The gateway reads promptly to keep it low.
3. Pool counters and 4. speed are per pool, not per request; a request without 1 or 2 says
   ``speed`` (a speculative pool: only its time per output token is known) or ``none``.

No I/O and no clock: every time is an argument.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class Signal(StrEnum):
    PER_REQUEST = "per_request"
    CHUNKS = "chunks"
    SPEED = "speed"
    NONE = "none"


class Status(StrEnum):
    OK = "ok"
    ERROR = "error"
    CANCELLED = "cancelled"


@dataclass(frozen=True, slots=True)
class Labels:
    """Where a request went, as the decision and the failover loop left it."""

    model: str
    rule: str
    slice: str
    pool: str
    k: int | None
    endpoint: str = ""
    shadow: bool = False
    probe: bool = False
    tenant: str = ""
    epoch: int = 0
    chunk_signal: bool = True


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one finished, failed or cancelled request taught us."""

    labels: Labels
    status: Status
    started_at: float
    duration_s: float
    ttft_s: float | None
    tpot_s: float | None
    prompt_tokens: int
    completion_tokens: int
    chunks: int
    signal: Signal
    drafted: int = 0
    accepted: int = 0
    mean_acceptance_length: float | None = None
    finish_reason: str | None = None
    error: str = ""

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None


class Fold:
    """Accumulates one stream; ``finish`` turns it into an ``Outcome``."""

    __slots__ = (
        "_chunks",
        "_first",
        "_finish_reason",
        "_labels",
        "_last",
        "_metrics",
        "_started",
        "_usage",
    )

    def __init__(self, labels: Labels, started_at: float) -> None:
        self._labels = labels
        self._started = started_at
        self._chunks = 0
        self._first: float | None = None
        self._last = started_at
        self._usage: dict[str, Any] = {}
        self._metrics: dict[str, Any] = {}
        self._finish_reason: str | None = None

    def content(self, now: float, finish_reason: str | None = None) -> None:
        """A chunk that carried output tokens arrived at ``now``."""
        self._chunks += 1
        if self._first is None:
            self._first = now
        self._last = now
        if finish_reason:
            self._finish_reason = finish_reason

    def finished(self, finish_reason: str) -> None:
        self._finish_reason = finish_reason

    def usage(self, usage: dict[str, Any], metrics: dict[str, Any] | None) -> None:
        self._usage = usage
        spec = metrics.get("speculative_decoding") if isinstance(metrics, dict) else None
        if isinstance(spec, dict):
            self._metrics = spec

    def finish(self, status: Status, now: float, error: str = "") -> Outcome:
        tokens = int(self._usage.get("completion_tokens") or 0)
        signal, drafted, accepted, length = self._acceptance(tokens)
        ttft = None if self._first is None else self._first - self._started
        tpot = None
        if self._first is not None and tokens > 1 and self._last > self._first:
            tpot = (self._last - self._first) / (tokens - 1)
        return Outcome(
            labels=self._labels,
            status=status,
            started_at=self._started,
            duration_s=now - self._started,
            ttft_s=ttft,
            tpot_s=tpot,
            prompt_tokens=int(self._usage.get("prompt_tokens") or 0),
            completion_tokens=tokens,
            chunks=self._chunks,
            signal=signal,
            drafted=drafted,
            accepted=accepted,
            mean_acceptance_length=length,
            finish_reason=self._finish_reason,
            error=error,
        )

    def _acceptance(self, tokens: int) -> tuple[Signal, int, int, float | None]:
        k = self._labels.k
        if k is None:
            return Signal.NONE, 0, 0, None
        drafted = int(self._metrics.get("num_draft_tokens") or 0)
        if drafted:
            accepted = int(self._metrics.get("num_accepted_draft_tokens") or 0)
            length = self._metrics.get("mean_acceptance_length")
            return Signal.PER_REQUEST, drafted, accepted, float(length) if length else None
        if self._labels.chunk_signal and tokens >= 2 and self._chunks >= 2:
            steps = self._chunks - 1
            accepted = min(max(tokens - self._chunks, 0), k * steps)
            return Signal.CHUNKS, k * steps, accepted, 1 + accepted / steps
        return Signal.SPEED, 0, 0, None
