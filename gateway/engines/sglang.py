"""SGLang (sgl-project/sglang, 0.5.23 read here; ``policies/engines.py`` has the sources).

- Per request: asked with ``return_spec_tokens_details`` (a field other engines may
  refuse, so only requests to its speculative pools carry it, streamed), its OpenAI routes
  stream ``sglext.spec_tokens_details`` in a chunk of its own before the usage chunk:
  ``spec_verify_ct`` verify steps (the decode steps), ``spec_num_proposed_drafts`` and
  ``spec_num_correct_drafts`` (the draft counts). The gateway asks on its own account, so
  that chunk reaches the client only when it asked the same itself. Older servers ignore
  the field and say nothing speculative on these routes.
- Assembly is not faithful (its answers are not vLLM's field by field): a non-streaming
  request passes through.
- Pool figures: no counters. ``/metrics`` gauges ``sglang:spec_accept_rate`` and
  ``sglang:spec_accept_length`` (its last log interval) and ``/server_info``'s mean tokens
  per step since start are shown as they are, never differenced. Load:
  ``sglang:num_running_reqs`` plus ``sglang:num_queue_reqs``.
- ``speclane init``: model cards owned by ``sglang`` or ``sglang:`` series on ``/metrics``;
  ``GET /server_info`` has ``speculative_algorithm`` (null without speculation) and
  ``speculative_num_draft_tokens``, the tokens each step verifies (k + 1).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from prometheus_client.parser import text_string_to_metric_families

from backends.errors import BackendError
from gateway.engines.engine import Drain, Engine, Evidence, Fetch, Gauges, Said
from gateway.engines.recognition import Found, Pages, answered, probe_evidence
from gateway.engines.vllm import count
from policies.model import Engine as Named
from policies.model import Method

SERIES = "sglang:"
METHODS = {
    "EAGLE": Method.EAGLE,
    "EAGLE3": Method.EAGLE3,
    "NEXTN": Method.MTP,
    "MTP": Method.MTP,
    "STANDALONE": Method.DRAFT_MODEL,
    "NGRAM": Method.NGRAM,
}


@dataclass(frozen=True, slots=True)
class Verified:
    """``sglext.spec_tokens_details`` of one answer: verify steps, proposed and correct
    drafts."""

    steps: int
    drafted: int
    accepted: int

    @property
    def tokens_per_step(self) -> float | None:
        return None

    def said(self, tokens: int, k: int, chunk_steps: int) -> Said | None:
        decoded = tokens - 1
        if decoded <= 0 or self.steps <= 0:
            return None
        return Said(self.drafted, min(self.accepted, self.drafted), min(self.steps, decoded))


def own(chunk: Mapping[str, Any]) -> bool:
    """The chunk ``return_spec_tokens_details`` adds: ``sglext`` and no output."""
    return "sglext" in chunk and not chunk.get("choices")


def evidence(chunk: Mapping[str, Any]) -> Evidence | None:
    """An ``sglext`` chunk's counts (one answer's: n > 1 gives a list, which no signal
    describes)."""
    ext = chunk.get("sglext")
    details = ext.get("spec_tokens_details") if isinstance(ext, dict) else None
    if not isinstance(details, dict):
        return None
    return Verified(
        count(details.get("spec_verify_ct")),
        count(details.get("spec_num_proposed_drafts")),
        count(details.get("spec_num_correct_drafts")),
    )


def gauges(text: str) -> tuple[float | None, float | None]:
    """``sglang:spec_accept_rate`` and ``sglang:spec_accept_length`` (gauges over its last
    log interval; None when absent or 0, which SGLang shows before any draft)."""
    rate = length = None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "sglang:spec_accept_rate" and sample.value > 0:
                rate = sample.value
            elif sample.name == "sglang:spec_accept_length" and sample.value > 0:
                length = sample.value
    return rate, length


def mean_since_start(body: bytes) -> float | None:
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


class Figures:
    """Reads an endpoint's gauges and its mean since start."""

    __slots__ = ("_fetch",)

    def __init__(self, fetch: Fetch, drain: Drain) -> None:
        self._fetch = fetch

    async def read(self, url: str) -> Gauges:
        base = url.rstrip("/")
        rate, length = gauges(await self._fetch(base + "/metrics"))
        try:
            lifetime = mean_since_start((await self._fetch(base + "/server_info")).encode())
        except BackendError:
            lifetime = None
        return Gauges(rate, length, lifetime)

    @property
    def lost(self) -> Mapping[str, float]:
        return {}


@dataclass(frozen=True, slots=True)
class Info:
    """``GET /server_info``: whether it speculates, k, the method and its version."""

    speculates: bool
    k: int | None
    method: Method | None
    version: str | None


def info(body: bytes) -> Info:
    """``GET /server_info`` of an SGLang server (nothing known when it is not JSON)."""
    try:
        page = orjson.loads(body)
    except orjson.JSONDecodeError:
        page = None
    if not isinstance(page, dict):
        return Info(False, None, None, None)
    algorithm = page.get("speculative_algorithm")
    verified = page.get("speculative_num_draft_tokens")
    k = verified - 1 if isinstance(verified, int) and verified > 1 else None
    method = METHODS.get(str(algorithm).upper()) if algorithm else None
    version = page.get("version")
    return Info(bool(algorithm), k, method, str(version) if version else None)


def shows_series(text: str | None) -> bool:
    """The page has ``sglang:`` series (False for no page, or one that is not Prometheus)."""
    if not text:
        return False
    try:
        return any(f.name.startswith(SERIES) for f in text_string_to_metric_families(text))
    except ValueError:
        return False


def recognise(pages: Pages) -> Found | None:
    if pages.models.owned_by != "sglang" and not shows_series(pages.metrics):
        return None
    read = info(pages.info or b"")
    evidence = ["SGLang (sglang: series or model cards)"]
    if pages.info is None:
        evidence.append("no /server_info: speculation not known")
    elif read.speculates:
        evidence.append(f"/server_info: speculative_algorithm set, k={read.k}")
    else:
        evidence.append("/server_info: no speculative_algorithm: it does not speculate")
    return Found(
        pages.url,
        pages.models.ids,
        Named.SGLANG,
        pages.version or read.version,
        read.speculates if pages.info is not None else None,
        read.k,
        read.method,
        answered(pages, lambda a: a.per_request),
        (*evidence, *probe_evidence(pages)),
    )


def advice(found: Found) -> list[str]:
    if found.per_request is not False:
        return []
    return [
        f"{found.url}: answers carry no per-request speculation figures; SGLang >= 0.5.23 "
        "adds them (speclane asks with return_spec_tokens_details); until then speclane "
        "counts chunks"
    ]


ENGINE = Engine(
    name=Named.SGLANG.value,
    asks={"return_spec_tokens_details": True},
    own=own,
    evidence=evidence,
    figures=Figures,
    gauged=True,
    load=frozenset({"sglang:num_running_reqs", "sglang:num_queue_reqs"}),
    owners=frozenset({"sglang"}),
    info_page="/server_info",
    series=SERIES,
    recognise=recognise,
    advice=advice,
)
