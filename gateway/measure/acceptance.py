"""Step 6 of a request: measure it. A pure fold over upstream stream events -> ``Outcome``.

Each signal reports what it can honestly see (docs/measuring.md, "The signals"), and the
outcome says which one it used. The universal quantity is *tokens per engine step* after
the first token (prefill), which sets the speed, is comparable across k and is visible to
every signal; the draft acceptance rate is reported only where drafts are visible.

1. ``per_request``: vLLM >= 0.29's ``metrics.speculative_decoding`` on the final usage
   chunk: drafted and accepted draft tokens, and decode steps = T - 1 - accepted (each
   step emits its accepted drafts and one token of its own; ngram and suffix proposers
   draft nothing in steps without a match, and such a step emits one token), but at least
   ``num_spec_steps``, the steps that drafted: vLLM counts the drafts a step accepted
   beyond ``max_tokens`` or a stop, which the answer then cuts off, so T - 1 - accepted is
   a lower bound on the steps. So is the stream's chunk count (below), and the larger of
   the two is taken. ``num_draft_tokens: 0`` means "no drafts": every step emitted one
   token. SGLang (0.5.23 read here) streams
   ``sglext.spec_tokens_details`` when a request asks with ``return_spec_tokens_details``
   (speclane asks on its own account and drops the chunk again): ``spec_verify_ct`` verify
   steps, ``spec_num_proposed_drafts`` and ``spec_num_correct_drafts``. TensorRT-LLM's
   answers say ``avg_decoded_tokens_per_iter``: the request's generated tokens over its
   decoding iterations, prefill's included, so decode steps = T / avg - 1 (no drafts).
   Engines other than vLLM (``policies/engines.py``) have any ``speculative_decoding`` they
   send ignored: a fused Neuron step schedules no drafts, so such a field would say every
   step emitted one token.
2. ``chunks``: vLLM sends one chunk per engine step holding every token of that step, and
   so do vllm-neuron (several tokens per chunk), SGLang and TensorRT-LLM at stream interval
   1; the first chunk is prefill's one token, so decode steps = content chunks - 1. Nothing
   about drafts: a step that emitted one token may have drafted k or none. Biased towards
   fewer steps when the server merges steps (``--stream-interval`` > 1) or a reader lags.
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

_DRAFTS_PER_REQUEST = frozenset({"vllm"})  # engines whose metrics.speculative_decoding counts


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


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one finished, failed or cancelled request taught us. ``load`` and ``prefill``
    are what its endpoint carried while it ran (``gateway/measure/load.py``): the mean
    requests in flight, and the prompt tokens other requests prefilled per step it decoded."""

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
    admission_s: float | None = None
    queue_s: float | None = None
    checks: tuple[tuple[str, str], ...] = ()

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
        "_chunks",
        "_decided",
        "_first",
        "_finish_reason",
        "_labels",
        "_last",
        "_metrics",
        "_per_step",
        "_queue",
        "_sglang",
        "_started",
        "_usage",
    )

    def __init__(self, labels: Labels, started_at: float, decided_at: float | None = None) -> None:
        self._labels = labels
        self._started = started_at
        self._decided = decided_at
        self._chunks = 0
        self._first: float | None = None
        self._last = started_at
        self._usage: dict[str, Any] = {}
        self._metrics: dict[str, Any] = {}
        self._finish_reason: str | None = None
        self._per_step: float | None = None
        self._queue: float | None = None
        self._sglang: tuple[int, int, int] | None = None

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
        if not isinstance(metrics, dict):
            return
        spec = metrics.get("speculative_decoding")
        if isinstance(spec, dict) and self._labels.engine in _DRAFTS_PER_REQUEST:
            self._metrics = spec
        queue = metrics.get("queue_time_ms")  # vLLM's --enable-per-request-metrics
        if isinstance(queue, int | float) and not isinstance(queue, bool) and queue >= 0:
            self._queue = queue / 1000.0

    def sglang(self, ext: object) -> None:
        """SGLang's ``sglext.spec_tokens_details`` (asked for with
        ``return_spec_tokens_details``): its verify steps are the decode steps, and its
        proposed and correct drafts the draft counts."""
        details = ext.get("spec_tokens_details") if isinstance(ext, dict) else None
        if isinstance(details, list):  # n > 1: one per choice, which no signal describes
            return
        if isinstance(details, dict) and _count(details.get("spec_verify_ct")) > 0:
            self._sglang = (
                _count(details.get("spec_verify_ct")),
                _count(details.get("spec_num_proposed_drafts")),
                _count(details.get("spec_num_correct_drafts")),
            )

    def answered(self, choices: object) -> None:
        """A whole answer's ``choices``: what they say of tokens per step."""
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            self.tokens_per_iteration(choices[0].get("avg_decoded_tokens_per_iter"))

    def tokens_per_iteration(self, value: object) -> None:
        """TensorRT-LLM's ``avg_decoded_tokens_per_iter`` as an answer or chunk gave it."""
        if isinstance(value, int | float) and not isinstance(value, bool) and value >= 1:
            self._per_step = float(value)

    def finish(self, status: Status, now: float, error: str = "") -> Outcome:
        tokens = int(self._usage.get("completion_tokens") or 0)
        signal, drafted, accepted, steps = self._signal(tokens)
        ttft = None if self._first is None else self._first - self._started
        tpot = decode = None
        if self._first is not None and tokens > 1 and self._last > self._first:
            decode = self._last - self._first
            tpot = decode / (tokens - 1)
        length = self._metrics.get("mean_acceptance_length") if drafted else None
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
            mean_acceptance_length=float(length) if isinstance(length, int | float) else None,
            finish_reason=self._finish_reason,
            error=error,
            steps=steps,
            decode_s=decode,
            admission_s=None if self._decided is None else self._decided - self._started,
            queue_s=self._queue,
        )

    def _signal(self, tokens: int) -> tuple[Signal, int, int, int | None]:
        """(signal, drafted, accepted, decode steps) from the best signal there is."""
        k = self._labels.k
        decoded = tokens - 1
        if k is None:
            return Signal.NONE, 0, 0, decoded if decoded > 0 else None
        if "num_draft_tokens" in self._metrics:
            drafted = int(self._metrics.get("num_draft_tokens") or 0)
            accepted = int(self._metrics.get("num_accepted_draft_tokens") or 0) if drafted else 0
            drafting = _count(self._metrics.get("num_spec_steps")) if drafted else 0
            steps = max(decoded - accepted, drafting, self._stepped_chunks())
            return Signal.PER_REQUEST, drafted, accepted, min(steps, decoded) or None
        if self._sglang is not None and decoded > 0:
            steps, drafted, accepted = self._sglang
            return Signal.PER_REQUEST, drafted, min(accepted, drafted), min(steps, decoded)
        if self._per_step is not None and decoded > 0:
            steps = round(tokens / self._per_step) - 1
            return Signal.PER_REQUEST, 0, 0, min(max(steps, -(-decoded // (k + 1))), decoded)
        if self._labels.chunk_signal and decoded > 0 and self._chunks >= 2:
            # a step emits at most k + 1 tokens: fewer chunks than that means merged steps
            return Signal.CHUNKS, 0, 0, max(self._chunks - 1, -(-decoded // (k + 1)))
        return Signal.SPEED, 0, 0, None

    def _stepped_chunks(self) -> int:
        """Decode steps as a stream of one chunk per step shows them: a lower bound (a
        server or a lagging reader may merge steps), 0 where chunks do not show steps."""
        return self._chunks - 1 if self._labels.chunk_signal and self._chunks >= 2 else 0


def _count(value: object) -> int:
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
    return value if ok else 0  # type: ignore[return-value]
