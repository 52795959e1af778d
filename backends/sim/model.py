"""The simulated engine's numbers: per-token draft acceptance, the accepted-token sampler, the
Leviathan formulas, the per-step cost model and the profile of one request.

Acceptance ``a`` of a request (the chance that the target accepts one draft token)::

    a = base[workload] * (1 - 0.2 * clamp(T, 0, 2)) / (1 + prompt_tokens / 32768)

capped at 0.99. The temperature factor is 1.0 at T=0, 0.8 at T=1; the context factor is 0.97
at 1k prompt tokens, 0.80 at 8k, 0.67 at 16k. A drift override replaces ``base[workload]``.

Cost of one engine step (continuous batching), defaults modelled on a 32B target with a ~1.7B
draft on one accelerator::

    target = 25 ms + 0.8 ms * verified_tokens + 0.15 ms * prefill_tokens
    draft  = draft_passes * (2.7 ms + 0.05 ms * drafting_sequences)

``verified_tokens`` is 1 per standard sequence and k+1 per speculative one, so verification
grows k+1 times faster with the batch than standard decoding does: at batch 1 speculation
wins (2.6x at a=0.9, k=4) or loses a little at creative acceptance (0.89x at a=0.28), and at
64-128 running sequences it loses even at good acceptance (the SmartSpec/TurboSpec effect).

A GPU-shaped alternative (``GpuCostModel``, ``speclane sim --cost-model gpu``): a step
reads the weights once whatever it computes (a memory floor), costs compute per token only
once its tokens pass a knee, and reads each running sequence's KV cache once, shared by the
k+1 tokens that sequence verifies::

    target = floor + per_token * max(0, verified + prefill - knee) + kv * context_tokens
    draft  = draft_passes * (floor' + per_token' * max(0, seqs - knee') + kv' * context_tokens)

Its defaults are a back-of-envelope estimate for an 8B target with a 1B draft on one H100,
not a measurement (``GpuCostModel`` says how); ``bench/gpu/steptime.py`` measures the curve
on a GPU and writes fitted parameters that ``GpuCostModel.from_summary`` reads.

Pure: no I/O, no clock reads, no global random state (the caller passes every
``random.Random``).
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Protocol

from backends.sim.workload import (
    LONG_CONTEXT_TOKENS,
    Workload,
    classify,
    estimate_prompt_tokens,
    forced_tool_name,
    prompt_text,
    temperature_of,
    tool_names,
)

MAX_ACCEPTANCE = 0.99

DEFAULT_BASE: Mapping[Workload, float] = MappingProxyType(
    {
        Workload.JSON: 0.92,
        Workload.TOOLS: 0.88,
        Workload.CODE: 0.82,
        Workload.CHAT: 0.65,
        Workload.CREATIVE: 0.35,
        Workload.SUMMARISE: 0.25,
    }
)

# How often an n-gram proposer finds the last tokens again in the context (prompt and answer
# so far), per decode step: answers that copy from their context (summaries quote the
# document, JSON and tool calls repeat keys and schema, code repeats names) match often,
# free text rarely.
DEFAULT_NGRAM_MATCH: Mapping[Workload, float] = MappingProxyType(
    {
        Workload.JSON: 0.5,
        Workload.TOOLS: 0.5,
        Workload.CODE: 0.45,
        Workload.CHAT: 0.25,
        Workload.CREATIVE: 0.1,
        Workload.SUMMARISE: 0.6,
    }
)

# Natural answer length in tokens (uniform), before max_tokens cuts it.
NATURAL_TOKENS: Mapping[Workload, tuple[int, int]] = MappingProxyType(
    {
        Workload.JSON: (40, 160),
        Workload.TOOLS: (20, 80),
        Workload.CODE: (80, 320),
        Workload.CHAT: (60, 300),
        Workload.CREATIVE: (150, 500),
        Workload.SUMMARISE: (80, 250),
    }
)


def expected_tokens_per_step(a: float, k: int) -> float:
    """Leviathan et al.: tokens one speculative step emits on average, (1 - a^(k+1)) / (1 - a)."""
    if a >= 1.0:
        return float(k + 1)
    return (1.0 - a ** (k + 1)) / (1.0 - a)


def expected_draft_acceptance_rate(a: float, k: int) -> float:
    """vLLM's draft acceptance rate (accepted / drafted) for per-token acceptance ``a``."""
    return (expected_tokens_per_step(a, k) - 1.0) / k


def per_token_acceptance(draft_acceptance_rate: float, k: int) -> float:
    """Solve ``expected_draft_acceptance_rate(a, k) == rate`` for ``a`` (bisection)."""
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if expected_draft_acceptance_rate(mid, k) < draft_acceptance_rate:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def sample_accepted(rng: random.Random, a: float, k: int) -> int:
    """Accepted draft tokens in one step: consecutive successes of chance ``a``, at most k."""
    accepted = 0
    while accepted < k and rng.random() < a:
        accepted += 1
    return accepted


class Method(StrEnum):
    """How a speculative server proposes drafts (vLLM's ``speculative_config.method``)."""

    DRAFT_MODEL = "draft_model"
    NGRAM = "ngram"


@dataclass(frozen=True, slots=True)
class AcceptanceModel:
    """How a request's workload, temperature and context length set its acceptance, and how
    often an n-gram proposer has something to propose."""

    base: Mapping[Workload, float] = field(default_factory=lambda: DEFAULT_BASE)
    ngram_match: Mapping[Workload, float] = field(default_factory=lambda: DEFAULT_NGRAM_MATCH)
    temperature_slope: float = 0.2
    context_scale_tokens: float = 32768.0
    long_context_tokens: int = LONG_CONTEXT_TOKENS

    def acceptance(self, base: float, *, temperature: float, prompt_tokens: int) -> float:
        temp_factor = max(0.0, 1.0 - self.temperature_slope * min(max(temperature, 0.0), 2.0))
        ctx_factor = 1.0 / (1.0 + prompt_tokens / self.context_scale_tokens)
        return min(max(base * temp_factor * ctx_factor, 0.0), MAX_ACCEPTANCE)


class StepCost(Protocol):
    """Seconds per engine step: ``CostModel`` (affine) or ``GpuCostModel``."""

    def step_seconds(
        self,
        *,
        verified_tokens: int,
        prefill_tokens: int,
        draft_passes: int,
        drafting_seqs: int,
        context_tokens: int = 0,
    ) -> float: ...

    def decode_step_seconds(
        self, *, batch: float, k: int, speculative: bool, context: float = 0.0
    ) -> float: ...

    def speedup(self, a: float, k: int, batch: float = 1, context: float = 0.0) -> float: ...


@dataclass(frozen=True, slots=True)
class CostModel:
    """Seconds per engine step (module docstring has the formula and why these numbers).
    Affine in the tokens verified: the context a sequence has cached costs nothing."""

    target_fixed_s: float = 0.025
    target_per_token_s: float = 0.0008
    prefill_per_token_s: float = 0.00015
    draft_fixed_s: float = 0.0027
    draft_per_seq_s: float = 0.00005

    def step_seconds(
        self,
        *,
        verified_tokens: int,
        prefill_tokens: int,
        draft_passes: int,
        drafting_seqs: int,
        context_tokens: int = 0,
    ) -> float:
        target = (
            self.target_fixed_s
            + self.target_per_token_s * verified_tokens
            + self.prefill_per_token_s * prefill_tokens
        )
        draft = draft_passes * (self.draft_fixed_s + self.draft_per_seq_s * drafting_seqs)
        return target + draft

    def decode_step_seconds(
        self, *, batch: float, k: int, speculative: bool, context: float = 0.0
    ) -> float:
        """One steady-state decode step of ``batch`` sequences (no prefill in it)."""
        target = self.target_fixed_s + self.target_per_token_s * batch * (
            k + 1 if speculative else 1
        )
        if not speculative:
            return target
        return target + k * (self.draft_fixed_s + self.draft_per_seq_s * batch)

    def speedup(self, a: float, k: int, batch: float = 1, context: float = 0.0) -> float:
        """Analytic decode speed-up per output token of speculation over standard decoding."""
        return _speedup(self, a, k, batch, context)


# An 8B target (Llama-3-8B's shape) and a 1B draft (Llama-3.2-1B's) on one H100, estimated
# from the hardware, not measured: 16.1 GB of bf16 weights read at ~3.0 TB/s is 5.4 ms, and
# launches and small kernels under CUDA graphs add ~0.6 ms; a token costs ~15 GFLOP, 25 us
# at ~600 TFLOP/s achieved, so compute passes the floor at ~240 tokens a step; a cached token
# is 128 KiB of keys and values, 44 ns at 3.0 TB/s. The draft: 2.5 GB is 0.8 ms plus ~0.4 ms
# of launches, 2.5 GFLOP a token (5 us), 32 KiB a cached token (11 ns).
GPU_ESTIMATE = "estimate: 8B target, 1B draft, one H100 (weights/bandwidth, FLOPs/rate)"


@dataclass(frozen=True, slots=True)
class GpuCostModel:
    """Seconds per engine step on a GPU: a memory floor, compute per token above a knee, and
    KV reads per cached token (module docstring). ``source`` says where the numbers come
    from: ``GPU_ESTIMATE`` for the defaults, a measurement for ``from_summary``."""

    floor_s: float = 0.006
    per_token_s: float = 0.000025
    knee_tokens: float = 240.0
    kv_per_token_s: float = 4.4e-8
    draft_floor_s: float = 0.0012
    draft_per_token_s: float = 0.000005
    draft_knee_tokens: float = 240.0
    draft_kv_per_token_s: float = 1.1e-8
    source: str = GPU_ESTIMATE

    def __post_init__(self) -> None:
        for name in (
            "floor_s",
            "per_token_s",
            "knee_tokens",
            "kv_per_token_s",
            "draft_floor_s",
            "draft_per_token_s",
            "draft_knee_tokens",
            "draft_kv_per_token_s",
        ):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                raise ValueError(f"GPU cost model: {name} must be a number >= 0, got {value!r}")

    def target_seconds(self, tokens: float, context_tokens: float) -> float:
        over = max(0.0, tokens - self.knee_tokens)
        return self.floor_s + self.per_token_s * over + self.kv_per_token_s * context_tokens

    def draft_seconds(self, seqs: float, context_tokens: float) -> float:
        over = max(0.0, seqs - self.draft_knee_tokens)
        return (
            self.draft_floor_s
            + self.draft_per_token_s * over
            + self.draft_kv_per_token_s * context_tokens
        )

    def step_seconds(
        self,
        *,
        verified_tokens: int,
        prefill_tokens: int,
        draft_passes: int,
        drafting_seqs: int,
        context_tokens: int = 0,
    ) -> float:
        """Prefill tokens share the step's matrix products with the verified ones (their own
        attention is left out); a draft pass reads the drafting sequences' contexts."""
        target = self.target_seconds(verified_tokens + prefill_tokens, context_tokens)
        if not draft_passes:
            return target
        return target + draft_passes * self.draft_seconds(drafting_seqs, context_tokens)

    def decode_step_seconds(
        self, *, batch: float, k: int, speculative: bool, context: float = 0.0
    ) -> float:
        """One steady-state decode step of ``batch`` sequences of ``context`` cached tokens."""
        tokens = batch * (k + 1 if speculative else 1)
        target = self.target_seconds(tokens, batch * context)
        if not speculative:
            return target
        return target + k * self.draft_seconds(batch, batch * context)

    def speedup(self, a: float, k: int, batch: float = 1, context: float = 0.0) -> float:
        return _speedup(self, a, k, batch, context)

    @classmethod
    def from_summary(cls, summary: Mapping[str, object]) -> GpuCostModel:
        """The parameters ``bench/gpu/steptime.py`` fitted (its ``summary.json``, or that
        file's ``cost_model`` object); a part it has no fit for keeps the estimate."""
        fitted = summary.get("cost_model", summary)
        if not isinstance(fitted, Mapping) or not isinstance(fitted.get("target"), Mapping):
            raise ValueError("GPU cost model: no fitted 'target' in the summary")
        values: dict[str, object] = {}
        for part, prefix in (("target", ""), ("draft", "draft_")):
            given = fitted.get(part)
            if not isinstance(given, Mapping):
                continue
            for key in ("floor_s", "per_token_s", "knee_tokens", "kv_per_token_s"):
                if key not in given:
                    raise ValueError(f"GPU cost model: {part} has no {key}")
                values[prefix + key] = given[key]
        source = fitted.get("source")
        values["source"] = str(source) if source else "measured (no source given)"
        if not isinstance(fitted.get("draft"), Mapping):
            values["source"] = f"{values['source']}; draft: {GPU_ESTIMATE}"
        return cls(**values)  # type: ignore[arg-type]


def _speedup(cost: StepCost, a: float, k: int, batch: float, context: float) -> float:
    spec = cost.decode_step_seconds(batch=batch, k=k, speculative=True, context=context)
    std = cost.decode_step_seconds(batch=batch, k=k, speculative=False, context=context)
    return expected_tokens_per_step(a, k) * std / spec


@dataclass(frozen=True, slots=True)
class DriftPoint:
    """From ``at_s`` seconds after start on, ``workload``'s base acceptance is ``acceptance``.

    With ``tool`` set, the point applies only to requests that offer a tool of that name (a
    new tool schema whose calls the draft predicts badly, among healthy ones).
    """

    workload: Workload
    at_s: float
    acceptance: float
    tool: str = ""


def base_acceptance(
    workload: Workload,
    *,
    now_s: float,
    model: AcceptanceModel,
    drift: Sequence[DriftPoint] = (),
    overrides: Mapping[Workload, float] | None = None,
    tools: Sequence[str] = (),
) -> float:
    """The base in force: a runtime override, else the latest drift point due (one naming a
    tool of the request first), else the default."""
    if overrides and workload in overrides:
        return overrides[workload]
    due = [p for p in drift if p.workload is workload and p.at_s <= now_s]
    if tools:
        for_tool = [p for p in due if p.tool and p.tool in tools]
        if for_tool:
            return max(for_tool, key=lambda p: p.at_s).acceptance
    due = [p for p in due if not p.tool]
    if due:
        return max(due, key=lambda p: p.at_s).acceptance
    return model.base.get(workload, DEFAULT_BASE[workload])


@dataclass(frozen=True, slots=True)
class RequestProfile:
    """Everything the engine needs to know about one request, decided when it arrives."""

    workload: Workload
    prompt_tokens: int
    max_tokens: int
    output_tokens: int
    finish_reason: str
    acceptance: float
    seed_key: str
    tool_name: str | None = None
    text_key: str = ""
    ngram_match: float = 0.0

    def draft_acceptance(self, method: Method) -> float:
        """Chance that the target accepts one proposed token. A proposal an n-gram copied
        from the context is right more often than a draft model's guess: the square root."""
        return self.acceptance if method is Method.DRAFT_MODEL else self.acceptance**0.5

    def _key(self, stream: str) -> str:
        # The answer's text follows text_key: for a greedy request that is its content, so
        # a speculative and a standard server give the same text, as real greedy decoding.
        base = self.text_key if stream == "text" and self.text_key else self.seed_key
        return f"{base}:{stream}"

    def rng(self, stream: str) -> random.Random:
        """An independent random stream of this request (``"steps"``, ``"text"``...)."""
        return random.Random(self._key(stream))

    def draw(self, stream: str) -> int:
        """One 64-bit number of this request; cheaper than a ``Random`` for a single draw."""
        return draw(self._key(stream))


def draw(key: str) -> int:
    """A deterministic 64-bit number for ``key``."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest())


def build_profile(
    body: Mapping[str, object],
    *,
    seed: int,
    index: int,
    max_tokens: int,
    now_s: float = 0.0,
    model: AcceptanceModel | None = None,
    drift: Sequence[DriftPoint] = (),
    overrides: Mapping[Workload, float] | None = None,
    greedy_mismatch: float = 0.0,
    choice: int = 0,
) -> RequestProfile:
    """Profile the ``index``-th request a server with ``seed`` receives (its ``choice``-th
    answer when it asks for several, ``n`` > 1).

    Same seed and same request order give the same profiles, hence the same numbers. The
    answer ends naturally (``stop``, or ``tool_calls`` for a required call) at a length drawn
    per workload, unless
    ``max_tokens`` cuts it first (``length``) or ``ignore_eos`` is set. A greedy request
    (temperature 0) gets text and length from its content alone, the same on every server;
    ``greedy_mismatch`` is the fraction of greedy answers that diverge anyway (a broken
    speculative server, for the gateway's correctness canary).
    """
    model = model or AcceptanceModel()
    text = prompt_text(body)
    prompt_tokens = estimate_prompt_tokens(body, text)
    workload = classify(
        body, long_context_tokens=model.long_context_tokens, text=text, prompt_tokens=prompt_tokens
    )
    tools = tool_names(body) if drift else ()
    base = base_acceptance(
        workload, now_s=now_s, model=model, drift=drift, overrides=overrides, tools=tools
    )
    a = model.acceptance(base, temperature=temperature_of(body), prompt_tokens=prompt_tokens)
    seed_key = f"{seed}:{index}" + (f"/{choice}" if choice else "")
    text_key = seed_key
    if temperature_of(body) == 0:
        text_key = "greedy:" + hashlib.blake2b(text.encode(), digest_size=8).hexdigest()
        if draw(f"{seed_key}:mismatch") / 2**64 < greedy_mismatch:
            text_key += ":diverged"
    low, high = NATURAL_TOKENS[workload]
    natural = low + draw(f"{text_key}:length") % (high - low + 1)
    if body.get("ignore_eos") is True:  # vLLM's benchmark switch: always run to max_tokens
        natural = max_tokens + 1
    tool_name = forced_tool_name(body)
    # vLLM ends a required call with "tool_calls" but a named one with "stop", as OpenAI does
    natural_reason = "tool_calls" if tool_name and body.get("tool_choice") == "required" else "stop"
    return RequestProfile(
        workload=workload,
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        output_tokens=min(max_tokens, natural),
        finish_reason="length" if max_tokens < natural else natural_reason,
        acceptance=a,
        seed_key=seed_key,
        tool_name=tool_name,
        text_key=text_key,
        ngram_match=model.ngram_match.get(workload, DEFAULT_NGRAM_MATCH[workload]),
    )
