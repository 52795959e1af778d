"""vLLM (>= 0.29 for per-request figures; ``policies/engines.py`` has the sources).

- Per request: ``metrics.speculative_decoding`` on the final usage chunk, or on a whole
  answer, with ``--per-request-spec-decode-metrics``: drafted and accepted draft tokens,
  and decode steps = T - 1 - accepted (each step emits its accepted drafts and one token of
  its own; ngram and suffix proposers draft nothing in steps without a match, and such a
  step emits one token), but at least ``num_spec_steps``, the steps that drafted: vLLM
  counts the drafts a step accepted beyond ``max_tokens`` or a stop, which the answer then
  cuts off, so T - 1 - accepted is a lower bound on the steps. So is the stream's chunk
  count, and the larger of the two is taken. ``num_draft_tokens: 0`` means "no drafts":
  every step emitted one token. Nothing to ask for: the server's flag decides. With
  ``--enable-per-request-metrics`` the same ``metrics`` has its times, measured in the
  engine (``build_per_request_timing_metrics``): ``time_to_first_token_ms`` from
  scheduling, ``queue_time_ms`` before it, and ``mean_itl_ms``, decode time over the tokens
  after the first.
- Assembly is faithful: a whole answer assembled from its stream is the one it gives whole,
  field by field (``gateway/forward/assemble.py``).
- Pool counters: ``/metrics``, ``vllm:spec_decode_num_drafts_total``,
  ``..._num_draft_tokens_total`` and ``..._num_accepted_tokens_total`` (summed over
  engines and label sets), and ``vllm:generation_tokens_total`` as ``work`` (it grows
  whether or not the server drafts). Load: ``vllm:num_requests_running`` plus
  ``vllm:num_requests_waiting``.
- ``speclane init``: ``/metrics`` has ``vllm:spec_decode_*`` series only when the server
  speculates, and ``..._num_accepted_tokens_per_pos`` one series per draft position from
  the start: their count is k. An OpenAI-compatible server no other engine claims is taken
  for vLLM.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from backends.counters import SpecCounters, summed
from gateway.engines.engine import Drain, Engine, Evidence, Fetch, Said, Timings
from gateway.engines.recognition import (
    Found,
    Pages,
    answered,
    probe_evidence,
    version_at_least,
)
from policies.model import Engine as Named

PER_REQUEST = (0, 29)  # the first vLLM with --per-request-spec-decode-metrics
LOAD = frozenset({"vllm:num_requests_running", "vllm:num_requests_waiting"})
_NAMES = {
    "vllm:spec_decode_num_drafts": "drafts",
    "vllm:spec_decode_num_draft_tokens": "draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "accepted_tokens",
    "vllm:generation_tokens": "work",
}
_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"


@dataclass(frozen=True, slots=True)
class SpecDecoding:
    """``metrics.speculative_decoding`` of one answer."""

    spec: Mapping[str, Any]

    @property
    def tokens_per_step(self) -> float | None:
        return None

    def said(self, tokens: int, k: int, chunk_steps: int) -> Said | None:
        spec = self.spec
        if "num_draft_tokens" not in spec:
            return None
        decoded = tokens - 1
        drafted = int(spec.get("num_draft_tokens") or 0)
        accepted = int(spec.get("num_accepted_draft_tokens") or 0) if drafted else 0
        drafting = count(spec.get("num_spec_steps")) if drafted else 0
        steps = max(decoded - accepted, drafting, chunk_steps)
        length = spec.get("mean_acceptance_length") if drafted else None
        mean = float(length) if isinstance(length, int | float) else None
        return Said(drafted, accepted, min(steps, decoded) or None, mean)


def evidence(answer: Mapping[str, Any]) -> Evidence | None:
    """A usage chunk's or a whole answer's ``metrics.speculative_decoding``."""
    metrics = answer.get("metrics")
    spec = metrics.get("speculative_decoding") if isinstance(metrics, dict) else None
    return SpecDecoding(spec) if isinstance(spec, dict) else None


def timings(answer: Mapping[str, Any]) -> Timings | None:
    """A usage chunk's or a whole answer's ``metrics``' times."""
    metrics = answer.get("metrics")
    if not isinstance(metrics, dict):
        return None
    first, queue, per_token = (
        _seconds(metrics.get(k)) for k in ("time_to_first_token_ms", "queue_time_ms", "mean_itl_ms")
    )
    return Timings(first, queue, per_token)


def _seconds(ms: object) -> float | None:
    if isinstance(ms, int | float) and not isinstance(ms, bool) and ms >= 0:
        return float(ms) / 1000.0
    return None


def count(value: object) -> int:
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
    return value if ok else 0  # type: ignore[return-value]


def parse(text: str) -> SpecCounters:
    """The spec-decode counters of one vLLM ``/metrics`` page (zeros when absent)."""
    return summed(text, _NAMES)


class Counters:
    """Reads each endpoint's ``/metrics`` counters."""

    __slots__ = ("_fetch",)

    def __init__(self, fetch: Fetch, drain: Drain) -> None:
        self._fetch = fetch

    async def read(self, url: str) -> SpecCounters:
        return parse(await self._fetch(url.rstrip("/") + "/metrics"))

    @property
    def lost(self) -> Mapping[str, float]:
        return {}


@dataclass(frozen=True, slots=True)
class VllmPage:
    """A vLLM ``/metrics`` page: whether speculation series exist, k, and the totals."""

    speculates: bool
    k: int | None
    drafts: float
    generated: float


def page(text: str) -> VllmPage:
    """The speculation series of a Prometheus page; ``ValueError`` when it is not one."""
    speculates = False
    positions: set[str] = set()
    drafts = generated = 0.0
    try:
        families = list(text_string_to_metric_families(text))
    except ValueError as exc:
        raise ValueError(f"not a Prometheus page: {exc}") from None
    for family in families:
        speculates = speculates or family.name.startswith("vllm:spec_decode")
        for sample in family.samples:
            if not sample.name.endswith("_total"):
                continue
            if family.name == _PER_POS and "position" in sample.labels:
                positions.add(sample.labels["position"])
            elif family.name == "vllm:spec_decode_num_draft_tokens":
                drafts += sample.value
            elif family.name == "vllm:generation_tokens":
                generated += sample.value
    return VllmPage(speculates, len(positions) or None, drafts, generated)


def page_evidence(pages: Pages) -> tuple[VllmPage | None, list[str]]:
    """The ``/metrics`` page read, and what it shows, for the evidence lines."""
    shown = page(pages.metrics) if pages.metrics else None
    if shown is None:
        return None, ["no Prometheus /metrics page"]
    if shown.speculates:
        k = f"k={shown.k} from the per-position counters" if shown.k else "k not shown"
        return shown, [f"vllm:spec_decode_* series on /metrics ({k})"]
    return shown, ["no vllm:spec_decode_* series on /metrics: it does not speculate"]


def recognise(pages: Pages) -> Found:
    shown, evidence = page_evidence(pages)
    return Found(
        pages.url,
        pages.models.ids,
        Named.VLLM,
        pages.version,
        shown.speculates if shown is not None else None,
        shown.k if shown is not None else None,
        None,
        answered(pages, lambda a: a.per_request),
        (*evidence, *probe_evidence(pages)),
    )


def advice(found: Found) -> list[str]:
    new_enough = version_at_least(found.version, PER_REQUEST)
    flag = "--per-request-spec-decode-metrics summary"
    if found.per_request:
        return []
    if new_enough is False:
        return [
            f"{found.url}: vLLM {found.version} has no per-request speculation figures; "
            f"vLLM >= 0.29 started with {flag} puts them on each answer"
        ]
    if found.per_request is None:
        return [f"{found.url}: per-request metrics not checked (no probe); vLLM needs {flag}"]
    return [
        f"{found.url}: answers carry no metrics.speculative_decoding: start vLLM with {flag} "
        "so each answer says its acceptance (until then speclane counts chunks)"
    ]


ENGINE = Engine(
    name=Named.VLLM.value,
    evidence=evidence,
    whole=evidence,
    timings=timings,
    assembles=True,
    figures=Counters,
    load=LOAD,
    owners=frozenset({"vllm"}),
    recognise=recognise,
    advice=advice,
)
