"""Each engine's speculative-decoding figures from its own pages, and their differences.

vLLM: ``vllm:spec_decode_num_drafts_total``, ``..._num_draft_tokens_total`` and
``..._num_accepted_tokens_total`` (summed over engines and label sets), and
``vllm:generation_tokens_total`` as ``work`` (it grows whether or not the server drafts).
TensorRT-LLM: the same from ``trtllm_spec_decode_num_{draft,accepted}_tokens_total`` and
``trtllm_generation_tokens_total`` (``/prometheus/metrics``), or the sums of one drained
``/metrics`` read of iteration stats (``drained``). SGLang: its gauges and ``/server_info``
mean, which are shown, never differenced. ``SpecCounters.minus`` treats a counter that went
down as a restart of the server. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
from prometheus_client.parser import text_string_to_metric_families

_NAMES = {
    "vllm:spec_decode_num_drafts": "drafts",
    "vllm:spec_decode_num_draft_tokens": "draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "accepted_tokens",
    "vllm:generation_tokens": "work",
}


@dataclass(frozen=True, slots=True)
class SpecCounters:
    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted_tokens: float = 0.0
    work: float = 0.0

    def minus(self, earlier: SpecCounters) -> SpecCounters:
        """What happened since ``earlier``; after a server restart, everything since it."""
        went_down = self.draft_tokens < earlier.draft_tokens or self.drafts < earlier.drafts
        if went_down or self.work < earlier.work:
            return self
        return SpecCounters(
            self.drafts - earlier.drafts,
            self.draft_tokens - earlier.draft_tokens,
            self.accepted_tokens - earlier.accepted_tokens,
            self.work - earlier.work,
        )

    def plus(self, other: SpecCounters) -> SpecCounters:
        return SpecCounters(
            self.drafts + other.drafts,
            self.draft_tokens + other.draft_tokens,
            self.accepted_tokens + other.accepted_tokens,
            self.work + other.work,
        )

    @property
    def acceptance(self) -> float | None:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else None


def parse(text: str) -> SpecCounters:
    """The spec-decode counters of one vLLM ``/metrics`` page (zeros when absent)."""
    return _summed(text, _NAMES)


def _summed(text: str, names: dict[str, str]) -> SpecCounters:
    totals = dict.fromkeys(("drafts", "draft_tokens", "accepted_tokens", "work"), 0.0)
    for family in text_string_to_metric_families(text):
        field = names.get(family.name)
        if field is None:
            continue
        for sample in family.samples:
            if sample.name.endswith("_total"):
                totals[field] += sample.value
    return SpecCounters(**totals)


_TRTLLM = {
    "trtllm_spec_decode_num_draft_tokens": "draft_tokens",
    "trtllm_spec_decode_num_accepted_tokens": "accepted_tokens",
    "trtllm_generation_tokens": "work",
}


def parse_trtllm(text: str) -> SpecCounters:
    """TensorRT-LLM's cumulative counters from ``/prometheus/metrics`` (zeros when absent);
    ``work`` is its generated tokens, which grow whether or not it drafts."""
    return _summed(text, _TRTLLM)


@dataclass(frozen=True, slots=True)
class Drained:
    """What one read of TensorRT-LLM's ``/metrics`` took off its iteration-stats queue."""

    draft_tokens: float = 0.0
    accepted_tokens: float = 0.0
    drafts: float = 0.0  # requests with draft tokens, summed over iterations
    generating: float = 0.0  # iterations that decoded anything
    iterations: int = 0
    first: int | None = None
    last: int | None = None

    def fields(self) -> dict[str, float]:
        return {
            "draft_tokens": self.draft_tokens,
            "accepted_tokens": self.accepted_tokens,
            "drafts": self.drafts,
            "work": self.generating,
            "iterations": float(self.iterations),
        }


def drained(body: bytes) -> Drained:
    """The sums of one ``/metrics`` answer of ``trtllm-serve``: a JSON list of iteration
    stats. ``ValueError`` for anything else."""
    try:
        stats = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(stats, list):
        raise ValueError("not a list of iteration stats")
    out = Drained()
    for stat in stats:
        if not isinstance(stat, dict):
            raise ValueError("an iteration stat that is not an object")
        out = _plus_iteration(out, stat)
    return out


def _plus_iteration(out: Drained, stat: dict[str, Any]) -> Drained:
    spec = stat.get("specDecodingStats") or {}
    batching = stat.get("inflightBatchingStats") or {}
    step = stat.get("iter")
    number = step if isinstance(step, int) and not isinstance(step, bool) else None
    return Drained(
        out.draft_tokens + _num(spec.get("numDraftTokens")),
        out.accepted_tokens + _num(spec.get("numAcceptedTokens")),
        out.drafts + _num(spec.get("numRequestsWithDraftTokens")),
        out.generating + (1.0 if _num(batching.get("numGenRequests")) > 0 else 0.0),
        out.iterations + 1,
        out.first if out.first is not None or number is None else number,
        number if number is not None else out.last,
    )


def _num(value: object) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and value >= 0
    return float(value) if ok else 0.0  # type: ignore[arg-type]


def sglang_gauges(text: str) -> tuple[float | None, float | None]:
    """SGLang's ``sglang:spec_accept_rate`` and ``sglang:spec_accept_length`` (gauges over
    its last log interval; None when absent or 0, which SGLang shows before any draft)."""
    rate = length = None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "sglang:spec_accept_rate" and sample.value > 0:
                rate = sample.value
            elif sample.name == "sglang:spec_accept_length" and sample.value > 0:
                length = sample.value
    return rate, length


def sglang_tokens_per_step(body: bytes) -> float | None:
    """``GET /server_info``: the mean of ``internal_states[i].avg_spec_accept_length``."""
    try:
        info = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    states = info.get("internal_states") if isinstance(info, dict) else None
    values = [
        s["avg_spec_accept_length"]
        for s in states or ()
        if isinstance(s, dict) and isinstance(s.get("avg_spec_accept_length"), int | float)
    ]
    return sum(values) / len(values) if values else None
