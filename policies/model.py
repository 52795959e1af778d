"""The policy file an operator writes, as pydantic models (the YAML's schema).

Only the shape lives here: each model forbids unknown keys and checks what one value can
check alone. Checks that look across the file (pools that exist, rules that can match, a
ladder that ends on a standard pool) are in ``policies/checks.py``. Pure; no I/O.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from policies.features import ResponseFormat

SHADOW = "shadow"
STANDARD = "standard"
KILL_SWITCH = "speculation"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PoolKind(StrEnum):
    SPECULATIVE = "speculative"
    STANDARD = "standard"


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
    passthrough_non_streaming: bool = Field(
        False,
        description="send a client's non-streaming request upstream as it is and pass the "
        "answer through untouched: cheaper than streaming and assembling, but such requests "
        "yield no TTFT or time per output token, and acceptance only from vLLM's per-request "
        "metrics (--per-request-spec-decode-metrics), so use it only on pools that report them",
    )
    discovery: Literal["none", "dns"] = Field(
        "none",
        description="dns: resolve each endpoint's host to all its addresses (a Kubernetes "
        "headless Service) and treat each address as an endpoint, so breakers and "
        "least-outstanding choice act per server; re-resolved in the background",
    )
    cost_per_hour: Annotated[float, Field(ge=0)] | None = None

    @model_validator(mode="after")
    def _k_matches_kind(self) -> Pool:
        if self.kind is PoolKind.SPECULATIVE and self.num_speculative_tokens is None:
            raise ValueError("a speculative pool needs num_speculative_tokens (its k)")
        if self.kind is PoolKind.STANDARD and self.num_speculative_tokens is not None:
            raise ValueError("a standard pool has no num_speculative_tokens")
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
    THRESHOLD = "threshold"
    SPEEDUP = "speedup"


class ProbeMode(StrEnum):
    LIVE = "live"
    SHADOW = "shadow"


class Guardrail(_Strict):
    """When a slice falls back one rung, and when it may come back.

    ``threshold`` mode compares the windowed draft acceptance rate with ``min_acceptance``
    and ``recover_above``. ``speedup`` mode compares the expected wall-time speed-up
    (Leviathan et al. 2023, from acceptance, k and ``draft_cost_ratio``), or the measured
    time-per-output-token ratio against the standard pool when there is one, with
    ``min_speedup`` and ``recover_speedup``.
    """

    mode: GuardrailMode = GuardrailMode.THRESHOLD
    min_acceptance: Annotated[float, Field(ge=0, le=1)] = 0.55
    recover_above: Annotated[float, Field(ge=0, le=1)] = 0.62
    min_samples: Annotated[int, Field(ge=1)] = 30
    window_s: Annotated[float, Field(gt=0)] = 120.0
    cooldown_s: Annotated[float, Field(ge=0)] = 30.0
    probe_fraction: Annotated[float, Field(ge=0, le=1)] = 0.05
    probe: ProbeMode = ProbeMode.LIVE
    min_speedup: Annotated[float, Field(gt=0)] = 1.0
    recover_speedup: Annotated[float, Field(gt=0)] = 1.1
    draft_cost_ratio: Annotated[float, Field(ge=0, le=1)] = 0.05


class GuardrailOverride(_Strict):
    """Per-rule changes to the policy's guardrail defaults."""

    mode: GuardrailMode | None = None
    min_acceptance: Annotated[float, Field(ge=0, le=1)] | None = None
    recover_above: Annotated[float, Field(ge=0, le=1)] | None = None
    min_samples: Annotated[int, Field(ge=1)] | None = None
    window_s: Annotated[float, Field(gt=0)] | None = None
    cooldown_s: Annotated[float, Field(ge=0)] | None = None
    probe_fraction: Annotated[float, Field(ge=0, le=1)] | None = None
    probe: ProbeMode | None = None
    min_speedup: Annotated[float, Field(gt=0)] | None = None
    recover_speedup: Annotated[float, Field(gt=0)] | None = None
    draft_cost_ratio: Annotated[float, Field(ge=0, le=1)] | None = None

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


class Rule(_Strict):
    """Traffic that matches ``match`` starts on rung ``start``. First match wins."""

    name: Annotated[str, Field(min_length=1, pattern=r"^[A-Za-z0-9_.:-]+$")]
    match: Match = Match()
    start: Annotated[str, Field(min_length=1)]
    shadow_fraction: Annotated[float, Field(ge=0, le=1)] = 0.05
    shadow_to: str | None = None
    flag: str | None = None
    rollout: Annotated[float, Field(ge=0, le=100)] | None = None
    guardrail: GuardrailOverride | None = None
    description: str = ""


class Bands(_Strict):
    """Band edges that split a rule's traffic into slices, in ascending order."""

    temperature: list[float] = [0.3, 0.9]
    context_tokens: list[int] = [4000, 16000]


class PolicyFile(_Strict):
    """The whole policy file."""

    version: Literal[1]
    pools: Annotated[dict[str, Pool], Field(min_length=1)]
    ladder: list[str] | None = None
    ladders: dict[str, list[str]] | None = None
    slices: Bands = Bands()
    guardrail: Guardrail = Guardrail()
    flags: dict[str, FlagDefault] = {}
    rules: Annotated[list[Rule], Field(min_length=1)]
