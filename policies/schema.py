"""What the policy file's schema expects at each place, for people and for editors.

``walk`` follows a pydantic error location through the models of ``policies/model.py`` to
the type expected there, so ``policies/load.py`` can name the allowed keys and describe the
expected value in words. ``json_schema`` is the JSON Schema shipped as
``policies/policy.schema.json``, with a description for every key: the field's own
``Field(description=...)`` if it has one, else the table below (a test keeps every key
described one way or the other). Pure; no I/O.
"""

from __future__ import annotations

import json
import types
import typing
from dataclasses import dataclass
from enum import Enum
from typing import Any

from pydantic import BaseModel

from policies import model as m
from policies.problems import Path

SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"

_GUARDRAIL = {
    "mode": "economic (default): move a slice when the other rung is cheaper per output token "
    "at the current load, with confidence; threshold: judge the draft acceptance rate against "
    "min_acceptance/recover_above; speedup: an older name for economic",
    "min_acceptance": "threshold mode: fall back one rung when windowed draft acceptance is "
    "below this",
    "recover_above": "threshold mode: come back up after a probe whose acceptance is above this",
    "min_samples": "measured requests the newest span needs before it is judged",
    "window_s": "seconds of live statistics a judgement looks at",
    "cooldown_s": "seconds a fallen-back slice waits before coming back or probing",
    "max_cooldown_s": "economic mode: the longest a fallen-back slice goes without a probe "
    "(its probe share is at least one request in this many seconds); threshold mode: unused",
    "probe_fraction": "threshold mode: the share of a probing slice's requests sent (or "
    "mirrored) to the rung above; economic mode: the most of a slice's requests sent to a "
    "pool below to learn its step time, besides what a slice leaning towards that pool "
    "serves there (up to a quarter; half while the pool is not yet learned)",
    "probe": "live: serve probes from the rung above; shadow: mirror them instead",
    "probe_budget": "economic mode: the share of a fallen-back slice's cost its probes may "
    "add in expectation (probes of a rung barely dearer are many, of one far dearer few)",
    "recovery_budget": "economic mode: the share of a fallen-back slice's cost that short "
    "mirrored probes of the rung above may add, so that a quiet slice hears of a healing "
    "within about ten of its requests (a busy one's live probes do without them); live "
    "probes instead where those cost less (a long prompt prefilled whole wherever it goes)",
    "probe_tokens": "economic mode: the output tokens a short mirrored probe asks for",
    "confidence": "economic mode: how sure the guardrail must be that the other rung is "
    "cheaper before it moves a slice (one-sided)",
    "min_speedup": "ignored (older files set it): the guardrail judges cost or acceptance",
    "recover_speedup": "ignored (older files set it): the guardrail judges cost or acceptance",
    "draft_cost_ratio": "cost of one draft pass relative to one target pass (c): the prior "
    "for a pool's step time before it has served anything",
    "ttft_p50_s": "economic mode: a latency goal: a slice leaves a rung whose median time to "
    "first token for it is above this many seconds when the rung below serves it sooner",
    "ttft_ratio": "economic mode, without ttft_p50_s: a slice leaves a speculative rung before "
    "its median time to first token there reaches this multiple of the rung below's for the "
    "same slice (at 60% of the way: 1.3x for 1.5), where the judge is not sure that rung is the "
    "cheaper",
}
_RANGE = "an inclusive range {min: ..., max: ...}; either end may be left out"

DESCRIPTIONS: dict[type[BaseModel], dict[str, str]] = {
    m.PolicyFile: {
        "version": "file format version; always 1",
        "pools": "pool name -> endpoints that serve one target model one way",
        "ladder": "one model: pool names best first, ending on a standard pool",
        "ladders": "several models: model name -> its ladder of pool names",
        "slices": "band edges that split each rule's traffic into slices",
        "guardrail": "when a slice falls back one rung, and when it may come back",
        "flags": "flags the rules refer to, with their values until ops change them",
        "tenants": "tenant name -> its API keys (hashed) and its cap of requests in flight",
        "rules": "first match wins; the last rule must match everything",
    },
    m.Pool: {
        "kind": "speculative (with num_speculative_tokens) or standard",
        "model": "the target model name clients send in 'model'",
        "endpoints": "base URLs of OpenAI-compatible servers (http:// or https://)",
        "num_speculative_tokens": "k, the draft tokens per step the server was started with",
        "timeouts": "seconds to connect, to the first streamed event, and between events",
        "cost_per_hour": "what one endpoint costs per hour, for reports",
    },
    m.Timeouts: {
        "connect_s": "seconds to open a connection",
        "first_byte_s": "seconds to wait for the first streamed event",
        "idle_s": "seconds to wait between streamed events",
        "total_s": "seconds a whole request may take, every try included (the first rung's)",
    },
    m.Range: {"min": "smallest value that matches (inclusive)", "max": "largest (inclusive)"},
    m.ToolNames: {"names": "matches when the request offers at least one of these tools"},
    m.Match: {
        "endpoint": "APIs by name (chat, completions, messages, responses), HTTP paths, or "
        "x-speclane-endpoint header values",
        "model": "model names as clients send them",
        "temperature": _RANGE + " (the backend default when the request has none)",
        "top_p": _RANGE,
        "tools": "present, absent, or {names: [...]}: at least one of these tools offered",
        "response_format": "text, json_object or json_schema",
        "context_tokens": _RANGE + " over the estimated prompt tokens",
        "max_tokens": _RANGE + "; requests without max_tokens do not match",
        "stream": "true: streaming requests only; false: non-streaming only",
        "tenant": "tenant ids (x-speclane-tenant header, or a hash of the API key)",
        "headers": "header name -> exact value; every one must be present",
    },
    m.Guardrail: _GUARDRAIL,
    m.GuardrailOverride: _GUARDRAIL,
    m.TenantList: {
        "allow": "only these tenants (leave out for every tenant)",
        "deny": "never these tenants; deny wins over allow",
    },
    m.FlagDefault: {
        "enabled": "on or off until ops change it",
        "rollout": "percentage of tenants (stable per tenant; 'anonymous' only at 100)",
        "tenants": "tenant targeting: {allow: [...], deny: [...]}",
        "description": "what the flag is for",
    },
    m.Rule: {
        "name": "unique name; part of every slice key and metric label",
        "match": "conditions over request features; all must hold; leave out to match all",
        "start": "the ladder rung this traffic starts on: a pool, 'standard' or 'shadow'",
        "shadow_fraction": "start: shadow: share of requests mirrored to speculation",
        "shadow_to": "start: shadow: pool that gets the mirrors (default: first speculative)",
        "flag": "speculation only while this flag admits the request",
        "rollout": "speculation only for this percentage of tenants (stable per tenant; "
        "'anonymous' only at 100)",
        "guardrail": "changes to the policy's guardrail for this rule",
        "description": "what the rule is for",
        "experiment": "an A/B split of this rule's traffic between two rungs, stable per user "
        "within a tenant: {arms: [upper, lower], split: percent on the first}",
    },
    m.Experiment: {
        "arms": "two rungs, the upper (speculative, guarded) one first; 'standard' names the "
        "ladder's standard pool",
        "split": "percent of the rule's users on the first arm (default 50)",
    },
    m.Bands: {
        "temperature": "ascending temperature band edges",
        "context_tokens": "ascending prompt-token band edges",
    },
    m.RequestDefaults: {
        "temperature": "the temperature the served model samples at when a request has none "
        "(vLLM: the model's generation_config.json, else 1.0)",
        "top_p": "the top_p the served model uses when a request has none",
    },
}


@dataclass(frozen=True, slots=True)
class Place:
    """Where an error location leads: the path in the file and the type expected there.

    ``union_at`` is set when the location went through one member (``branch``) of a union,
    such as ``match.tools``; pydantic reports one error per member it tried.
    """

    path: Path
    expected: Any
    union_at: Path | None = None
    branch: Any = None


def walk(loc: tuple[str | int, ...], root: Any = m.PolicyFile) -> Place:
    """Follow ``loc`` from the top of the file (a ``root`` model, the policy file unless
    said); unknown parts keep the path, lose the type."""
    expected: Any = root
    path: Path = ()
    union_at: Path | None = None
    branch: Any = None
    for part in loc:
        members = alternatives(expected)
        chosen = _member_tagged(members, part) if len(members) > 1 else None
        if chosen is not None:
            union_at, branch, expected = path, chosen, chosen
            continue
        expected = _child(expected, part)
        path = (*path, part)
    return Place(path, expected, union_at, branch)


def alternatives(tp: Any) -> list[Any]:
    """The non-None members of a type, ``Annotated`` stripped (one member if not a union)."""
    tp = _bare(tp)
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return [_bare(a) for a in typing.get_args(tp) if a is not type(None)]
    return [tp]


def model_of(tp: Any) -> type[BaseModel] | None:
    members = alternatives(tp)
    found = [a for a in members if isinstance(a, type) and issubclass(a, BaseModel)]
    return found[0] if len(found) == 1 else None


def allowed_keys(tp: Any) -> list[str]:
    model = model_of(tp)
    return list(model.model_fields) if model else []


def description(tp: Any, key: str) -> str:
    """What ``key`` is for: the field's own description, else the table above."""
    model = model_of(tp)
    if model is None or key not in model.model_fields:
        return ""
    return model.model_fields[key].description or DESCRIPTIONS.get(model, {}).get(key, "")


def is_mapping_type(tp: Any) -> bool:
    return any(model_of(a) or typing.get_origin(a) is dict for a in alternatives(tp))


def choices(tp: Any) -> list[str]:
    """The fixed words a value may be (literals and enum values), if any."""
    words: list[str] = []
    for member in alternatives(tp):
        if typing.get_origin(member) is typing.Literal:
            words.extend(str(v) for v in typing.get_args(member))
        elif isinstance(member, type) and issubclass(member, Enum):
            words.extend(str(e.value) for e in member)
    return words


def describe(tp: Any) -> str:
    """The expected value in words: ``'present', 'absent' or {names: [...]}``."""
    words: list[str] = []
    for member in alternatives(tp):
        words.extend(_words(member))
    if len(words) <= 1:
        return "".join(words) or "a value"
    return ", ".join(words[:-1]) + " or " + words[-1]


def _words(tp: Any) -> list[str]:
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        return [repr(v) for v in typing.get_args(tp)]
    if isinstance(tp, type) and issubclass(tp, Enum):
        return [repr(e.value) for e in tp]
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return [_shape(tp)]
    if origin is list:
        return [f"a list of {describe(typing.get_args(tp)[0])}"]
    if origin is dict:
        return ["a mapping"]
    simple = {bool: "true or false", int: "a whole number", float: "a number", str: "a string"}
    return [simple.get(tp, getattr(tp, "__name__", str(tp)))]


def _shape(model: type[BaseModel]) -> str:
    fields = model.model_fields
    shown = [name for name, info in fields.items() if info.is_required()] or list(fields)
    parts = [f"{name}: {_placeholder(fields[name].annotation)}" for name in shown[:3]]
    return "{" + ", ".join(parts) + (", ..." if len(shown) > 3 else "") + "}"


def _placeholder(tp: Any) -> str:
    members = alternatives(tp)
    if any(typing.get_origin(a) is list for a in members):
        return "[...]"
    return "{...}" if is_mapping_type(tp) else "..."


def _bare(tp: Any) -> Any:
    while typing.get_origin(tp) is typing.Annotated:
        tp = typing.get_args(tp)[0]
    return tp


def _member_tagged(members: list[Any], part: str | int) -> Any:
    if not isinstance(part, str):
        return None
    for member in members:
        literal = typing.get_origin(member) is typing.Literal
        if (literal and part.startswith("literal[")) or getattr(member, "__name__", "") == part:
            return member
    return None


def _child(tp: Any, part: str | int) -> Any:
    members = alternatives(tp)
    if len(members) != 1:
        return None
    bare = members[0]
    if isinstance(bare, type) and issubclass(bare, BaseModel) and isinstance(part, str):
        field = bare.model_fields.get(part)
        return field.annotation if field else None
    args = typing.get_args(bare)
    if typing.get_origin(bare) is list and isinstance(part, int):
        return args[0]
    if typing.get_origin(bare) is dict and isinstance(part, str):
        return args[1]
    return None


def json_schema() -> dict[str, Any]:
    """The JSON Schema of the policy file, with a description on every key."""
    schema = m.PolicyFile.model_json_schema(mode="validation")
    definitions: dict[str, Any] = schema.get("$defs", {})
    for model, table in DESCRIPTIONS.items():
        target = schema if model is m.PolicyFile else definitions.get(model.__name__)
        if target is None:
            continue
        for key in table:
            target["properties"][key]["description"] = description(model, key)
    schema["title"] = "speclane policy file"
    return {"$schema": SCHEMA_DIALECT, **schema}


def json_schema_text() -> str:
    """``json_schema`` as the text shipped in ``policies/policy.schema.json``."""
    return json.dumps(json_schema(), indent=2, ensure_ascii=False) + "\n"
