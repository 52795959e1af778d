"""TensorRT-LLM (NVIDIA/TensorRT-LLM, ``trtllm-serve``; ``policies/engines.py`` has the
sources).

- Per request: every chat chunk and whole answer carries
  ``choices[i].avg_decoded_tokens_per_iter``, the request's generated tokens over its
  decoding iterations, prefill's included: decode steps = T / avg - 1, and no drafts.
  Nothing to ask for.
- Assembly is not faithful (its answers are not vLLM's field by field, and its whole
  answers say their tokens per step): a non-streaming request passes through.
- Pool counters: ``/prometheus/metrics`` when the server has it (``return_perf_metrics``):
  cumulative ``trtllm_spec_decode_num_{draft,accepted}_tokens_total`` and
  ``trtllm_generation_tokens_total``, safe for any number of scrapers. Such a server
  drains its own iteration-stats queue into them, so ``/metrics`` is read only where
  ``/prometheus/metrics`` answers 404. ``/metrics`` hands each iteration to exactly one
  reader and forgets it: every read's sums are added to a running total in the shared state
  (``Drain``: Redis with several replicas, so each replica adds what it took and all
  difference the same total), which is then differenced like a counter. No iteration is
  counted twice (one read takes it) and none is lost to another replica; iterations the
  server dropped because nobody read them in time (its queue is bounded) show as ``lost``:
  the span of ``iter`` numbers drained minus the iterations seen. For the same reason its
  ``/metrics`` is never read for load, nor by ``speclane init``.
- ``speclane init``: model cards owned by ``tensorrt_llm``; the probe's draft tokens on
  ``/prometheus/metrics``, and its tokens per iteration; k shows nowhere.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from backends.counters import SpecCounters, summed
from backends.errors import Unavailable
from gateway.engines.engine import Drain, Engine, Evidence, Fetch, Said
from gateway.engines.recognition import Found, Pages, answered, probe_evidence
from policies.model import Engine as Named

log = logging.getLogger(__name__)

_NAMES = {
    "trtllm_spec_decode_num_draft_tokens": "draft_tokens",
    "trtllm_spec_decode_num_accepted_tokens": "accepted_tokens",
    "trtllm_generation_tokens": "work",
}


@dataclass(frozen=True, slots=True)
class PerIteration:
    """``avg_decoded_tokens_per_iter`` of one answer."""

    value: float

    @property
    def tokens_per_step(self) -> float | None:
        return self.value

    def said(self, tokens: int, k: int, chunk_steps: int) -> Said | None:
        decoded = tokens - 1
        if decoded <= 0:
            return None
        steps = round(tokens / self.value) - 1
        return Said(0, 0, min(max(steps, -(-decoded // (k + 1))), decoded))


def _per_iteration(choice: object) -> PerIteration | None:
    value = choice.get("avg_decoded_tokens_per_iter") if isinstance(choice, dict) else None
    if isinstance(value, int | float) and not isinstance(value, bool) and value >= 1:
        return PerIteration(float(value))
    return None


def evidence(chunk: Mapping[str, Any]) -> Evidence | None:
    """A chunk's choices' tokens per iteration (the last that says)."""
    found = None
    for choice in chunk.get("choices") or ():
        found = _per_iteration(choice) or found
    return found


def whole(body: Mapping[str, Any]) -> Evidence | None:
    """A whole answer's first choice's tokens per iteration."""
    choices = body.get("choices")
    return _per_iteration(choices[0]) if isinstance(choices, list) and choices else None


def parse(text: str) -> SpecCounters:
    """The cumulative counters of ``/prometheus/metrics`` (zeros when absent); ``work`` is
    its generated tokens, which grow whether or not it drafts."""
    return summed(text, _NAMES)


@dataclass(frozen=True, slots=True)
class Drained:
    """What one read of ``/metrics`` took off its iteration-stats queue."""

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


class Counters:
    """Reads ``/prometheus/metrics``, or ``/metrics`` drained on read where there is none."""

    __slots__ = ("_drain", "_fetch", "_lost", "_no_prometheus")

    def __init__(self, fetch: Fetch, drain: Drain) -> None:
        self._fetch = fetch
        self._drain = drain
        self._no_prometheus: set[str] = set()
        self._lost: dict[str, float] = {}

    async def read(self, url: str) -> SpecCounters:
        base = url.rstrip("/")
        if url not in self._no_prometheus:
            try:
                return parse(await self._fetch(base + "/prometheus/metrics"))
            except Unavailable as exc:
                if exc.status != 404:
                    raise
                self._no_prometheus.add(url)
                log.info("%s has no /prometheus/metrics: reading its drained /metrics", url)
        taken = drained((await self._fetch(base + "/metrics")).encode())
        totals = await self._drain(url, taken.fields(), taken.first, taken.last)
        self._lost[url] = totals.get("lost", 0.0)
        return SpecCounters(
            totals.get("drafts", 0.0),
            totals.get("draft_tokens", 0.0),
            totals.get("accepted_tokens", 0.0),
            totals.get("work", 0.0),
        )

    @property
    def lost(self) -> Mapping[str, float]:
        return self._lost


def recognise(pages: Pages) -> Found | None:
    if pages.models.owned_by != "tensorrt_llm":
        return None
    evidence = ["TensorRT-LLM (model cards owned by tensorrt_llm)"]
    speculates: bool | None = None
    if pages.metrics is not None and pages.metrics_after is not None:
        drafted = parse(pages.metrics_after).minus(parse(pages.metrics))
        if drafted.draft_tokens > 0:
            speculates = True
            evidence.append("the probe's draft tokens show on /prometheus/metrics")
    per_step = pages.answer.tokens_per_step if pages.answer is not None else None
    if per_step is not None:
        speculates = speculates or per_step > 1.0
        evidence.append(f"the probe's answer: {per_step:g} tokens per iteration")
    return Found(
        pages.url,
        pages.models.ids,
        Named.TRTLLM,
        pages.version,
        speculates,
        None,
        None,
        answered(pages, lambda a: a.tokens_per_step is not None),
        (*evidence, *probe_evidence(pages)),
    )


ENGINE = Engine(
    name=Named.TRTLLM.value,
    evidence=evidence,
    whole=whole,
    figures=Counters,
    owners=frozenset({"tensorrt_llm"}),
    counters_page="/prometheus/metrics",
    recognise=recognise,
)
