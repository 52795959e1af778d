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

Measured on one H200 (``bench/RESULTS.md``, "Real hardware"), the affine model holds at
batch 1 and not above it. Its floor is a 32B target's (24.3 ms a plain step at batch 1 and
2k context) and its draft-to-target ratio (2.7 / 25 ms) a 1B draft's on it (2.7 / 24.3 ms),
so a k=4 step costs 1.55x a plain one at batch 1 as measured (1.48-1.59x), and k=4
speculation gains 1.79x / 2.39x at a = 0.7 / 0.85 where the measured step times give 1.84x /
2.46x. Its slope is several times too steep: a token costs the 32B target 0.05 ms while the
step is memory-bound (up to ~180 tokens) and 0.11 ms past that, not 0.8 ms, so the k=4 step
costs 1.7x a plain one at batch 32 (the model: 3.4x) and 2.6-3.0x at 128 (4.5x); speculation
stops paying at a far larger batch than this model says.

The GPU-shaped model (``GpuCostModel``, ``speclane sim --cost-model gpu``): a step reads the
weights once whatever it computes (a floor), each token adds a little while the step is
memory-bound and more once its tokens pass a knee and compute dominates, and attention reads
each running sequence's KV cache once, shared by the k+1 tokens it verifies, at no better
than the rate of ``kv_min_seqs`` sequences (one sequence's attention leaves most of the GPU
idle)::

    target = floor + low * min(T, knee) + per_token * max(0, T - knee)
             + kv * context_tokens * max(1, kv_min_seqs / seqs)        T = verified + prefill
    draft  = draft_passes * (the same form, T = the drafting sequences)

Its defaults are fitted to an 8B target (Llama-3-8B's shape) and a 1B draft (Llama-3.2-1B's)
measured on one H200 by ``bench/gpu/steptime.py`` (``GPU_H200`` names the run; ``GPU_32B`` is
the same card's 32B target): within 8% of every measured step (median 1.7%), and at batch 1
within 7% of the measured speed-ups, reading high by the plain step's miss there. On it a
verified token is nearly free at batch 1 (k=4 verification 1.08x a plain step) but a 1B
draft's pass is not (0.32 of the 8B step): at batch 1 and a = 0.7 / 0.85 k=4 speculation
gains 2.6x / 3.4x with drafts that cost nothing (n-gram; EAGLE-like heads lie between), and
1.2x / 1.6x with the 1B draft model (1.8x / 2.5x on the 32B target). ``from_summary`` reads
another card's fit (``--cost-model gpu:SUMMARY.json``).

Pure: no I/O, no clock reads, no global random state (the caller passes every
``random.Random``).
"""

from __future__ import annotations

import hashlib
import math
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
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
        seqs: int = 0,
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
        seqs: int = 0,
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


# Where the built-in GPU numbers come from: bench/gpu/steptime.py's run on one card, its raw
# output committed in bench/gpu/results/h200-8b-32b/, the fit reproduced by
# ``python3 bench/gpu/steptime.py --analyse bench/gpu/results/h200-8b-32b/steptime.csv
# --shape 8b,32b`` (tests/backends/sim/test_sim_gpu_calibration.py holds both to it).
GPU_H200 = (
    "measured: one NVIDIA H200 (141 GB, driver 580.159.04), torch 2.11.0+cu130, transformers "
    "5.17.0, CUDA 13.0; Llama-3-8B-shaped target, Llama-3.2-1B-shaped draft, random bf16 "
    "weights, CUDA graphs, PyTorch SDPA attention; `python3 bench/gpu/steptime.py --out OUT "
    "--budget-s 330 --shape 8b,32b` (bench/gpu/results/h200-8b-32b)"
)

_GPU_FIELDS = (
    "floor_s",
    "low_per_token_s",
    "per_token_s",
    "knee_tokens",
    "kv_per_token_s",
    "kv_min_seqs",
)


@dataclass(frozen=True, slots=True)
class GpuCostModel:
    """Seconds per engine step on a GPU (module docstring): a memory floor, a slope per token
    while memory-bound and a steeper one past a knee, and KV reads per cached token at the
    rate of at least ``kv_min_seqs`` sequences. The defaults are the fit to an 8B target and
    its 1B draft measured on one H200 (``source``: ``GPU_H200``); ``from_summary`` reads
    another card's fit, ``GPU_32B`` is the same card's 32B target."""

    floor_s: float = 0.00749
    low_per_token_s: float = 1.57e-5
    per_token_s: float = 2.93e-5
    knee_tokens: float = 230.0
    kv_per_token_s: float = 4.45e-8
    kv_min_seqs: float = 15.5
    draft_floor_s: float = 0.00229
    draft_low_per_token_s: float = 0.0
    draft_per_token_s: float = 6.40e-6
    draft_knee_tokens: float = 0.0
    draft_kv_per_token_s: float = 1.55e-8
    draft_kv_min_seqs: float = 15.25
    source: str = GPU_H200

    def __post_init__(self) -> None:
        for name in (*_GPU_FIELDS, *(f"draft_{f}" for f in _GPU_FIELDS)):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value >= 0):
                raise ValueError(f"GPU cost model: {name} must be a number >= 0, got {value!r}")

    def target_seconds(self, tokens: float, context_tokens: float, seqs: float = 0.0) -> float:
        """One target forward of ``tokens`` new tokens over ``seqs`` sequences (0: unknown,
        the cache read at its full rate) holding ``context_tokens`` between them."""
        return _gpu_seconds(
            tokens,
            context_tokens,
            seqs,
            (self.floor_s, self.low_per_token_s, self.per_token_s, self.knee_tokens),
            (self.kv_per_token_s, self.kv_min_seqs),
        )

    def draft_seconds(self, seqs: float, context_tokens: float) -> float:
        """One draft pass: one token for each of ``seqs`` sequences."""
        return _gpu_seconds(
            seqs,
            context_tokens,
            seqs,
            (
                self.draft_floor_s,
                self.draft_low_per_token_s,
                self.draft_per_token_s,
                self.draft_knee_tokens,
            ),
            (self.draft_kv_per_token_s, self.draft_kv_min_seqs),
        )

    def step_seconds(
        self,
        *,
        verified_tokens: int,
        prefill_tokens: int,
        draft_passes: int,
        drafting_seqs: int,
        context_tokens: int = 0,
        seqs: int = 0,
    ) -> float:
        """Prefill tokens share the step's matrix products with the verified ones (their own
        attention is left out); ``seqs`` decoding sequences hold ``context_tokens``; a draft
        pass reads the drafting sequences' contexts."""
        target = self.target_seconds(verified_tokens + prefill_tokens, context_tokens, seqs)
        if not draft_passes:
            return target
        return target + draft_passes * self.draft_seconds(drafting_seqs, context_tokens)

    def decode_step_seconds(
        self, *, batch: float, k: int, speculative: bool, context: float = 0.0
    ) -> float:
        """One steady-state decode step of ``batch`` sequences of ``context`` cached tokens."""
        tokens = batch * (k + 1 if speculative else 1)
        target = self.target_seconds(tokens, batch * context, batch)
        if not speculative:
            return target
        return target + k * self.draft_seconds(batch, batch * context)

    def speedup(self, a: float, k: int, batch: float = 1, context: float = 0.0) -> float:
        return _speedup(self, a, k, batch, context)

    @classmethod
    def from_summary(cls, summary: Mapping[str, object]) -> GpuCostModel:
        """The parameters ``bench/gpu/steptime.py`` fitted (its ``summary.json``, or that
        file's ``cost_model`` object); a part it has no fit for keeps the built-in one. A
        fit of the older four-parameter form (no ``low_per_token_s``, no ``kv_min_seqs``)
        reads as a flat floor and the cache at its full rate."""
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
            for key in _GPU_FIELDS:
                values[prefix + key] = given.get(key, 0.0)
        source = fitted.get("source")
        values["source"] = str(source) if source else "measured (no source given)"
        if not isinstance(fitted.get("draft"), Mapping):
            values["source"] = f"{values['source']}; draft: the built-in fit ({GPU_H200})"
        return cls(**values)  # type: ignore[arg-type]


# The same card's 32B target (Qwen2.5-32B's dimensions) with the same 1B draft.
GPU_32B = GpuCostModel(
    floor_s=0.0228,
    low_per_token_s=5.32e-5,
    per_token_s=1.143e-4,
    knee_tokens=177.0,
    kv_per_token_s=8.87e-8,
    kv_min_seqs=15.75,
    source=GPU_H200.replace("Llama-3-8B-shaped target", "Qwen2.5-32B-shaped target"),
)


def scaled_draft(cost: StepCost, scale: float) -> StepCost:
    """``cost`` with every part of its draft pass times ``scale`` (a lighter draft than the
    measured 1B model, such as an EAGLE-style head of one layer: below 1)."""
    if scale == 1.0:
        return cost
    if isinstance(cost, CostModel):
        return replace(
            cost,
            draft_fixed_s=cost.draft_fixed_s * scale,
            draft_per_seq_s=cost.draft_per_seq_s * scale,
        )
    if isinstance(cost, GpuCostModel):
        return replace(
            cost,
            draft_floor_s=cost.draft_floor_s * scale,
            draft_low_per_token_s=cost.draft_low_per_token_s * scale,
            draft_per_token_s=cost.draft_per_token_s * scale,
            draft_kv_per_token_s=cost.draft_kv_per_token_s * scale,
        )
    return cost


MEASURED_SIZES_B = (8.0, 32.0)  # the targets measured on the H200 (billions of parameters)


def measured_for(model: str) -> GpuCostModel:
    """The measured curve nearest the size a served model's name says (``qwen3-32b``: the
    32B target, ``llama-3-8b``: the 8B; in log scale, so 16B and above read as 32B), the 8B
    one when the name says none. The simulator's, replay's and the demo's default."""
    sizes = [
        float(m) for m in re.findall(r"(?<![a-z0-9.])(\d+(?:\.\d+)?)b(?![a-z])", model.lower())
    ]
    if not sizes:
        return GpuCostModel()
    size = max(sizes)
    nearest = min(MEASURED_SIZES_B, key=lambda m: abs(math.log(size / m)) if size > 0 else m)
    return GPU_32B if nearest == 32.0 else GpuCostModel()


def _gpu_seconds(
    tokens: float,
    context_tokens: float,
    seqs: float,
    line: tuple[float, float, float, float],
    kv: tuple[float, float],
) -> float:
    """floor + low * min(tokens, knee) + per_token * max(0, tokens - knee) + the cache read:
    below ``kv_min_seqs`` sequences attention does not fill the GPU, and the cache costs what
    ``kv_min_seqs`` sequences of the same context would."""
    floor, low, per_token, knee = line
    kv_per_token, min_seqs = kv
    if 0 < seqs < min_seqs:
        context_tokens *= min_seqs / seqs
    return (
        floor
        + low * min(tokens, knee)
        + per_token * max(0.0, tokens - knee)
        + kv_per_token * context_tokens
    )


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
