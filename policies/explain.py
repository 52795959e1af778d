"""Why a request gets the decision it gets: each rule tried, the slice, the rung, the reason.

``explain`` takes ``Features`` (classification happens elsewhere), runs the reference
``matches`` rule by rule, recording every condition with the values it compared, and then
the real ``decide`` with the given flags and no guardrail state. It backs ``speclane policy
explain``. Pure: no I/O, no clock (the decision is taken at time 0).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from policies.compiled import CompiledPolicy
from policies.decide import NO_SPLITS, decide
from policies.decision import Decision
from policies.features import Features
from policies.flags import ALWAYS_ON, FlagValue
from policies.match import matches
from policies.model import KILL_SWITCH, Match, Range, ToolNames
from policies.splitting import Split


@dataclass(frozen=True, slots=True)
class Condition:
    """One condition of a rule: the feature, what the rule wants, what the request has."""

    feature: str
    wanted: str
    got: str
    holds: bool

    def __str__(self) -> str:
        if self.holds:
            return f"{self.feature} {self.got} {self.wanted}"
        return f"{self.feature}: wanted {self.wanted}, got {self.got}"


@dataclass(frozen=True, slots=True)
class Trial:
    """One rule tried in order, and whether it matched."""

    index: int
    rule: str
    matched: bool
    conditions: tuple[Condition, ...]

    @property
    def why(self) -> str:
        if not self.conditions:
            return "matches everything (no conditions)"
        if self.matched:
            return "; ".join(str(c) for c in self.conditions)
        return str(next(c for c in self.conditions if not c.holds))


@dataclass(frozen=True, slots=True)
class Explanation:
    features: Features
    trials: tuple[Trial, ...]
    decision: Decision
    flags: Mapping[str, str]
    flags_source: str = "given"  # where the flags' values came from (said with them)

    def as_json(self) -> dict[str, Any]:
        features = asdict(self.features)
        features["headers"] = dict(self.features.headers)
        features["tools"] = list(self.features.tools)
        trials = [
            {"rule": t.rule, "index": t.index, "matched": t.matched, "why": t.why}
            for t in self.trials
        ]
        decision = asdict(self.decision)
        decision["rungs"] = list(self.decision.rungs)
        return {
            "features": features,
            "rules": trials,
            "flags": dict(self.flags),
            "flags_source": self.flags_source,
            **decision,
        }

    def lines(self) -> list[str]:
        """The explanation as plain text, one fact a line."""
        out = ["features:"]
        out += [f"  {name}: {value}" for name, value in feature_rows(self.features)]
        if self.decision.candidates:
            found = ", ".join(f"{key} {value}" for key, value in self.decision.candidates)
            out.append(f"split keys (what its slice may split by): {found}")
        out.append("rules tried, in order:")
        for t in self.trials:
            verdict = "MATCH" if t.matched else "no"
            out.append(f"  {t.index}. {t.rule}: {verdict} - {t.why}")
        d = self.decision
        out += [f"flag {name}: {value}" for name, value in self.flags.items()]
        out.append(f"flags from: {self.flags_source}")
        out.append(f"slice: {d.slice}")
        if d.parent and d.parent != d.slice:
            out.append(f"  split by application from: {d.parent}")
        out.append(f"pool: {d.pool or '-'} (rung {d.rung}, start {d.start})")
        out += [f"rungs: {' > '.join(d.rungs) or '-'}", f"reason: {d.reason}"]
        if d.shadow_to:
            out.append(f"shadow copy to: {d.shadow_to}")
        return out


def explain(
    features: Features,
    policy: CompiledPolicy,
    flags: Mapping[str, FlagValue],
    flags_source: str = "given",
    splits: Mapping[str, Split] = NO_SPLITS,
) -> Explanation:
    """Try every rule up to the first match, then decide with ``flags``, which came from
    ``flags_source`` (said beside them: offline, live flags are not known), and
    ``splits``, the slices a gateway has split by application, so the decision names
    the child."""
    trials = []
    for compiled in policy.rules:
        found = tuple(conditions(compiled.rule.match, features))
        matched = matches(compiled.rule.match, features)
        trials.append(Trial(compiled.index, compiled.name, matched, found))
        if matched:
            break
    decision = decide(features, policy, flags, {}, 0.0, splits)
    names = [KILL_SWITCH] + [n for n in [policy.rules[trials[-1].index].rule.flag] if n]
    shown = {name: flag_words(flags.get(name, ALWAYS_ON)) for name in dict.fromkeys(names)}
    return Explanation(features, tuple(trials), decision, shown, flags_source)


def conditions(match: Match, features: Features) -> Iterator[Condition]:
    """Each condition ``match`` sets, in a fixed order, evaluated on ``features``."""
    for name in ("endpoint", "model", "tenant", "response_format"):
        wanted: list[Any] | None = getattr(match, name)
        if wanted is not None:
            value = getattr(features, name)
            found = value in wanted or (name == "endpoint" and features.api in wanted)
            yield Condition(name, f"in [{', '.join(map(str, wanted))}]", str(value), found)
    if match.stream is not None:
        wanted_stream = str(match.stream).lower()
        got_stream = str(features.stream).lower()
        yield Condition(
            "stream", f"== {wanted_stream}", got_stream, match.stream == features.stream
        )
    ranges: dict[str, tuple[Range | None, float | None]] = {
        "temperature": (match.temperature, features.temperature),
        "top_p": (match.top_p, features.top_p),
        "context_tokens": (match.context_tokens, features.prompt_tokens),
        "max_tokens": (match.max_tokens, features.max_tokens),
    }
    for name, (range_, value) in ranges.items():
        if range_ is not None:
            holds = value is not None and range_.contains(value)
            yield Condition(name, _range_words(range_), _number(value), holds)
    if match.tools is not None:
        yield _tools(match.tools, features)
    for key, value in (match.headers or {}).items():
        got = features.headers.get(key.lower())
        shown = "missing" if got is None else repr(got)
        yield Condition(f"header {key.lower()}", f"== {value!r}", shown, got == value)


def _tools(wanted: str | ToolNames, features: Features) -> Condition:
    got = f"[{', '.join(features.tools)}]" if features.tools else "none"
    if isinstance(wanted, ToolNames):
        holds = any(name in features.tools for name in wanted.names)
        return Condition("tools", f"any of [{', '.join(wanted.names)}]", got, holds)
    holds = features.has_tools == (wanted == "present")
    return Condition("tools", wanted, got, holds)


def _range_words(range_: Range) -> str:
    if range_.min is not None and range_.max is not None:
        return f"in [{range_.min:g}, {range_.max:g}]"
    if range_.min is not None:
        return f">= {range_.min:g}"
    return f"<= {range_.max:g}" if range_.max is not None else "any value"


def _number(value: float | None) -> str:
    return "none" if value is None else f"{value:g}"


def flag_words(value: FlagValue) -> str:
    if not value.enabled:
        return "off"
    parts = ["on"]
    if value.rollout is not None:
        parts.append(f"for {value.rollout:g}% of tenants (a hash of the tenant)")
    if value.allow is not None:
        parts.append(f"for tenants {sorted(value.allow)}")
    if value.deny:
        parts.append(f"not for tenants {sorted(value.deny)}")
    return " ".join(parts)


def _assumed(name: str, features: Features) -> str:
    return " (not in the request: the served model's default)" if name in features.defaulted else ""


def feature_rows(features: Features) -> list[tuple[str, str]]:
    """The features an operator reads, as (name, value) text pairs."""
    rows = [
        ("endpoint", features.endpoint),
        ("model", features.model),
        ("temperature", f"{features.temperature:g}" + _assumed("temperature", features)),
        ("top_p", f"{features.top_p:g}" + _assumed("top_p", features)),
        ("tools", ", ".join(features.tools) or "none"),
        ("response_format", str(features.response_format)),
        ("context_tokens", f"{features.prompt_tokens} (estimated prompt tokens)"),
        ("max_tokens", _number(features.max_tokens)),
        ("stream", str(features.stream).lower()),
        ("tenant", features.tenant or "none"),
        ("routing_key", features.routing_key or "none"),
    ]
    rows += [(f"header {k}", v) for k, v in sorted(features.headers.items())]
    return rows
