"""Checks that look across the policy file: references, ladders, ranges, reachability.

Each check returns problems with a path; ``policies/lint.py`` places them in the file.
Rules that can never match are found with ``policies.match.covers``.
Pure; no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from policies.engines import engine_problems
from policies.features import API_NAMES
from policies.match import LISTS, RANGES, covers, satisfiable
from policies.model import (
    ANONYMOUS,
    KILL_SWITCH,
    SHADOW,
    STANDARD,
    GuardrailMode,
    Match,
    PolicyFile,
    PoolKind,
    Range,
    Rule,
)
from policies.problems import Path, Problem, Severity, closest, did_you_mean
from policies.splitting import KEYS, valid_key


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
        *_passthrough_problems(policy),
        *_rule_problems(policy),
        *_model_problems(policy),
        *_shadowed(policy.rules),
        *_band_problems(policy),
        *_split_problems(policy),
        *_guardrail_problems(policy),
        *_tenant_problems(policy),
        *_keyless_rollouts(policy),
        *engine_problems(policy),
    ]


def _ladder_problems(policy: PolicyFile) -> Iterator[Problem]:
    if (policy.ladder is None) == (policy.ladders is None):
        yield Problem(
            ("ladder",),
            "give exactly one of 'ladder' (one model) or 'ladders' (by model)",
            "for one model write: ladder: [spec-k7, standard]",
            code="ladder",
        )
        return
    named = {"": policy.ladder} if policy.ladder is not None else dict(policy.ladders or {})
    for model, rungs in named.items():
        base: Path = ("ladder",) if model == "" else ("ladders", model)
        yield from _one_ladder(policy, base, model, rungs)


def _one_ladder(policy: PolicyFile, base: Path, model: str, rungs: list[str]) -> Iterator[Problem]:
    if not rungs:
        yield Problem(base, "a ladder needs at least one pool", "end it with a standard pool")
        return
    models: set[str] = set()
    for i, name in enumerate(rungs):
        pool = policy.pools.get(name)
        if pool is None:
            hint = _choices(policy.pools)
            yield Problem((*base, i), f"no pool named {name!r}", hint, code="unknown-pool")
            continue
        models.add(pool.model)
        if model and pool.model != model:
            yield _wrong_model(policy, (*base, i), name, pool.model, model)
    if len(set(rungs)) != len(rungs):
        yield Problem(base, "a pool appears twice on the ladder", code="ladder")
    if not model and len(models) > 1:
        message = f"one ladder serves one model, this one mixes {sorted(models)}"
        yield Problem(base, message, "use 'ladders' with one ladder per model", code="ladder")
    last = policy.pools.get(rungs[-1])
    if last is not None and last.kind is not PoolKind.STANDARD:
        yield Problem(
            (*base, len(rungs) - 1),
            f"the ladder must end on a standard pool, not {rungs[-1]!r}",
            "falling back needs somewhere without speculation to land",
            code="ladder",
        )


def passthrough_pools(policy: PolicyFile) -> dict[str, str]:
    """Model -> the pool ``passthrough_pool`` names for it (models it leaves out take their
    ladder's last rung)."""
    named = policy.passthrough_pool
    if isinstance(named, str):
        pool = policy.pools.get(named)
        return {} if pool is None else {pool.model: named}
    return dict(named or {})


def _passthrough_problems(policy: PolicyFile) -> Iterator[Problem]:
    named = policy.passthrough_pool
    if named is None:
        return
    ladders = ladders_of(policy)
    pairs = [("", named)] if isinstance(named, str) else list(named.items())
    for model, name in pairs:
        at: Path = ("passthrough_pool",) if not model else ("passthrough_pool", model)
        pool = policy.pools.get(name)
        if pool is None:
            hint = _choices(policy.pools)
            yield Problem(at, f"no pool named {name!r}", hint, code="unknown-pool")
        elif model and pool.model != model:
            yield _wrong_model(policy, at, name, pool.model, model)
        elif (model or pool.model) not in ladders:
            message = f"no ladder serves {model or pool.model!r}"
            hint = "a model's other routes go where its ladder is"
            yield Problem(at, message, hint, code="model")


def _wrong_model(policy: PolicyFile, at: Path, name: str, serves: str, model: str) -> Problem:
    message = f"pool {name!r} serves {serves!r}, not {model!r}"
    hint = ""
    if name in (policy.ladders or {}).get(serves, ()):
        message += f", and is on the ladder of {serves!r} too"
        hint = "a pool serves one model; give each model its own pools"
    return Problem(at, message, hint, code="ladder")


def _rule_problems(policy: PolicyFile) -> Iterator[Problem]:
    on_ladders = {p for rungs in ladders_of(policy).values() for p in rungs}
    seen: set[str] = set()
    for i, rule in enumerate(policy.rules):
        at: Path = ("rules", i)
        if rule.name in seen:
            message = f"rule name {rule.name!r} is used twice"
            yield Problem((*at, "name"), message, "rule names must be unique", code="duplicate")
        seen.add(rule.name)
        yield from _references(policy, rule, at, on_ladders)
        yield from _experiment_problems(policy, rule, at)
        yield from _match_problems(rule.match, (*at, "match"))
    yield from _unused_flags(policy)
    last = len(policy.rules) - 1
    if not covers(policy.rules[last].match, Match()):
        yield Problem(
            ("rules", last),
            "the last rule must match everything (a default)",
            "add a rule with no 'match', e.g. {name: default, start: standard}",
            code="no-default",
        )


def _references(
    policy: PolicyFile, rule: Rule, at: Path, on_ladders: set[str]
) -> Iterator[Problem]:
    """The pools and the flag one rule names."""
    if rule.start not in (SHADOW, STANDARD) and rule.start not in on_ladders:
        what = "a pool on a ladder" if rule.start in policy.pools else "a pool"
        yield Problem(
            (*at, "start"),
            f"start {rule.start!r} is not {what}",
            f"use one of {sorted(on_ladders | {SHADOW, STANDARD})}",
            code="unknown-pool",
        )
    if rule.shadow_to is not None and rule.shadow_to not in on_ladders:
        message = f"no pool {rule.shadow_to!r} on a ladder"
        yield Problem((*at, "shadow_to"), message, _choices(on_ladders), code="unknown-pool")
    if rule.flag is not None and rule.flag not in policy.flags and rule.flag != KILL_SWITCH:
        close = closest(rule.flag, policy.flags)
        hint = "declare it with a default, or it starts enabled"
        yield Problem(
            (*at, "flag"),
            f"flag {rule.flag!r} is not declared under flags",
            f"did you mean {close!r}? ({hint})" if close else hint,
            Severity.WARNING,
            code="undeclared-flag",
        )


def _experiment_problems(policy: PolicyFile, rule: Rule, at: Path) -> Iterator[Problem]:
    """An experiment's arms: two different rungs of every ladder the rule can reach, the
    upper one first (it is the rule's start, the arm the guardrail protects)."""
    experiment = rule.experiment
    if experiment is None:
        return
    here: Path = (*at, "experiment", "arms")
    first, second = experiment.arms
    if SHADOW in experiment.arms:
        yield Problem(here, "an experiment arm cannot be 'shadow'", "use pools", code="arms")
        return
    if first == second:
        yield Problem(here, "the two arms are the same", "split between two rungs", code="arms")
    if rule.start != first:
        message = f"start {rule.start!r} is not the first arm {first!r}"
        hint = "leave start out, or list it first: the first arm is the one the guardrail guards"
        yield Problem((*at, "start"), message, hint, code="arms")
    for model, rungs in ladders_of(policy).items():
        index = {p: i for i, p in enumerate(rungs)} | {STANDARD: len(rungs) - 1}
        if first not in index or second not in index:
            continue  # an unknown pool is reported with the rule's start, or below
        if index[first] >= index[second]:
            message = f"on the {model} ladder {first!r} is not above {second!r}"
            hint = "list the arm higher on the ladder (the speculative one) first"
            yield Problem(here, message, hint, code="arms")
    on_ladders = {p for rungs in ladders_of(policy).values() for p in rungs} | {STANDARD}
    for arm in experiment.arms:
        if arm not in on_ladders:
            yield Problem(
                here,
                f"arm {arm!r} is not a pool on a ladder",
                _choices(on_ladders),
                code="unknown-pool",
            )


def _unused_flags(policy: PolicyFile) -> Iterator[Problem]:
    named = {rule.flag for rule in policy.rules if rule.flag}
    for name in sorted(set(policy.flags) - named - {KILL_SWITCH}):
        close = closest(name, named - set(policy.flags))
        hint = f"did you mean {close!r} in a rule?" if close else "refer to it with flag: NAME"
        message = f"flag {name!r} is declared but no rule uses it"
        yield Problem(("flags", name), message, hint, Severity.WARNING, code="unused-flag")


# what a request's value can be: the APIs take temperature 0 to 2, top_p 0 to 1
_BOUNDS: dict[str, tuple[float, float | None]] = {
    "temperature": (0.0, 2.0),
    "top_p": (0.0, 1.0),
    "context_tokens": (0.0, None),
    "max_tokens": (0.0, None),
}


def _match_problems(match: Match, at: Path) -> Iterator[Problem]:
    for name in RANGES:
        value: Range | None = getattr(match, name)
        if value and value.min is not None and value.max is not None and value.min > value.max:
            message = f"empty range: min {value.min:g} > max {value.max:g}"
            yield Problem((*at, name), message, "swap min and max", code="empty-range")
        if value:
            yield from _out_of_bounds(name, value, at)
    for name in LISTS:
        if getattr(match, name) == []:
            message = "an empty list matches nothing"
            yield Problem((*at, name), message, "remove the key", code="empty-list")
    yield from _endpoint_problems(match, at)


def _out_of_bounds(name: str, value: Range, at: Path) -> Iterator[Problem]:
    """An end no request can reach: ``temperature: {min: 9}`` matches nothing, and a
    ``max`` beyond the top means the top (said, so a typo does not pass unseen)."""
    low, high = _BOUNDS[name]
    span = f"{low:g} to {high:g}" if high is not None else f"{low:g} or more"
    for end in ("min", "max"):
        edge: float | None = getattr(value, end)
        if edge is None or (low <= edge and (high is None or edge <= high)):
            continue
        message = f"{name} {end} {edge:g} is out of range: a request's {name} is {span}"
        yield Problem((*at, name, end), message, f"give a value {span}", code="out-of-range")


_API_PATHS = {path.value for path in API_NAMES.values()}


def _endpoint_problems(match: Match, at: Path) -> Iterator[Problem]:
    """An endpoint that looks like an API path but is none speclane serves matches nothing
    (an ``x-speclane-endpoint`` value may be any word, so only paths are checked)."""
    for i, value in enumerate(match.endpoint or ()):
        if value.startswith("/") and value not in _API_PATHS:
            message = f"no API is served at {value!r}: this value matches nothing"
            hint = f"name an API: {', '.join(API_NAMES)} (or its path)"
            yield Problem((*at, "endpoint", i), message, hint, Severity.WARNING, code="endpoint")


def _model_problems(policy: PolicyFile) -> Iterator[Problem]:
    """Several models: rules whose start pool serves another model than the ones they match."""
    if policy.ladders is None:
        return
    served = set(policy.ladders)
    for i, rule in enumerate(policy.rules):
        wanted = rule.match.model or []
        for model in sorted(set(wanted) - served):
            message = f"no ladder serves model {model!r}"
            at: Path = ("rules", i, "match", "model")
            yield Problem(
                at, message, f"ladders serve {sorted(served)}", Severity.WARNING, code="model"
            )
        pool = policy.pools.get(rule.start)
        if pool is None or not wanted:
            continue
        others = sorted(set(wanted) & served - {pool.model})
        if pool.model not in wanted:
            yield Problem(
                ("rules", i, "start"),
                f"start {rule.start!r} serves {pool.model!r}, but the rule matches only {wanted}",
                f"start on a pool of {wanted[0]!r}, or add {pool.model!r} to match.model",
                code="model",
            )
        elif others:
            message = f"start {rule.start!r} serves only {pool.model!r}: {others} start on standard"
            hint = "give each model its own rule"
            yield Problem(("rules", i, "start"), message, hint, Severity.WARNING, code="model")


def _shadowed(rules: list[Rule]) -> Iterator[Problem]:
    for j, later in enumerate(rules):
        if not satisfiable(later.match):
            continue
        for earlier in rules[:j]:
            if covers(earlier.match, later.match):
                yield _shadow_problem(earlier, j, later)
                break


def _shadow_problem(earlier: Rule, j: int, later: Rule) -> Problem:
    message = (
        f"rule {later.name!r} can never match: the earlier rule {earlier.name!r} "
        "matches every request it would"
    )
    if earlier.match == Match():
        hint = f"{earlier.name!r} has no match and takes everything; move it last"
    else:
        hint = f"move {later.name!r} above {earlier.name!r}, or narrow {earlier.name!r}"
    if earlier.flag is not None or earlier.rollout is not None:
        hint += " (first match wins whatever its flag or rollout)"
    return Problem(("rules", j), message, hint, code="shadowed-rule")


def _band_problems(policy: PolicyFile) -> Iterator[Problem]:
    bands: dict[str, list[float]] = {
        "temperature": list(policy.slices.temperature),
        "context_tokens": [float(v) for v in policy.slices.context_tokens],
    }
    for name, edges in bands.items():
        if edges != sorted(set(edges)):
            message = "band edges must be strictly ascending"
            yield Problem(("slices", name), message, f"e.g. {sorted(set(edges))}", code="bands")
        low, high = _BOUNDS[name]
        for i, edge in enumerate(edges):
            if edge < low or (high is not None and edge > high):
                span = f"{low:g} to {high:g}" if high is not None else f"{low:g} or more"
                message = f"band edge {edge:g} is out of range: a {name} edge is {span}"
                yield Problem(("slices", name, i), message, f"give edges {span}", code="bands")


def _split_problems(policy: PolicyFile) -> Iterator[Problem]:
    """Split keys that name nothing, pins of unknown rules, and splits that can change
    nothing (a rule without a guardrail to move its children, or judged by acceptance)."""
    bands = policy.slices
    known = [*KEYS, "header:<name>"]
    for i, key in enumerate(bands.split_by):
        if not valid_key(key):
            hint = did_you_mean(key, known, "split keys")
            yield Problem(
                ("slices", "split_by", i), f"unknown split key {key!r}", hint, code="split"
            )
    rules = {rule.name: rule for rule in policy.rules}
    for name, key in bands.pin.items():
        at = ("slices", "pin", name)
        if not valid_key(key):
            hint = did_you_mean(key, known, "split keys")
            yield Problem(at, f"unknown split key {key!r}", hint, code="split")
        rule = rules.get(name)
        if rule is None:
            yield Problem(
                at, f"no rule is named {name!r}", did_you_mean(name, rules, "rules"), code="split"
            )
        elif rule.start in ("shadow", "standard"):
            message = f"rule {name!r} starts on {rule.start}: its children have no rung to move"
            yield Problem(at, message, severity=Severity.WARNING, code="split")
    named = bands.model_fields_set & {"split", "split_by", "pin"}
    if named and bands.split and policy.guardrail.mode is GuardrailMode.THRESHOLD:
        message = (
            "slices split only where the guardrail judges cost per token (mode economic); "
            "threshold-mode slices never split"
        )
        yield Problem(
            ("slices", "split"),
            message,
            "set split: false, or mode: economic",
            severity=Severity.WARNING,
            code="split",
        )


def _guardrail_problems(policy: PolicyFile) -> Iterator[Problem]:
    base = policy.guardrail
    hint = "set recover_above a little above min_acceptance"
    if base.recover_above < base.min_acceptance:
        message = "recover_above is below min_acceptance: a slice would flap"
        yield Problem(("guardrail", "recover_above"), message, hint, code="guardrail")
    for i, rule in enumerate(policy.rules):
        if rule.guardrail is None:
            continue
        merged = rule.guardrail.apply(base)
        if merged.recover_above < merged.min_acceptance:
            message = (
                f"recover_above {merged.recover_above:g} is below min_acceptance "
                f"{merged.min_acceptance:g}: the slice would flap"
            )
            yield Problem(("rules", i, "guardrail"), message, hint, code="guardrail")


def _tenant_problems(policy: PolicyFile) -> Iterator[Problem]:
    owner: dict[str, str] = {}
    for name, tenant in policy.tenants.items():
        if name == ANONYMOUS and tenant.api_keys:
            message = f"{ANONYMOUS!r} is every request without a known key: it has no keys"
            yield Problem(("tenants", name, "api_keys"), message, code="tenant")
            continue
        for i, key in enumerate(tenant.api_keys):
            if key in owner:
                message = f"this key is already {owner[key]!r}'s: a key names one tenant"
                yield Problem(("tenants", name, "api_keys", i), message, code="tenant")
            owner.setdefault(key, name)


def _keyless_rollouts(policy: PolicyFile) -> Iterator[Problem]:
    """A rollout draws tenants, and a request without a known key is in no partial one:
    in a policy that gives no tenant a key, a rollout under 100 is off for every request
    unless an authenticating proxy names tenants (SPECLANE_TRUSTED_TENANT_HEADER)."""
    if any(tenant.api_keys for tenant in policy.tenants.values()):
        return
    partial: list[tuple[Path, float]] = [
        (("rules", i, "rollout"), rule.rollout)
        for i, rule in enumerate(policy.rules)
        if rule.rollout is not None and 0 < rule.rollout < 100
    ]
    partial += [
        (("flags", name, "rollout"), flag.rollout)
        for name, flag in policy.flags.items()
        if flag.rollout is not None and 0 < flag.rollout < 100
    ]
    for at, rollout in partial:
        message = (
            f"a {rollout:g}% rollout draws from tenants, and no tenant here has api_keys: "
            "every request is anonymous and outside it"
        )
        hint = (
            "give tenants api_keys, or set SPECLANE_TRUSTED_TENANT_HEADER where a proxy names them"
        )
        yield Problem(at, message, hint, Severity.WARNING, code="keyless-rollout")


def _choices(names: Iterable[str]) -> str:
    return f"known pools: {', '.join(sorted(names))}"
