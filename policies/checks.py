"""Checks that look across the policy file: references, ladders, ranges, reachability.

Each check returns problems with a path; ``policies/load.py`` places them in the file.
Pure; no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from policies.model import (
    KILL_SWITCH,
    SHADOW,
    STANDARD,
    Match,
    PolicyFile,
    PoolKind,
    Range,
)
from policies.problems import Problem, Severity


def ladders_of(policy: PolicyFile) -> dict[str, list[str]]:
    """Model name -> its ladder of pool names, from ``ladder`` or ``ladders``."""
    if policy.ladders is not None:
        return dict(policy.ladders)
    if policy.ladder is not None:
        models = {policy.pools[p].model for p in policy.ladder if p in policy.pools}
        return {model: list(policy.ladder) for model in models}
    return {}


def check(policy: PolicyFile) -> list[Problem]:
    """Every cross-file problem of a policy that passed schema validation."""
    return [
        *_ladder_problems(policy),
        *_rule_problems(policy),
        *_band_problems(policy),
        *_guardrail_problems(policy),
    ]


def _ladder_problems(policy: PolicyFile) -> Iterator[Problem]:
    if (policy.ladder is None) == (policy.ladders is None):
        yield Problem(
            ("ladder",),
            "give exactly one of 'ladder' (one model) or 'ladders' (by model)",
            "for one model write: ladder: [spec-k7, standard]",
        )
        return
    named = {"": policy.ladder} if policy.ladder is not None else dict(policy.ladders or {})
    for model, rungs in named.items():
        base: tuple[str | int, ...] = ("ladder",) if model == "" else ("ladders", model)
        yield from _one_ladder(policy, base, model, rungs)


def _one_ladder(
    policy: PolicyFile, base: tuple[str | int, ...], model: str, rungs: list[str]
) -> Iterator[Problem]:
    if not rungs:
        yield Problem(base, "a ladder needs at least one pool", "end it with a standard pool")
        return
    models: set[str] = set()
    for i, name in enumerate(rungs):
        pool = policy.pools.get(name)
        if pool is None:
            yield Problem((*base, i), f"no pool named {name!r}", _choices(policy.pools))
            continue
        models.add(pool.model)
        if model and pool.model != model:
            yield Problem((*base, i), f"pool {name!r} serves {pool.model!r}, not {model!r}")
    if len(set(rungs)) != len(rungs):
        yield Problem(base, "a pool appears twice on the ladder")
    if len(models) > 1:
        yield Problem(base, f"one ladder serves one model, this one mixes {sorted(models)}")
    last = policy.pools.get(rungs[-1])
    if last is not None and last.kind is not PoolKind.STANDARD:
        yield Problem(
            (*base, len(rungs) - 1),
            "the ladder must end on a standard pool",
            "falling back needs somewhere without speculation to land",
        )


def _rule_problems(policy: PolicyFile) -> Iterator[Problem]:
    ladders = ladders_of(policy)
    on_ladders = {p for rungs in ladders.values() for p in rungs}
    seen: set[str] = set()
    for i, rule in enumerate(policy.rules):
        at = ("rules", i)
        if rule.name in seen:
            yield Problem((*at, "name"), f"rule name {rule.name!r} is used twice")
        seen.add(rule.name)
        if rule.start not in (SHADOW, STANDARD) and rule.start not in on_ladders:
            yield Problem(
                (*at, "start"),
                f"start {rule.start!r} is not a pool on a ladder",
                f"use one of {sorted(on_ladders | {SHADOW, STANDARD})}",
            )
        if rule.shadow_to is not None and rule.shadow_to not in on_ladders:
            yield Problem((*at, "shadow_to"), f"no pool {rule.shadow_to!r} on a ladder")
        if rule.flag is not None and rule.flag not in policy.flags and rule.flag != KILL_SWITCH:
            yield Problem(
                (*at, "flag"),
                f"flag {rule.flag!r} is not declared under 'flags'",
                "declare it with a default, or it starts enabled",
                Severity.WARNING,
            )
        yield from _match_problems(rule.match, (*at, "match"))
    last = policy.rules[-1]
    if last.match != Match():
        yield Problem(
            ("rules", len(policy.rules) - 1),
            "the last rule must match everything (a default)",
            "add a rule with no 'match', e.g. {name: default, start: standard}",
        )


def _match_problems(match: Match, at: tuple[str | int, ...]) -> Iterator[Problem]:
    ranges: dict[str, Range | None] = {
        "temperature": match.temperature,
        "top_p": match.top_p,
        "context_tokens": match.context_tokens,
        "max_tokens": match.max_tokens,
    }
    for name, value in ranges.items():
        if value and value.min is not None and value.max is not None and value.min > value.max:
            yield Problem((*at, name), f"empty range: min {value.min} > max {value.max}")
    for name in ("endpoint", "model", "response_format", "tenant"):
        if getattr(match, name) == []:
            yield Problem((*at, name), "an empty list matches nothing", "remove the key")


def _band_problems(policy: PolicyFile) -> Iterator[Problem]:
    bands: dict[str, list[float]] = {
        "temperature": list(policy.slices.temperature),
        "context_tokens": [float(v) for v in policy.slices.context_tokens],
    }
    for name, edges in bands.items():
        if edges != sorted(set(edges)):
            yield Problem(("slices", name), "band edges must be strictly ascending")


def _guardrail_problems(policy: PolicyFile) -> Iterator[Problem]:
    base = policy.guardrail
    if base.recover_above < base.min_acceptance:
        yield Problem(
            ("guardrail", "recover_above"),
            "recover_above is below min_acceptance: a slice would flap",
            "set recover_above a little above min_acceptance",
        )
    for i, rule in enumerate(policy.rules):
        if rule.guardrail is None:
            continue
        merged = rule.guardrail.apply(base)
        if merged.recover_above < merged.min_acceptance:
            yield Problem(
                ("rules", i, "guardrail"),
                "recover_above is below min_acceptance: the slice would flap",
            )


def _choices(names: Iterable[str]) -> str:
    return f"known pools: {', '.join(sorted(names))}"
