"""What ``speclane init`` concludes about one endpoint from its pages, and what it tells the
operator to check. Pure: the pages come in read (``gateway/setup/facts.py``).

The engine is the model cards' owner (``sglang``, ``tensorrt_llm``; ``vllm`` otherwise),
except that a vLLM that exposes speculation series, counts no draft for the probe, and still
sent several tokens in a chunk is vllm-neuron (its fused steps draft inside the compiled
graph, ``policies/engines.py``). Whether it speculates and its k come from the series the
engine keeps; whether answers carry per-request acceptance, from the probe's answer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from backends.counters import parse_trtllm
from gateway.setup import facts
from policies.model import Engine, Method

VLLM_PER_REQUEST = (0, 29)  # the first vLLM with --per-request-spec-decode-metrics
FUSED = 1.2  # tokens per chunk above which a step that drafted nothing was fused


@dataclass(frozen=True, slots=True)
class Pages:
    """Everything read from one endpoint; None where a page was not there or not read."""

    url: str
    models: facts.Models
    version: str | None = None
    metrics: str | None = None  # vLLM or SGLang /metrics, before the probe
    metrics_after: str | None = None
    server_info: bytes | None = None  # SGLang
    prometheus: str | None = None  # TensorRT-LLM /prometheus/metrics, before the probe
    prometheus_after: str | None = None
    answer: facts.Answer | None = None  # the probe's; None when not probed
    probe_error: str | None = None


@dataclass(frozen=True, slots=True)
class Found:
    """One endpoint as the starter policy needs it."""

    url: str
    models: tuple[str, ...]
    engine: Engine
    version: str | None
    speculates: bool | None  # None: cannot tell
    k: int | None
    method: Method | None
    per_request: bool | None  # None: not checked
    evidence: tuple[str, ...]


def recognise(pages: Pages) -> Found:
    """The engine, speculation, k and per-request metrics of one endpoint."""
    owner = facts.OWNERS.get(pages.models.owned_by)
    page = facts.vllm_page(pages.metrics) if pages.metrics else None
    if owner is Engine.SGLANG or (page is not None and page.sglang):
        return _sglang(pages)
    if owner is Engine.TRTLLM:
        return _trtllm(pages)
    return _vllm(pages, page)


def _vllm(pages: Pages, page: facts.VllmPage | None) -> Found:
    evidence = []
    speculates = page.speculates if page is not None else None
    if page is None:
        evidence.append("no Prometheus /metrics page")
    elif page.speculates:
        shown = f"k={page.k} from the per-position counters" if page.k else "k not shown"
        evidence.append(f"vllm:spec_decode_* series on /metrics ({shown})")
    else:
        evidence.append("no vllm:spec_decode_* series on /metrics: it does not speculate")
    engine = Engine.VLLM
    if page is not None and page.speculates and _fused(pages, page):
        engine = Engine.VLLM_NEURON
        evidence.append(
            "the probe drafted nothing by the counters yet got several tokens a chunk: "
            "fused speculation (vllm-neuron)"
        )
    per_request = _answered(pages, lambda a: a.per_request)
    if engine is Engine.VLLM_NEURON:
        per_request = False
    k = page.k if page is not None else None
    return Found(
        pages.url,
        pages.models.ids,
        engine,
        pages.version,
        speculates,
        k,
        None,
        per_request,
        (*evidence, *_probe_evidence(pages)),
    )


def _fused(pages: Pages, before: facts.VllmPage) -> bool:
    if pages.answer is None or not pages.metrics_after:
        return False
    after = facts.vllm_page(pages.metrics_after)
    per_chunk = pages.answer.tokens_per_chunk or 1.0
    no_drafts = after.drafts == before.drafts and after.generated > before.generated
    return no_drafts and per_chunk > FUSED


def _sglang(pages: Pages) -> Found:
    info = facts.sglang_info(pages.server_info or b"")
    evidence = ["SGLang (sglang: series or model cards)"]
    if pages.server_info is None:
        evidence.append("no /server_info: speculation not known")
    elif info.speculates:
        evidence.append(f"/server_info: speculative_algorithm set, k={info.k}")
    else:
        evidence.append("/server_info: no speculative_algorithm: it does not speculate")
    speculates = info.speculates if pages.server_info is not None else None
    per_request = _answered(pages, lambda a: a.per_request)
    return Found(
        pages.url,
        pages.models.ids,
        Engine.SGLANG,
        pages.version or info.version,
        speculates,
        info.k,
        info.method,
        per_request,
        (*evidence, *_probe_evidence(pages)),
    )


def _trtllm(pages: Pages) -> Found:
    evidence = ["TensorRT-LLM (model cards owned by tensorrt_llm)"]
    speculates: bool | None = None
    if pages.prometheus is not None and pages.prometheus_after is not None:
        drafted = parse_trtllm(pages.prometheus_after).minus(parse_trtllm(pages.prometheus))
        if drafted.draft_tokens > 0:
            speculates = True
            evidence.append("the probe's draft tokens show on /prometheus/metrics")
    per_step = pages.answer.tokens_per_step if pages.answer is not None else None
    if per_step is not None:
        speculates = speculates or per_step > 1.0
        evidence.append(f"the probe's answer: {per_step:g} tokens per iteration")
    per_request = _answered(pages, lambda a: a.tokens_per_step is not None)
    return Found(
        pages.url,
        pages.models.ids,
        Engine.TRTLLM,
        pages.version,
        speculates,
        None,
        None,
        per_request,
        (*evidence, *_probe_evidence(pages)),
    )


def _answered(pages: Pages, test: Callable[[facts.Answer], bool]) -> bool | None:
    return None if pages.answer is None else test(pages.answer)


def _probe_evidence(pages: Pages) -> tuple[str, ...]:
    if pages.probe_error is not None:
        return (f"the probe request failed: {pages.probe_error}",)
    answer = pages.answer
    if answer is None:
        return ()
    per_chunk = answer.tokens_per_chunk
    shown = f", {per_chunk:.2g} per chunk" if per_chunk else ""
    return (f"the probe: {answer.tokens} tokens in {answer.chunks} chunks{shown}",)


def advice(found: Found, role: str) -> list[str]:
    """What the operator should know or do about this endpoint, one line each."""
    out = []
    if role == "spec" and found.speculates is False:
        out.append(f"{found.url} was given as speculative but does not speculate")
    if role == "standard" and found.speculates:
        out.append(f"{found.url} was given as standard but speculates: check its flags")
    if role == "spec" and found.engine is Engine.VLLM:
        out.extend(_vllm_per_request(found))
    if role == "spec" and found.engine is Engine.SGLANG and found.per_request is False:
        out.append(
            f"{found.url}: answers carry no per-request speculation figures; SGLang >= 0.5.23 "
            "adds them (speclane asks with return_spec_tokens_details); until then speclane "
            "counts chunks"
        )
    return out


def _vllm_per_request(found: Found) -> list[str]:
    new_enough = facts.version_at_least(found.version, VLLM_PER_REQUEST)
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
