"""A/B arms: a rule's traffic split between two rungs, stable per user within a tenant, with
the guardrail still guarding the speculative arm; and what lint says about bad arms."""

from __future__ import annotations

import pytest

from policies.compiled import load_policy
from policies.decide import decide
from policies.features import Features
from policies.flags import FlagValue
from policies.guardrail import Phase, SliceState
from policies.lint import lint

POLICY = """
version: 1
pools:
  spec-k7: {kind: speculative, model: m, num_speculative_tokens: 7, endpoints: [http://a:1]}
  spec-k3: {kind: speculative, model: m, num_speculative_tokens: 3, endpoints: [http://b:1]}
  standard: {kind: standard, model: m, endpoints: [http://c:1]}
ladder: [spec-k7, spec-k3, standard]
rules:
  - name: pilot
    match: {temperature: {max: 0.5}}
    experiment: {arms: [spec-k7, standard], split: ARMS}
  - {name: default, start: spec-k3}
"""


def features(user: str, tenant: str = "t1", temperature: float = 0.2) -> Features:
    return Features(
        endpoint="/v1/chat/completions",
        model="m",
        temperature=temperature,
        tenant=tenant,
        routing_key=user,
        request_id=f"{tenant}:{user}:{temperature}",
    )


def arms_of(split: float, users: int = 2000, tenant: str = "t1") -> dict[str, str]:
    policy = load_policy(POLICY.replace("ARMS", str(split)))
    out = {}
    for i in range(users):
        decision = decide(features(f"u{i}", tenant), policy, {}, {}, 0.0)
        assert decision.rule == "pilot"
        out[f"u{i}"] = decision.arm
    return out


def test_the_split_is_stable_per_user_and_near_its_share() -> None:
    first = arms_of(30)
    assert first == arms_of(30)
    share = sum(arm == "spec-k7" for arm in first.values()) / len(first)
    assert 0.26 < share < 0.34
    assert set(arms_of(0).values()) == {"standard"}
    assert set(arms_of(100).values()) == {"spec-k7"}


def test_a_user_id_is_scoped_by_its_tenant() -> None:
    a, b = arms_of(50, tenant="t1"), arms_of(50, tenant="t2")
    differing = sum(a[u] != b[u] for u in a) / len(a)
    assert 0.4 < differing < 0.6  # the same user ids land independently in another tenant


def test_the_guardrail_guards_the_speculative_arm_and_leaves_the_control_alone() -> None:
    policy = load_policy(POLICY.replace("ARMS", "50"))
    arms = arms_of(50, users=200)
    spec_user = next(u for u, arm in arms.items() if arm == "spec-k7")
    control = next(u for u, arm in arms.items() if arm == "standard")
    on = decide(features(spec_user), policy, {}, {}, 0.0)
    assert (on.pool, on.arm, on.start) == ("spec-k7", "spec-k7", 0)
    fallen = {on.slice: SliceState(1, Phase.FALLEN_BACK, 0.0, 1)}
    moved = decide(features(spec_user), policy, {}, fallen, 0.0)
    assert (moved.pool, moved.arm) == ("spec-k3", "spec-k7")
    assert "experiment arm spec-k7" in moved.reason
    kept = decide(features(control), policy, {}, fallen, 0.0)
    assert (kept.pool, kept.arm, kept.slice) == ("standard", "standard", on.slice)
    off = {"speculation": FlagValue(enabled=False)}
    killed = decide(features(spec_user), policy, off, {}, 0.0)
    assert (killed.pool, killed.arm) == ("standard", "spec-k7")
    other = decide(features(spec_user, temperature=0.9), policy, {}, {}, 0.0)
    assert (other.rule, other.arm) == ("default", "")


@pytest.mark.parametrize(
    ("experiment", "message"),
    [
        ("{arms: [standard, spec-k7]}", "on the m ladder 'standard' is not above 'spec-k7'"),
        ("{arms: [spec-k7, spec-k7]}", "the two arms are the same"),
        ("{arms: [spec-k7, nope]}", "arm 'nope' is not a pool on a ladder"),
        ("{arms: [shadow, standard]}", "an experiment arm cannot be 'shadow'"),
        ("{arms: [spec-k7]}", "needs at least 2 item(s)"),
        ("{arms: [spec-k7, standard], split: 101}", "must be <= 100.0, got 101"),
    ],
)
def test_lint_names_bad_arms(experiment: str, message: str) -> None:
    text = POLICY.replace("{arms: [spec-k7, standard], split: ARMS}", experiment)
    rendered = [p.render("p.yaml") for p in lint(text, "p.yaml").errors]
    assert any(message in line for line in rendered), rendered


def test_start_must_be_the_first_arm_when_given() -> None:
    text = POLICY.replace("experiment:", "start: spec-k3\n    experiment:").replace("ARMS", "50")
    rendered = [p.render("p.yaml") for p in lint(text, "p.yaml").errors]
    assert any("start 'spec-k3' is not the first arm 'spec-k7'" in r for r in rendered), rendered
    good = POLICY.replace("experiment:", "start: spec-k7\n    experiment:").replace("ARMS", "50")
    assert not lint(good, "p.yaml").errors
