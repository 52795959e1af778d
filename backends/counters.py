"""A pool's speculative-decoding counters (draft tokens proposed and accepted, drafts, and
the ``work`` that grows whether or not the server drafts), and their differences: each
engine's module in ``gateway/engines/`` reads its own pages into them, most through
``summed`` (counter families named onto these fields, summed over label sets).
``SpecCounters.minus`` treats a counter that went down as a restart of the server. Pure.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families


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


def summed(text: str, names: dict[str, str]) -> SpecCounters:
    totals = dict.fromkeys(("drafts", "draft_tokens", "accepted_tokens", "work"), 0.0)
    for family in text_string_to_metric_families(text):
        field = names.get(family.name)
        if field is None:
            continue
        for sample in family.samples:
            if sample.name.endswith("_total"):
                totals[field] += sample.value
    return SpecCounters(**totals)
