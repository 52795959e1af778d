"""A validated policy file turned into what ``decide`` needs at request time. Pure.

Compiling resolves names once (ladders by model, each rule's start rung, merged guardrail
settings, band labels) so the per-request path only compares values.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from policies.checks import ladders_of, passthrough_pools
from policies.features import Features
from policies.lint import lint
from policies.match import Matcher
from policies.model import SHADOW, STANDARD, Guardrail, PolicyFile, Pool, PoolKind, Rule
from policies.problems import PolicyError, Problem
from policies.slices import Slicer
from policies.splitting import SplitConfig


@dataclass(frozen=True, slots=True)
class CompiledRule:
    index: int
    rule: Rule
    guardrail: Guardrail

    @property
    def name(self) -> str:
        return self.rule.name


@dataclass(frozen=True, slots=True)
class Ladder:
    """One model's rungs, best first; the last is a standard pool."""

    model: str
    pools: tuple[str, ...]
    k: tuple[int | None, ...]
    passthrough: str = ""

    @property
    def other_routes(self) -> tuple[str, ...]:
        """Where the engine's other routes go: the passthrough pool (the last rung unless
        the policy names one), then the rest of the ladder from the bottom up."""
        first = self.passthrough or self.pools[-1]
        return (first, *(p for p in reversed(self.pools) if p != first))

    def index(self, start: str) -> int:
        if start in (STANDARD, SHADOW):
            return len(self.pools) - 1
        return self.pools.index(start) if start in self.pools else len(self.pools) - 1

    def first_speculative(self) -> str | None:
        return next((p for p, k in zip(self.pools, self.k, strict=True) if k is not None), None)


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a rule puts its slices on their model's ladder: ``start``, the index of the
    rule's start rung, and a slice ``offset`` rungs below it is served on ``serving``."""

    rule: CompiledRule
    ladder: Ladder

    @property
    def guardrail(self) -> Guardrail:
        return self.rule.guardrail

    @property
    def start(self) -> int:
        return self.ladder.index(self.rule.rule.start)

    @property
    def shadowed(self) -> bool:
        """The rule starts on ``shadow``: no guardrail moves its slices."""
        return self.rule.rule.start == SHADOW

    def serving(self, offset: int) -> int:
        """The index of the rung a slice ``offset`` rungs below the start is served on."""
        return min(self.start + offset, len(self.ladder.pools) - 1)

    def pool(self, offset: int) -> str:
        return self.ladder.pools[self.serving(offset)]

    def below(self, offset: int) -> int:
        """How many rungs lie below the one a slice ``offset`` rungs down is served on."""
        return len(self.ladder.pools) - 1 - self.serving(offset)


@dataclass(frozen=True, slots=True)
class CompiledPolicy:
    file: PolicyFile
    pools: Mapping[str, Pool]
    ladders: Mapping[str, Ladder]
    rules: tuple[CompiledRule, ...]
    slicer: Slicer
    matcher: Matcher
    by_name: Mapping[str, CompiledRule]
    warnings: tuple[Problem, ...] = ()
    reads_top_p: bool = False  # a rule matches on top_p
    splitting: SplitConfig = SplitConfig()

    def first_match(self, features: Features) -> CompiledRule:
        return self.rules[self.matcher.first(features)]

    def rule(self, name: str) -> CompiledRule | None:
        return self.by_name.get(name)

    def placement(self, rule: str, model: str) -> Placement | None:
        """The rule's place on the model's ladder; None when either is gone."""
        compiled = self.by_name.get(rule)
        ladder = self.ladders.get(model)
        return None if compiled is None or ladder is None else Placement(compiled, ladder)

    def price(self, pool: str) -> float | None:
        """What one endpoint of ``pool`` costs per hour, where the policy says."""
        found = self.pools.get(pool)
        return None if found is None else found.cost_per_hour


def compile_policy(policy: PolicyFile, warnings: tuple[Problem, ...] = ()) -> CompiledPolicy:
    """Compile a policy that passed ``check`` without errors."""
    passthrough = passthrough_pools(policy)
    ladders = {
        model: Ladder(
            model,
            tuple(rungs),
            tuple(
                policy.pools[p].num_speculative_tokens
                if policy.pools[p].kind is PoolKind.SPECULATIVE
                else None
                for p in rungs
            ),
            passthrough.get(model, ""),
        )
        for model, rungs in ladders_of(policy).items()
    }
    rules = tuple(
        CompiledRule(
            i, rule, rule.guardrail.apply(policy.guardrail) if rule.guardrail else policy.guardrail
        )
        for i, rule in enumerate(policy.rules)
    )
    return CompiledPolicy(
        file=policy,
        pools=dict(policy.pools),
        ladders=ladders,
        rules=rules,
        slicer=Slicer.of(
            policy.slices.temperature, policy.slices.context_tokens, policy.slices.tool_schemas
        ),
        matcher=Matcher([r.match for r in policy.rules]),
        by_name={r.name: r for r in rules},
        warnings=warnings,
        reads_top_p=any(r.match.top_p is not None for r in policy.rules),
        splitting=SplitConfig(
            tuple(policy.slices.split_by) if policy.slices.split else (),
            policy.slices.max_children,
            policy.slices.merge_after_s,
            dict(policy.slices.pin),
        ),
    )


def load_policy(text: str | bytes, filename: str = "<policy>") -> CompiledPolicy:
    """Lint and compile a policy file's text; ``PolicyError`` lists every error lint finds.

    Warnings do not stop a policy; they are kept in ``CompiledPolicy.warnings``.
    """
    report = lint(text, filename)
    if report.errors or report.policy is None:
        raise PolicyError(filename, list(report.errors))
    return compile_policy(report.policy, report.warnings)
