"""What each serving engine lets speclane see of speculation, and the lint that follows.

Every fact here was read in the engine's own source (paths and commits as stored in the
public index this project used):

- **vllm** (vLLM >= 0.29): ``metrics.speculative_decoding`` on the final usage chunk with
  ``--per-request-spec-decode-metrics`` (docs/features/per_request_metrics.md); one SSE
  chunk per engine step at ``--stream-interval 1``; counters
  ``vllm:spec_decode_num_{drafts,draft_tokens,accepted_tokens}_total`` on ``/metrics``.
- **vllm-neuron** (vllm-project/vllm-neuron a5ef7c88, 2025-11-17, pinned to vLLM 0.11.0):
  ``neuronx_distributed_model_loader.py`` compiles ``num_speculative_tokens`` into the
  graph as ``speculation_length`` with ``enable_fused_speculation``; the model runner hands
  vLLM every token of a fused step in one output and no draft token ids, so vLLM's scheduler
  counts no drafts and the ``vllm:spec_decode_*`` series stay at 0; vLLM 0.11 has no
  per-request speculative metrics. One chunk per step carries several tokens.
- **sglang** (sgl-project/sglang): the OpenAI stream (``entrypoints/openai/serving_chat.py``
  0c078e6f) is a role chunk, one content chunk per scheduler output, a separate chunk with
  ``finish_reason`` and an empty delta, a usage chunk. The native ``/generate`` answer's
  ``meta_info`` has ``spec_verify_ct``, ``spec_accept_rate`` and ``spec_accept_length`` (=
  completion_tokens / spec_verify_ct); since SGLang 0.5.23 (PyPI, read as installed here) an
  OpenAI request with ``return_spec_tokens_details: true`` gets the same counts as
  ``sglext.spec_tokens_details`` (``spec_verify_ct``, ``spec_num_proposed_drafts``,
  ``spec_num_correct_drafts``), in a chunk of its own before the usage chunk or at the top
  of a whole answer (``protocol.py`` ``SglExt``); older servers ignore the field and say
  nothing speculative on these routes. ``GET /server_info``
  has ``internal_states[i].avg_spec_accept_length``, a mean since start;
  ``sglang:spec_accept_length`` and ``sglang:spec_accept_rate`` are gauges of the last log
  interval (``metrics/collector.py`` 00ae9c15), not counters. ``--stream-interval`` 1 (the
  default) streams every scheduler output (``scheduler_output_processor_mixin.py``).
- **trtllm** (NVIDIA/TensorRT-LLM): every chat chunk and whole answer carries
  ``choices[i].avg_decoded_tokens_per_iter`` (``serve/postprocess_handlers.py`` 01bf1923),
  the request's generated tokens over its decoding iterations (``LlmRequest::
  getAvgDecodedTokensPerIter``): tokens per step, no drafts. ``GET /metrics`` returns the
  iteration stats queued since the last read and removes them (``get_stats_async`` in
  ``serve/openai_server.py`` 00057725), each with ``iter`` and ``specDecodingStats``
  (``numDraftTokens``, ``numAcceptedTokens``, ``numRequestsWithDraftTokens``,
  ``acceptanceLength``); with ``return_perf_metrics`` the server drains that queue itself
  into cumulative ``trtllm_spec_decode_num_{draft,accepted}_tokens_total`` at
  ``/prometheus/metrics`` (``metrics/collector.py`` 050f80de). Its speculation gate
  (``acceptance_rate_window_size`` / ``acceptance_rate_threshold``, formerly
  ``acceptance_window`` / ``acceptance_length_threshold``; ``_torch/speculative/
  speculation_gate.py``) turns speculation off for good once the rolling average over the
  last N finished requests falls below the threshold.

Pure: no I/O.

Explained for operators, with its numbers, in docs/measuring.md ("Engines").
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from policies.model import (
    SHADOW,
    STANDARD,
    Engine,
    GuardrailMode,
    Method,
    PolicyFile,
    Pool,
    PoolKind,
)
from policies.problems import Problem, Severity

ALL_METHODS = frozenset(Method)


@dataclass(frozen=True, slots=True)
class EngineProfile:
    """What one engine shows. ``request_field`` is where a single answer says how many
    tokens each engine step emitted (None: nowhere); ``drafts`` says whether draft and
    accepted token counts are visible anywhere speclane reads (per answer or as counters
    it can difference); ``counters`` names the pool-level source the scraper reads."""

    engine: Engine
    request_field: str | None
    request_drafts: bool
    drafts: bool
    counters: str
    methods: frozenset[Method]
    why_no_drafts: str = ""


PROFILES: dict[Engine, EngineProfile] = {
    Engine.VLLM: EngineProfile(
        Engine.VLLM,
        "metrics.speculative_decoding",
        request_drafts=True,
        drafts=True,
        counters="vllm:spec_decode_* counters at /metrics",
        methods=ALL_METHODS,
    ),
    Engine.VLLM_NEURON: EngineProfile(
        Engine.VLLM_NEURON,
        None,
        request_drafts=False,
        drafts=False,
        counters="none (vllm:spec_decode_* stay at 0)",
        methods=frozenset({Method.DRAFT_MODEL, Method.EAGLE}),
        why_no_drafts="it runs draft and verify in one compiled graph and counts no drafts",
    ),
    Engine.SGLANG: EngineProfile(
        Engine.SGLANG,
        "sglext.spec_tokens_details (return_spec_tokens_details, SGLang >= 0.5.23)",
        request_drafts=True,
        drafts=True,
        counters="/server_info avg_spec_accept_length and sglang:spec_accept_* gauges",
        methods=frozenset(
            {Method.EAGLE, Method.EAGLE3, Method.MTP, Method.NGRAM, Method.DRAFT_MODEL}
        ),
    ),
    Engine.TRTLLM: EngineProfile(
        Engine.TRTLLM,
        "choices[].avg_decoded_tokens_per_iter",
        request_drafts=False,
        drafts=True,
        counters="iteration stats at /metrics (drained on read) or "
        "trtllm_spec_decode_* counters at /prometheus/metrics",
        methods=frozenset(
            {
                Method.DRAFT_MODEL,
                Method.EAGLE,
                Method.EAGLE3,
                Method.MEDUSA,
                Method.NGRAM,
                Method.MTP,
            }
        ),
    ),
}


def profile(engine: Engine) -> EngineProfile:
    """What ``engine`` shows; for an engine none of these (one a gateway registers of its
    own), only what every engine shows: nothing per request, drafts not ruled out."""
    known = PROFILES.get(engine)
    if known is not None:
        return known
    return EngineProfile(engine, None, False, True, "as its gateway module reads them", ALL_METHODS)


def signals(pool: Pool, shows: EngineProfile | None = None) -> tuple[str, ...]:
    """The acceptance signals a pool can give, best first (the names outcomes carry);
    ``shows``: what its engine shows, where the engine is none of ``PROFILES``."""
    if pool.kind is PoolKind.STANDARD:
        return ("none",)
    found = shows or profile(pool.engine)
    plan: list[str] = []
    if found.request_field is not None:
        plan.append("per_request")
    if pool.chunk_acceptance:
        plan.append("chunks")
    plan.append("speed")
    return tuple(plan)


def describe(pool: Pool, shows: EngineProfile | None = None) -> dict[str, object]:
    """A pool's engine and what speclane reads from it, for ``/readyz`` and the admin API
    (``shows`` as for ``signals``)."""
    found = shows or profile(pool.engine)
    plan = signals(pool, found)
    return {
        "engine": pool.engine.value,
        "method": pool.method.value if pool.method else None,
        "signal": plan[0],
        "signals": list(plan),
        "per_request_field": found.request_field if pool.kind is PoolKind.SPECULATIVE else None,
        "drafts_visible": found.drafts and pool.kind is PoolKind.SPECULATIVE,
        "counters": found.counters if pool.kind is PoolKind.SPECULATIVE else None,
    }


def engine_problems(policy: PolicyFile) -> Iterator[Problem]:
    """Engines none of the built-in ones and methods an engine does not run (warnings), and
    threshold guardrails on slices whose speculative pools report no drafts (errors: nothing
    would ever feed them)."""
    for name, pool in policy.pools.items():
        if pool.engine not in PROFILES:
            known = ", ".join(PROFILES)
            yield Problem(
                ("pools", name, "engine"),
                f"engine {pool.engine.value} is none of speclane's own ({known})",
                "a gateway serves it only where an engine module of that name is registered",
                Severity.WARNING,
                code="engine-unknown",
            )
        found = profile(pool.engine)
        if pool.method is not None and pool.method not in found.methods:
            runs = ", ".join(sorted(m.value for m in found.methods))
            yield Problem(
                ("pools", name, "method"),
                f"engine {pool.engine.value} does not run method {pool.method.value}",
                f"{pool.engine.value} runs: {runs}",
                Severity.WARNING,
                code="engine-method",
            )
    yield from _threshold_problems(policy)


def _threshold_problems(policy: PolicyFile) -> Iterator[Problem]:
    base = policy.guardrail
    for i, rule in enumerate(policy.rules):
        merged = rule.guardrail.apply(base) if rule.guardrail else base
        if merged.mode is not GuardrailMode.THRESHOLD:
            continue
        judged = _judged_pools(policy, rule.start, rule.shadow_to)
        blind = [p for p in judged if _no_drafts(policy.pools[p])]
        if not blind:
            continue
        pool = policy.pools[blind[0]]
        at: tuple[str | int, ...] = ("guardrail", "mode")
        if rule.guardrail is not None and rule.guardrail.mode is not None:
            at = ("rules", i, "guardrail", "mode")
        yield Problem(
            at,
            f"guardrail mode threshold judges draft acceptance, which pool {blind[0]!r} "
            f"(engine {pool.engine.value}) never reports: {profile(pool.engine).why_no_drafts}"
            f" (rule {rule.name!r})",
            "use mode economic (the default): it judges time per output token",
            code="engine-threshold",
        )


def _no_drafts(pool: Pool) -> bool:
    return pool.kind is PoolKind.SPECULATIVE and not profile(pool.engine).drafts


def _ladders(policy: PolicyFile) -> list[list[str]]:
    if policy.ladders is not None:
        return [list(r) for r in policy.ladders.values()]
    return [list(policy.ladder)] if policy.ladder is not None else []


def _judged_pools(policy: PolicyFile, start: str, shadow_to: str | None) -> list[str]:
    """The speculative pools a rule's guardrail judges: its start rung and those below it,
    or the pool its shadow mirrors go to."""
    names: list[str] = []
    for rungs in _ladders(policy):
        if start == SHADOW:
            target = shadow_to or next(
                (p for p in rungs if p in policy.pools and _speculative(policy, p)), None
            )
            names += [target] if target else []
        elif start != STANDARD and start in rungs:
            names += rungs[rungs.index(start) :]
    return [n for n in dict.fromkeys(names) if n in policy.pools and _speculative(policy, n)]


def _speculative(policy: PolicyFile, name: str) -> bool:
    return policy.pools[name].kind is PoolKind.SPECULATIVE
