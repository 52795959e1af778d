"""Step 6 of a request: measure it. A pure fold over upstream stream events -> ``Outcome``.

Each signal reports what it can honestly see (docs/measuring.md, "The signals"), and the
outcome says which one it used. The universal quantity is *tokens per engine step* after
the first token (prefill), which sets the speed, is comparable across k and is visible to
every signal; the draft acceptance rate is reported only where drafts are visible.

1. ``per_request``: what the answer says of its own speculation, as its engine gives it
   and its module in ``gateway/engines/`` reads it (an ``Evidence``, handed to
   ``Fold.evidence``): drafted and accepted draft tokens and the decode steps, where the
   engine counts them, or only the decode steps, where it says its tokens per step. The
   engine module's docstring says which of its fields, and why some engines give none.
2. ``chunks``: engines send one chunk per engine step holding every token of that step
   (at a stream interval of 1); the first chunk is prefill's one token, so decode steps =
   content chunks - 1. Nothing about drafts: a step that emitted one token may have drafted
   k or none. Biased towards fewer steps when the server merges steps
   (``--stream-interval`` > 1) or a reader lags.
3. Pool counters and 4. speed are per pool, not per request; a speculative request without
   1 or 2 says ``speed`` (only its time per output token is known).

A standard pool's request says ``none``: it has nothing to measure, and its decode steps are
T - 1 (one token each) by construction.

No I/O and no clock: every time is an argument.

Explained for operators, with its numbers, in docs/measuring.md ("The signals").
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from gateway.engines import Evidence

# a first read whose text is that of this many mean tokens beyond one a chunk was merged
MERGED_TOKENS = 4.0


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
    engine: str = "vllm"
    arm: str = ""
    request_id: str = ""  # the client's request (a shadow mirror's is the one it mirrors)
    route: str = "/v1/chat/completions"  # the path it came in on
    parent: str = ""  # the slice ``slice`` was split from, when splitting is on
    candidates: tuple[tuple[str, str], ...] = ()  # its value per split key (hashes)


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one finished, failed or cancelled request taught us. ``load`` and ``prefill``
    are what its endpoint carried while it ran (``gateway/measure/load.py``): the mean
    requests in flight, the prompt tokens other requests prefilled per step it decoded, and
    the prompt tokens its endpoint's cache held meanwhile (``kv``), its own among them, and
    the requests decoding there meanwhile (``batch``). ``cached_tokens``: the prompt tokens
    its engine's prefix cache held, None when the answer did not say (vLLM says with
    ``--enable-prompt-tokens-details``)."""

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
    steps: int | None = None
    decode_s: float | None = None
    load: float | None = None
    prefill: float | None = None
    kv: float | None = None
    batch: float | None = None
    admission_s: float | None = None
    queue_s: float | None = None
    checks: tuple[tuple[str, str], ...] = ()
    cached_tokens: int | None = None

    @property
    def serving_s(self) -> float | None:
        """Endpoint-seconds this request used: its time upstream over the mean requests in
        flight on its endpoint meanwhile (its share of the server); None without a load."""
        busy = self.duration_s - (self.admission_s or 0.0)
        if busy <= 0 or not self.load:
            return None
        return busy / max(self.load, 1.0)

    @property
    def upstream_wait_s(self) -> float | None:
        """From the decision to the first token: connecting, failed tries, the engine's
        queue and prefill."""
        if self.ttft_s is None or self.admission_s is None:
            return None
        return max(self.ttft_s - self.admission_s, 0.0)

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def tokens_per_step(self) -> float | None:
        """Decode tokens (after the first) per engine step, where the steps are known."""
        if not self.steps or self.completion_tokens < 2:
            return None
        return (self.completion_tokens - 1) / self.steps


class Fold:
    """Accumulates one stream; ``finish`` turns it into an ``Outcome``. ``decided_at`` is
    when the gateway had decided and went upstream (its admission ends there)."""

    __slots__ = (
        "_chars",
        "_chunks",
        "_decided",
        "_evidence",
        "_first",
        "_first_chars",
        "_first_read",
        "_reads",
        "_finish_reason",
        "_labels",
        "_last",
        "_queue",
        "_started",
        "_usage",
    )

    def __init__(self, labels: Labels, started_at: float, decided_at: float | None = None) -> None:
        self._labels = labels
        self._started = started_at
        self._decided = decided_at
        self._chunks = 0
        self._first: float | None = None
        self._first_read = 0
        self._reads = 0
        self._chars = self._first_chars = 0
        self._last = started_at
        self._usage: dict[str, Any] = {}
        self._finish_reason: str | None = None
        self._queue: float | None = None
        self._evidence: Evidence | None = None

    @property
    def labels(self) -> Labels:
        return self._labels

    def content(self, now: float, finish_reason: str | None = None, chars: int = 0) -> None:
        """A chunk that carried output tokens arrived at ``now``, ``chars`` characters of
        the first choice's text among them."""
        if self._first is None:
            self._first = now
        self._chars += chars
        if now == self._first:
            self._first_read += 1
            self._first_chars += chars
        elif now != self._last:
            self._reads += 1  # a read after the first
        self._chunks += 1
        self._last = now
        if finish_reason:
            self._finish_reason = finish_reason

    def finished(self, finish_reason: str) -> None:
        self._finish_reason = finish_reason

    def usage(self, usage: dict[str, Any], queue_s: float | None = None) -> None:
        """The answer's usage, and the time it queued in the engine where it says so
        (``Engine.timings``)."""
        self._usage = usage
        if queue_s is not None:
            self._queue = queue_s

    def evidence(self, evidence: Evidence) -> None:
        """What the answer says of its own speculation, as its engine reads it."""
        self._evidence = evidence

    def finish(self, status: Status, now: float, error: str = "") -> Outcome:
        tokens = int(self._usage.get("completion_tokens") or 0)
        signal, drafted, accepted, steps, length = self._signal(tokens)
        ttft = None if self._first is None else self._first - self._started
        tpot = decode = None
        if self._first is not None and tokens > 1:
            decode = self._decode_s(tokens)
            tpot = None if decode is None else decode / (tokens - 1)
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
            steps=steps,
            decode_s=decode,
            admission_s=None if self._decided is None else self._decided - self._started,
            queue_s=self._queue,
            cached_tokens=_cached(self._usage),
        )

    def _signal(self, tokens: int) -> tuple[Signal, int, int, int | None, float | None]:
        """(signal, drafted, accepted, decode steps, mean acceptance length) from the best
        signal there is."""
        k = self._labels.k
        decoded = tokens - 1
        if k is None:
            return Signal.NONE, 0, 0, decoded if decoded > 0 else None, None
        if self._evidence is not None:
            said = self._evidence.said(tokens, k, self._stepped_chunks())
            if said is not None:
                return Signal.PER_REQUEST, said.drafted, said.accepted, said.steps, said.mean_length
        if self._labels.chunk_signal and decoded > 0 and self._chunks >= 2:
            # a step emits at most k + 1 tokens: fewer chunks than that means merged steps
            return Signal.CHUNKS, 0, 0, max(self._chunks - 1, -(-decoded // (k + 1))), None
        return Signal.SPEED, 0, 0, None, None

    def _decode_s(self, tokens: int) -> float | None:
        """The answer's decode time, from its chunks' arrivals: the span from the first read
        to the last, over the share of the answer's tokens that came after the first read.
        Arrivals show the steps only where the output came apart: a read that carries several
        chunks came late (the reader, or something between it and the engine, held them), and
        a chunk that carries several steps' tokens was held in the engine's server (vLLM's
        merges the outputs its client has not taken yet), so their steps ran before them. The
        share after the first read is told by the chunks, or by the text (the characters
        after it, the tokens at least one a chunk) where the first read's text is that of
        ``MERGED_TOKENS`` mean tokens or more beyond one a chunk: one token's text may be a
        few times the mean, and the text is not read closer than that. When the chunks after
        the first read came in fewer reads than half their number, or nothing came after it,
        the arrivals say too little of the steps: None (the step-time fit then falls back on
        the duration)."""
        after = self._chunks - self._first_read
        if self._first is None or after <= 0 or 2 * self._reads < after:
            return None
        share = after / (self._chunks - 1)
        first = tokens * self._first_chars / self._chars if self._chars > 0 else 0.0
        if first - self._first_read >= MERGED_TOKENS:
            share = min(max(tokens - first, after) / (tokens - 1), share)
        return (self._last - self._first) / share

    def _stepped_chunks(self) -> int:
        """Decode steps as a stream of one chunk per step shows them: a lower bound (a
        server or a lagging reader may merge steps), 0 where chunks do not show steps."""
        return self._chunks - 1 if self._labels.chunk_signal and self._chunks >= 2 else 0


def _cached(usage: dict[str, Any]) -> int | None:
    """``usage.prompt_tokens_details.cached_tokens``, where the answer gave it."""
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    if isinstance(cached, int) and not isinstance(cached, bool) and cached >= 0:
        return cached
    return None
