"""The policy file an operator writes, as pydantic models (the YAML's schema).

Only the shape lives here: each model forbids unknown keys and checks what one value can
check alone. Checks that look across the file (pools that exist, rules that can match, a
ladder that ends on a standard pool) are in ``policies/checks.py``. Pure; no I/O.
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema, model_validator

from policies.features import ResponseFormat

SHADOW = "shadow"
STANDARD = "standard"
KILL_SWITCH = "speculation"
ANONYMOUS = "anonymous"  # the tenant of a request with no API key the policy knows
MAX_RULES = 1000  # lint compares every rule with those before it
_ENGINE_NAME = re.compile(r"[a-z][a-z0-9_.-]*")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PoolKind(StrEnum):
    SPECULATIVE = "speculative"
    STANDARD = "standard"


class Engine(StrEnum):
    """The serving engine behind a pool; it decides what speculation speclane can see
    (``policies/engines.py``)."""

    # The members are the engines speclane has built in. Any other lowercase name is taken
    # too (``_missing_``), for an engine a gateway registers of its own (gateway/engines/):
    # the gateway refuses a policy that names one it does not have, and the lint warns.

    VLLM = "vllm"
    VLLM_NEURON = "vllm-neuron"
    SGLANG = "sglang"
    TRTLLM = "trtllm"

    @classmethod
    def _missing_(cls, value: object) -> Engine | None:
        if not isinstance(value, str) or not _ENGINE_NAME.fullmatch(value):
            return None
        other = str.__new__(cls, value)
        other._name_ = other._value_ = value
        return other


class Method(StrEnum):
    """How a speculative pool drafts (vLLM's ``speculative_config.method``; the other
    engines' names map onto these)."""

    NGRAM = "ngram"
    DRAFT_MODEL = "draft_model"
    EAGLE = "eagle"
    EAGLE3 = "eagle3"
    MEDUSA = "medusa"
    MLP_SPECULATOR = "mlp_speculator"
    SUFFIX = "suffix"
    MTP = "mtp"


class Timeouts(_Strict):
    """Seconds to wait for a connection, for the first streamed event, between events, and
    for a whole answer requested without streaming (``passthrough_non_streaming``)."""

    connect_s: Annotated[float, Field(gt=0)] = 2.0
    first_byte_s: Annotated[float, Field(gt=0)] = 60.0
    idle_s: Annotated[float, Field(gt=0)] = 60.0
    total_s: Annotated[float, Field(gt=0)] = 600.0


class Pool(_Strict):
    """Endpoints that serve one target model one way."""

    kind: PoolKind
    model: Annotated[str, Field(min_length=1)]
    endpoints: Annotated[list[Annotated[str, Field(pattern=r"^https?://")]], Field(min_length=1)]
    num_speculative_tokens: Annotated[int, Field(ge=1, le=32)] | None = None
    timeouts: Timeouts = Timeouts()
    chunk_acceptance: bool = Field(
        True,
        description="estimate acceptance from tokens per streamed chunk when the server "
        "reports none per request; turn off for servers that merge engine steps into one "
        "chunk (vLLM --stream-interval > 1), then the pool's counters or speed are used",
    )
    passthrough_non_streaming: bool | None = Field(
        None,
        description="how a client's non-streaming request reaches the pool. Left out: a "
        "standard pool, or a speculative pool whose answers carry vLLM's per-request "
        "metrics (--per-request-spec-decode-metrics, detected from its answers), gets it as "
        "it is and its answer passes through untouched; other speculative pools get it "
        "streamed, to count tokens per chunk, and speclane assembles the answer. true: always "
        "pass through; false: always assemble. Requests a stream cannot carry exactly "
        "(n > 1, prompt_logprobs, echo, beam search, tool calls, several prompts) always "
        "pass through",
    )
    discovery: Literal["none", "dns"] = Field(
        "none",
        description="dns: resolve each endpoint's host to all its addresses (a Kubernetes "
        "headless Service) and treat each address as an endpoint, so outlier ejection and "
        "least-outstanding choice act per server; re-resolved in the background",
    )
    cost_per_hour: Annotated[float, Field(ge=0)] | None = None
    engine: Engine = Field(
        Engine.VLLM,
        description="the serving engine: vllm, vllm-neuron (Trainium/Inferentia), sglang or "
        "trtllm. It decides which acceptance signal speclane reads and which guardrail "
        "modes the pool can feed",
    )
    method: Method | None = Field(
        None,
        description="how a speculative pool drafts: ngram, draft_model, eagle, eagle3, "
        "medusa, mlp_speculator, suffix or mtp (informational; lint warns when the engine "
        "does not run it)",
    )

    @model_validator(mode="after")
    def _k_matches_kind(self) -> Pool:
        if self.kind is PoolKind.SPECULATIVE and self.num_speculative_tokens is None:
            raise ValueError("a speculative pool needs num_speculative_tokens (its k)")
        if self.kind is PoolKind.STANDARD and self.num_speculative_tokens is not None:
            raise ValueError("a standard pool has no num_speculative_tokens")
        if self.kind is PoolKind.STANDARD and self.method is not None:
            raise ValueError("a standard pool has no speculation method")
        return self


class Range(_Strict):
    """An inclusive range; either end may be left open."""

    min: float | None = None
    max: float | None = None

    def contains(self, value: float) -> bool:
        return (self.min is None or value >= self.min) and (self.max is None or value <= self.max)


class ToolNames(_Strict):
    """Matches when the request offers at least one of these tools."""

    names: Annotated[list[str], Field(min_length=1)]


ToolsMatch = Literal["present", "absent"] | ToolNames


class Match(_Strict):
    """Conditions over a request's features; all given conditions must hold."""

    endpoint: list[str] | None = None
    model: list[str] | None = None
    temperature: Range | None = None
    top_p: Range | None = None
    tools: ToolsMatch | None = None
    response_format: list[ResponseFormat] | None = None
    context_tokens: Range | None = None
    max_tokens: Range | None = None
    stream: bool | None = None
    tenant: list[str] | None = None
    headers: dict[str, str] | None = None


class GuardrailMode(StrEnum):
    ECONOMIC = "economic"
    THRESHOLD = "threshold"


ALIASES = {"speedup": GuardrailMode.ECONOMIC}  # older names of guardrail modes


def _mode(value: object) -> object:
    return ALIASES.get(value, value) if isinstance(value, str) else value


# a guardrail mode, by its name or an older one (read as the mode it names now)
Mode = Annotated[
    GuardrailMode,
    BeforeValidator(_mode),
    WithJsonSchema({"type": "string", "enum": [*GuardrailMode, *ALIASES]}),
]


class ProbeMode(StrEnum):
    LIVE = "live"
    SHADOW = "shadow"


class Guardrail(_Strict):
    """When a slice falls back one rung, and when it may come back.

    ``economic`` (the default) compares the expected cost per output token of the rung a
    slice is on with the rung below (and, when fallen back, with the rung above) at the
    pools' current load: tokens per engine step measured for the slice, each pool's step
    time learned from its traffic as a function of its batch, and ``cost_per_hour``. A
    slice moves when the other rung is cheaper with ``confidence``. ``speedup`` is an older
    name for it, read as ``economic`` when the file is loaded. ``threshold`` compares the
    windowed draft acceptance rate with ``min_acceptance`` and ``recover_above`` (where drafts
    are visible).
    """

    mode: Mode = GuardrailMode.ECONOMIC
    min_acceptance: Annotated[float, Field(ge=0, le=1)] = 0.55
    recover_above: Annotated[float, Field(ge=0, le=1)] = 0.62
    min_samples: Annotated[int, Field(ge=1)] = 3
    window_s: Annotated[float, Field(gt=0)] = 300.0
    cooldown_s: Annotated[float, Field(ge=0)] = 30.0
    max_cooldown_s: Annotated[float, Field(ge=0)] = 480.0
    probe_fraction: Annotated[float, Field(ge=0, le=1)] = 0.05
    probe: ProbeMode = ProbeMode.LIVE
    probe_budget: Annotated[float, Field(ge=0, le=1)] = 0.01
    recovery_budget: Annotated[float, Field(ge=0, le=1)] = 0.02
    probe_tokens: Annotated[int, Field(ge=1, le=4096)] = 16
    confidence: Annotated[float, Field(ge=0.5, lt=1)] = 0.999
    min_speedup: Annotated[float, Field(gt=0)] = 1.0
    recover_speedup: Annotated[float, Field(gt=0)] = 1.1
    draft_cost_ratio: Annotated[float, Field(ge=0, le=1)] = 0.1
    ttft_p50_s: Annotated[float, Field(gt=0)] | None = None
    ttft_ratio: Annotated[float, Field(gt=1)] = 1.5

    @property
    def economic(self) -> bool:
        return self.mode is GuardrailMode.ECONOMIC


class GuardrailOverride(_Strict):
    """Per-rule changes to the policy's guardrail defaults."""

    mode: Mode | None = None
    min_acceptance: Annotated[float, Field(ge=0, le=1)] | None = None
    recover_above: Annotated[float, Field(ge=0, le=1)] | None = None
    min_samples: Annotated[int, Field(ge=1)] | None = None
    window_s: Annotated[float, Field(gt=0)] | None = None
    cooldown_s: Annotated[float, Field(ge=0)] | None = None
    max_cooldown_s: Annotated[float, Field(ge=0)] | None = None
    probe_fraction: Annotated[float, Field(ge=0, le=1)] | None = None
    probe: ProbeMode | None = None
    probe_budget: Annotated[float, Field(ge=0, le=1)] | None = None
    recovery_budget: Annotated[float, Field(ge=0, le=1)] | None = None
    probe_tokens: Annotated[int, Field(ge=1, le=4096)] | None = None
    confidence: Annotated[float, Field(ge=0.5, lt=1)] | None = None
    min_speedup: Annotated[float, Field(gt=0)] | None = None
    recover_speedup: Annotated[float, Field(gt=0)] | None = None
    draft_cost_ratio: Annotated[float, Field(ge=0, le=1)] | None = None
    ttft_p50_s: Annotated[float, Field(gt=0)] | None = None
    ttft_ratio: Annotated[float, Field(gt=1)] | None = None

    def apply(self, base: Guardrail) -> Guardrail:
        return base.model_copy(update=self.model_dump(exclude_none=True))


class TenantList(_Strict):
    allow: list[str] | None = None
    deny: list[str] = []


class FlagDefault(_Strict):
    """A flag the policy refers to, with the value it has until ops set it."""

    enabled: bool = True
    rollout: Annotated[float, Field(ge=0, le=100)] | None = None
    tenants: TenantList | None = None
    description: str = ""


ApiKeyHash = Annotated[str, Field(pattern=r"^sha256:[0-9a-f]{64}$")]


class Tenant(_Strict):
    """A tenant: the API keys that are its (SHA-256 hashes, never the keys), and how many
    of its requests may be in flight at once."""

    api_keys: list[ApiKeyHash] = Field(
        [],
        description="sha256:<hex> of each key (speclane policy hash-key prints it); a request "
        "with one of these keys as its bearer token belongs to this tenant",
    )
    max_concurrent_requests: Annotated[int, Field(ge=1)] | None = Field(
        None,
        description="requests of this tenant in flight at once; more get 429 with Retry-After "
        "(default: SPECLANE_MAX_REQUESTS_PER_TENANT)",
    )


class Experiment(_Strict):
    """An A/B split of a rule's traffic between two rungs, stable per user within a tenant.
    The upper arm is the one the guardrail protects (the rule's ``start``)."""

    arms: Annotated[list[Annotated[str, Field(min_length=1)]], Field(min_length=2, max_length=2)]
    split: Annotated[float, Field(ge=0, le=100)] = 50.0


def _start_or_experiment(schema: dict[str, Any]) -> None:
    """For editors: ``start`` is needed unless an experiment names the arms."""
    schema["required"] = [k for k in schema.get("required", []) if k != "start"]
    schema["anyOf"] = [{"required": ["start"]}, {"required": ["experiment"]}]


class Rule(_Strict):
    """Traffic that matches ``match`` starts on rung ``start``. First match wins. With an
    ``experiment``, ``start`` may be left out: it is the first arm."""

    model_config = ConfigDict(extra="forbid", frozen=True, json_schema_extra=_start_or_experiment)
    name: Annotated[str, Field(min_length=1, pattern=r"^[A-Za-z0-9_.:-]+$")]
    match: Match = Match()
    start: Annotated[str, Field(min_length=1)]
    experiment: Experiment | None = None
    shadow_fraction: Annotated[float, Field(ge=0, le=1)] = 0.05
    shadow_to: str | None = None
    flag: str | None = None
    rollout: Annotated[float, Field(ge=0, le=100)] | None = None
    guardrail: GuardrailOverride | None = None
    description: str = ""

    @model_validator(mode="before")
    @classmethod
    def _start_from_arms(cls, data: object) -> object:
        if isinstance(data, dict) and "start" not in data:
            experiment = data.get("experiment")
            arms = experiment.get("arms") if isinstance(experiment, dict) else None
            if isinstance(arms, list) and arms and isinstance(arms[0], str):
                return {**data, "start": arms[0]}
        return data


class Bands(_Strict):
    """Band edges that split a rule's traffic into slices, in ascending order."""

    temperature: list[float] = [0.3, 0.9]
    context_tokens: list[int] = [4000, 16000]
    tool_schemas: Annotated[int, Field(ge=0, le=256)] = Field(
        64,
        description="requests offering tools are sliced by a hash of their tool names and "
        "schemas into this many buckets (0: not at all), so one tool schema with low "
        "acceptance moves alone",
    )
    split: bool = Field(
        True,
        description="split a slice by the applications inside it when their economics "
        "differ with the guardrail's confidence, and merge it back when they no longer do",
    )
    split_by: list[str] = Field(
        ["template", "tenant", "tools", "api"],
        description="keys a slice may split by, tried in this order: template, tenant, "
        "tools, api, or header:<name>",
    )
    max_children: Annotated[int, Field(ge=1, le=64)] = Field(
        8, description="the most children one slice splits into; other values stay pooled"
    )
    merge_after_s: Annotated[float, Field(ge=0)] = Field(
        600.0,
        description="children merge back after serving on their parent's rung, with no "
        "confident difference left between them, this long",
    )
    pin: dict[str, str] = Field(
        {},
        description="rule name -> key: that rule's slices are always split by the key "
        "(busiest values first), whatever their economics",
    )


class RequestDefaults(_Strict):
    """What the served model uses when a request leaves a sampling field out: vLLM applies
    the model's ``generation_config.json`` (Qwen3: temperature 0.6), or 1.0 when it sets
    none. Rules and slices read a request without ``temperature`` as this, and the reason
    header says it was assumed. Left out: ``SPECLANE_DEFAULT_TEMPERATURE`` and
    ``SPECLANE_DEFAULT_TOP_P`` (1.0)."""

    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None


class PolicyFile(_Strict):
    """The whole policy file."""

    version: Literal[1]
    pools: Annotated[dict[str, Pool], Field(min_length=1)]
    ladder: list[str] | None = None
    ladders: dict[str, list[str]] | None = None
    passthrough_pool: str | dict[str, str] | None = Field(
        None,
        description="the pool that takes a model's requests to the engine's other routes "
        "(tokenize, embeddings, count_tokens, score, rerank, audio, /v1/models/{id}), failing "
        "over to the rest of its ladder from the bottom up: one pool name, for the model it "
        "serves, or model -> pool (default: the ladder's last rung)",
    )
    defaults: RequestDefaults = Field(
        RequestDefaults(),
        description="what the served model uses when a request leaves temperature or top_p "
        "out (its generation_config.json; speclane init finds or asks it); rules match a "
        "request without them as these",
    )
    slices: Bands = Bands()
    guardrail: Guardrail = Guardrail()
    flags: dict[str, FlagDefault] = {}
    tenants: dict[Annotated[str, Field(pattern=r"^[A-Za-z0-9_.:@-]{1,128}$")], Tenant] = {}
    rules: Annotated[list[Rule], Field(min_length=1, max_length=MAX_RULES)]
