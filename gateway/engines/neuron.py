"""vllm-neuron (vllm-project/vllm-neuron, on vLLM 0.11; ``policies/engines.py`` has the
sources): vLLM on Trainium and Inferentia, which compiles draft and verify into one graph
(fused speculation).

- Per request: nothing. vLLM 0.11 has no per-request speculative figures, and a fused step
  schedules no drafts, so a ``speculative_decoding`` it sent would say every step emitted
  one token: none is read. One chunk per step carries several tokens, so the chunk signal
  counts its steps.
- Its answers' times are vLLM's (``--enable-per-request-metrics``, where it has them).
- Assembly is faithful: it answers as the vLLM it runs (``gateway/forward/assemble.py``).
- Pool counters: vLLM's ``/metrics``, whose ``vllm:spec_decode_*`` series stay at 0; load:
  vLLM's ``vllm:num_requests_running`` plus ``vllm:num_requests_waiting``.
- ``speclane init``: a vLLM that shows speculation series, counts no draft for the probe,
  and still sent several tokens in a chunk.
"""

from __future__ import annotations

from gateway.engines.engine import Engine
from gateway.engines.recognition import Found, Pages, probe_evidence
from gateway.engines.vllm import LOAD, Counters, VllmPage, page, page_evidence, timings
from policies.model import Engine as Named

FUSED = 1.2  # tokens per chunk above which a step that drafted nothing was fused


def recognise(pages: Pages) -> Found | None:
    """A vLLM page that speculates, and a probe that drafted nothing yet got several tokens
    a chunk; None for anything else."""
    shown, evidence = page_evidence(pages)
    if shown is None or not shown.speculates or not _fused(pages, shown):
        return None
    evidence.append(
        "the probe drafted nothing by the counters yet got several tokens a chunk: "
        "fused speculation (vllm-neuron)"
    )
    return Found(
        pages.url,
        pages.models.ids,
        Named.VLLM_NEURON,
        pages.version,
        shown.speculates,
        shown.k,
        None,
        False,
        (*evidence, *probe_evidence(pages)),
    )


def _fused(pages: Pages, before: VllmPage) -> bool:
    if pages.answer is None or not pages.metrics_after:
        return False
    after = page(pages.metrics_after)
    per_chunk = pages.answer.tokens_per_chunk or 1.0
    no_drafts = after.drafts == before.drafts and after.generated > before.generated
    return no_drafts and per_chunk > FUSED


ENGINE = Engine(
    name=Named.VLLM_NEURON.value,
    timings=timings,
    assembles=True,
    figures=Counters,
    load=LOAD,
    recognise=recognise,
)
