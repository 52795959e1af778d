"""What one serving endpoint's own pages say about it, read without any I/O.

``speclane init`` fetches the pages (``gateway/setup/probe.py``); these functions read them.
Each engine shows itself its way (``policies/engines.py`` has the sources):

- ``GET /v1/models``: the served model names, and ``owned_by``, each engine's own default
  (``vllm``, ``sglang``, ``tensorrt_llm``).
- vLLM (and vllm-neuron, which runs vLLM): ``/metrics`` has ``vllm:spec_decode_*`` series only
  when the server speculates, and ``..._num_accepted_tokens_per_pos`` one series per draft
  position from the start: their count is k. vllm-neuron counts no drafts: after a request,
  its counters stay at 0 while a chunk carries several tokens (a fused step).
- SGLang: ``sglang:`` series on ``/metrics``; ``GET /server_info`` has
  ``speculative_algorithm`` (null without speculation) and ``speculative_num_draft_tokens``,
  the tokens each step verifies (k + 1).
- TensorRT-LLM: ``/prometheus/metrics`` counters, and ``avg_decoded_tokens_per_iter`` on every
  choice of an answer; k shows nowhere.

And one short streamed request (the probe) says what an answer carries: vLLM's
``metrics.speculative_decoding`` on the usage chunk (``--per-request-spec-decode-metrics``),
SGLang's ``sglext.spec_tokens_details``, TensorRT-LLM's tokens per iteration, and how many
tokens each content chunk held. Pure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import orjson
from prometheus_client.parser import text_string_to_metric_families

from policies.model import Engine, Method

OWNERS = {"vllm": Engine.VLLM, "sglang": Engine.SGLANG, "tensorrt_llm": Engine.TRTLLM}
SGLANG_METHODS = {
    "EAGLE": Method.EAGLE,
    "EAGLE3": Method.EAGLE3,
    "NEXTN": Method.MTP,
    "MTP": Method.MTP,
    "STANDALONE": Method.DRAFT_MODEL,
    "NGRAM": Method.NGRAM,
}
_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"


@dataclass(frozen=True, slots=True)
class Models:
    """``GET /v1/models``: the names served and who the cards say owns them."""

    ids: tuple[str, ...]
    owned_by: str


@dataclass(frozen=True, slots=True)
class VllmPage:
    """A vLLM ``/metrics`` page: whether speculation series exist, k, and the totals."""

    speculates: bool
    k: int | None
    drafts: float
    generated: float
    sglang: bool  # the page is SGLang's (sglang: series)


@dataclass(frozen=True, slots=True)
class SglangInfo:
    speculates: bool
    k: int | None
    method: Method | None
    version: str | None


@dataclass(frozen=True, slots=True)
class Answer:
    """What the probe's streamed answer carried."""

    chunks: int = 0
    tokens: int = 0
    per_request: bool = False  # vLLM's metrics.speculative_decoding or SGLang's sglext
    tokens_per_step: float | None = None  # TensorRT-LLM's avg_decoded_tokens_per_iter

    @property
    def tokens_per_chunk(self) -> float | None:
        return self.tokens / self.chunks if self.chunks and self.tokens else None


def models(body: bytes) -> Models:
    """The served models; ``ValueError`` when the page is not an OpenAI model list."""
    try:
        page = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    data = page.get("data") if isinstance(page, dict) else None
    cards = [card for card in data or () if isinstance(card, dict) and card.get("id")]
    if not cards:
        raise ValueError("no model in its list")
    owners = {str(card.get("owned_by", "")) for card in cards}
    return Models(tuple(str(card["id"]) for card in cards), sorted(owners)[0])


def vllm_page(text: str) -> VllmPage:
    """The speculation series of a Prometheus page; ``ValueError`` when it is not one."""
    speculates = sglang = False
    positions: set[str] = set()
    drafts = generated = 0.0
    try:
        families = list(text_string_to_metric_families(text))
    except ValueError as exc:
        raise ValueError(f"not a Prometheus page: {exc}") from None
    for family in families:
        sglang = sglang or family.name.startswith("sglang:")
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
    return VllmPage(speculates, len(positions) or None, drafts, generated, sglang)


def sglang_info(body: bytes) -> SglangInfo:
    """``GET /server_info`` of an SGLang server (nothing known when it is not JSON)."""
    try:
        info = orjson.loads(body)
    except orjson.JSONDecodeError:
        info = None
    if not isinstance(info, dict):
        return SglangInfo(False, None, None, None)
    algorithm = info.get("speculative_algorithm")
    verified = info.get("speculative_num_draft_tokens")
    k = verified - 1 if isinstance(verified, int) and verified > 1 else None
    method = SGLANG_METHODS.get(str(algorithm).upper()) if algorithm else None
    version = info.get("version")
    return SglangInfo(bool(algorithm), k, method, str(version) if version else None)


def version(body: bytes) -> str | None:
    """``GET /version``'s ``{"version": ...}``, when it is that."""
    try:
        page = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    found = page.get("version") if isinstance(page, dict) else None
    return str(found) if isinstance(found, str | int | float) and found != "" else None


def version_at_least(found: str | None, wanted: tuple[int, ...]) -> bool | None:
    """Whether a version string is at least ``wanted`` (None when it cannot be read)."""
    parts = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", found or "")
    if parts is None:
        return None
    have = tuple(int(p) for p in parts.groups() if p is not None)
    return have >= wanted


def answer(body: bytes) -> Answer:
    """What a streamed answer (chat or completions, SSE) carried."""
    chunks = tokens = 0
    per_request = False
    per_step: float | None = None
    for line in body.splitlines():
        if not line.startswith(b"data:") or line.strip() == b"data: [DONE]":
            continue
        try:
            event = orjson.loads(line[5:])
        except orjson.JSONDecodeError:
            continue
        if not isinstance(event, dict):
            continue
        chunks += _content(event)
        per_step = _per_step(event) or per_step
        usage = event.get("usage")
        if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
            tokens = usage["completion_tokens"]
        per_request = per_request or _speculative_details(event)
    return Answer(chunks, tokens, per_request, per_step)


def _content(event: dict[str, Any]) -> int:
    for choice in event.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta")
        text = delta.get("content") if isinstance(delta, dict) else choice.get("text")
        if text:
            return 1
    return 0


def _per_step(event: dict[str, Any]) -> float | None:
    for choice in event.get("choices") or ():
        value = choice.get("avg_decoded_tokens_per_iter") if isinstance(choice, dict) else None
        if isinstance(value, int | float) and value > 0:
            return float(value)
    return None


def _speculative_details(event: dict[str, Any]) -> bool:
    metrics = event.get("metrics")
    if isinstance(metrics, dict) and isinstance(metrics.get("speculative_decoding"), dict):
        return True
    sglext = event.get("sglext")
    return isinstance(sglext, dict) and isinstance(sglext.get("spec_tokens_details"), dict)
