"""A starter policy from what ``speclane init`` found: pools, a ladder and rules, commented.

Speculative endpoints that run the same engine, method and k form one pool; several such
pools stand on the ladder by k, largest first, above the standard pool. The rules start the
kinds of traffic on which drafts tend to agree with the target (structured JSON, tool calls,
code, and everything else by default) on speculation, long prompts on the standard pool, and
creative, high-temperature traffic in ``shadow`` (the standard pool answers and a share is
mirrored to speculation to measure it). The guardrail then moves each slice on its own
evidence; the rules only say where a slice starts. The file lints clean; what only the
operator knows (prices, a k the server does not show) is marked ``DECIDE``. Pure.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass

from gateway.setup.found import Found
from gateway.setup.sampling import VLLM_DEFAULT, Sampling
from policies.model import Bands, Engine, Guardrail

UNKNOWN_K = 4  # written, marked DECIDE, when neither the server nor --k says


@dataclass(frozen=True, slots=True)
class Pool:
    name: str
    speculative: bool
    engine: Engine
    k: int | None
    k_shown: bool
    method: str | None
    endpoints: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Starter:
    text: str
    decide: tuple[str, ...]  # what the operator still has to decide, one line each


def pools(spec: Sequence[Found], standard: Sequence[Found], k: int | None) -> list[Pool]:
    """The pools, speculative ones by k (largest first), the standard pool last."""
    groups: dict[tuple[Engine, int | None, str | None], list[Found]] = {}
    for found in spec:
        method = found.method.value if found.method else None
        groups.setdefault((found.engine, found.k or k, method), []).append(found)
    ordered = sorted(groups.items(), key=lambda item: -(item[0][1] or 0))
    out: list[Pool] = []
    for (engine, group_k, method), members in ordered:
        name = _name(len(ordered), engine, group_k, [p.name for p in out])
        shown = all(member.k is not None for member in members) or k is not None
        urls = tuple(member.url for member in members)
        out.append(Pool(name, True, engine, group_k or UNKNOWN_K, shown, method, urls))
    engine = standard[0].engine if standard else Engine.VLLM
    urls = tuple(found.url for found in standard)
    out.append(Pool("standard", False, engine, None, True, None, urls))
    return out


def _name(count: int, engine: Engine, k: int | None, taken: list[str]) -> str:
    name = "spec" if count == 1 else f"spec-k{k or UNKNOWN_K}"
    if name in taken:
        name = f"{name}-{engine.value}"
    base, n = name, 2
    while name in taken:
        name, n = f"{base}-{n}", n + 1
    return name


def starter(
    model: str,
    found: Sequence[tuple[str, Found]],
    ladder: Sequence[Pool],
    defaults: Sampling | None = None,
) -> Starter:
    """The policy file's text: a header of what was found and what to decide, the pools,
    the ladder, the model's sampling defaults, the default bands and guardrail (commented)
    and the rules."""
    defaults = defaults or Sampling(VLLM_DEFAULT, None, "vLLM's own default", decide=True)
    decide = [
        "cost_per_hour of each pool (what one endpoint costs an hour): with prices the "
        "guardrail and speclane report compare cost per token, without them speed",
    ]
    if defaults.decide:
        decide.append(
            f"defaults.temperature: the temperature {model} samples at when a request sets "
            f"none ({defaults.source}; --default-temperature sets it)"
        )
    decide += [
        f"num_speculative_tokens of pool {p.name}: the server does not show its k "
        f"({UNKNOWN_K} is written); give the k it was started with"
        for p in ladder
        if p.speculative and not p.k_shown
    ]
    lines = ["# A starter policy written by `speclane init` from these endpoints:"]
    for role, item in found:
        lines.append(f"#   {item.url} ({role}): {_summary(item)}")
    lines.append("# Still to decide (marked DECIDE below):")
    for line in decide:
        wrapped = textwrap.wrap(line, 84)
        lines += [f"#   - {wrapped[0]}", *(f"#     {more}" for more in wrapped[1:])]
    lines += [
        "# Check it after every edit: speclane policy lint FILE. Every key is described in",
        "# docs/policy.md of speclane's repository, and `speclane policy schema` prints them.",
        "version: 1",
        "pools:",
    ]
    for pool in ladder:
        lines += _pool_lines(pool, model)
    names = ", ".join(pool.name for pool in ladder)
    lines.append(f"ladder: [{names}]  # best first; a slice falls to the cheapest rung below")
    lines += _defaults_lines(model, defaults)
    lines += commented_defaults()
    lines += _rules(ladder)
    return Starter("\n".join(lines) + "\n", tuple(decide))


def _defaults_lines(model: str, defaults: Sampling) -> list[str]:
    """What the model samples at when a request sets none: rules and slices read such a
    request as this, and the reason header says it was assumed."""
    lines = [
        f"defaults:  # what {model} samples at when a request sets none (vLLM applies",
        "  # the model's generation_config.json); rules read such a request as this",
    ]
    mark = "  # DECIDE" if defaults.decide else ""
    wrapped = textwrap.wrap(defaults.source, 76, break_long_words=False, break_on_hyphens=False)
    lines += [f"  # source: {wrapped[0]}", *(f"  #   {more}" for more in wrapped[1:])]
    lines.append(f"  temperature: {defaults.temperature:g}{mark}")
    if defaults.top_p is not None:
        lines.append(f"  top_p: {defaults.top_p:g}")
    return lines


def commented_defaults() -> list[str]:
    """The ``slices`` and ``guardrail`` keys at their defaults, commented: the bands the
    ``x-speclane-slice`` header shows and the guardrail's settings, to find and change."""
    lines = ["# slices:  # the bands x-speclane-slice shows (defaults; uncomment to change)"]
    lines += [f"#   {key}: {_yaml(value)}" for key, value in Bands().model_dump().items()]
    lines.append("# guardrail:  # when a slice moves off speculation and back (defaults)")
    lines += [
        f"#   {key}: {_yaml(value)}" for key, value in Guardrail().model_dump(mode="json").items()
    ]
    return lines


def _yaml(value: object) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def _summary(found: Found) -> str:
    engine = found.engine.value + (f" {found.version}" if found.version else "")
    if found.speculates:
        k = f"k={found.k}" if found.k else "k not shown"
        method = f"{found.method.value}, " if found.method else ""
        speculation = f"speculative ({method}{k})"
    else:
        speculation = "standard" if found.speculates is False else "speculation not shown"
    return f"{engine}, {speculation}, serves {', '.join(found.models)}"


def _pool_lines(pool: Pool, model: str) -> list[str]:
    kind = "speculative" if pool.speculative else "standard"
    lines = [f"  {pool.name}:", f"    kind: {kind}", f"    model: {json.dumps(model)}"]
    lines.append(f"    engine: {pool.engine.value}")
    if pool.speculative:
        if pool.method:
            lines.append(f"    method: {pool.method}")
        mark = "" if pool.k_shown else "  # DECIDE: the server does not show its k"
        lines.append(f"    num_speculative_tokens: {pool.k}{mark}")
    endpoints = ", ".join(json.dumps(url) for url in pool.endpoints)
    lines.append(f"    endpoints: [{endpoints}]")
    lines.append("    # cost_per_hour: 0.0  # DECIDE: what one endpoint costs an hour")
    return lines


def _rules(ladder: Sequence[Pool]) -> list[str]:
    spec = [pool.name for pool in ladder if pool.speculative]
    top, low = spec[0], spec[-1]
    return [
        "rules:  # first match wins; the last one matches everything",
        "  - name: structured-json  # JSON output: drafts agree with the target most often",
        "    match: {response_format: [json_object, json_schema]}",
        f"    start: {top}",
        "  - name: tool-calls",
        "    match: {tools: present}",
        f"    start: {low}",
        "  - name: code  # clients that send the header x-speclane-endpoint: code",
        "    match: {endpoint: [code]}",
        f"    start: {top}",
        "  - name: long-context  # long prompts: verifying drafts costs more than they save",
        "    match: {context_tokens: {min: 4000}}",
        "    start: standard",
        "  - name: creative  # high temperature: the standard pool answers; 5% are mirrored",
        "    match: {temperature: {min: 0.9}}  # to speculation to measure it",
        "    start: shadow",
        "    shadow_fraction: 0.05",
        "  - name: default",
        f"    start: {low}",
    ]
