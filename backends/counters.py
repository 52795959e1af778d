"""vLLM's speculative-decoding counters from a ``/metrics`` page, and their differences.

Reads ``vllm:spec_decode_num_drafts_total``, ``..._num_draft_tokens_total`` and
``..._num_accepted_tokens_total`` (summed over engines and label sets) with
prometheus-client's text parser. ``CounterDelta`` differences two readings, treating a
counter that went down as a restart of the server. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

_NAMES = {
    "vllm:spec_decode_num_drafts": "drafts",
    "vllm:spec_decode_num_draft_tokens": "draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "accepted_tokens",
}


@dataclass(frozen=True, slots=True)
class SpecCounters:
    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted_tokens: float = 0.0

    def minus(self, earlier: SpecCounters) -> SpecCounters:
        """What happened since ``earlier``; after a server restart, everything since it."""
        if self.draft_tokens < earlier.draft_tokens or self.drafts < earlier.drafts:
            return self
        return SpecCounters(
            self.drafts - earlier.drafts,
            self.draft_tokens - earlier.draft_tokens,
            self.accepted_tokens - earlier.accepted_tokens,
        )

    def plus(self, other: SpecCounters) -> SpecCounters:
        return SpecCounters(
            self.drafts + other.drafts,
            self.draft_tokens + other.draft_tokens,
            self.accepted_tokens + other.accepted_tokens,
        )

    @property
    def acceptance(self) -> float | None:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else None


def parse(text: str) -> SpecCounters:
    """The spec-decode counters of one ``/metrics`` page (zeros when absent)."""
    totals = dict.fromkeys(_NAMES.values(), 0.0)
    for family in text_string_to_metric_families(text):
        field = _NAMES.get(family.name)
        if field is None:
            continue
        for sample in family.samples:
            if sample.name.endswith("_total"):
                totals[field] += sample.value
    return SpecCounters(**totals)
