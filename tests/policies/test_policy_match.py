"""Matching: the reference ``matches``, the bitset ``Matcher`` against it, and ``decide``."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.compiled import compile_policy
from policies.decide import decide
from policies.features import Features, ResponseFormat
from policies.flags import FlagValue
from policies.guardrail import Phase, SliceState
from policies.match import Matcher, covers, matches, satisfiable
from policies.model import Match, PolicyFile, Range, Rule, ToolNames

# CPU-bound: one worker runs these one after another, at a lower priority, with time to
# spare (docs/development.md, "Tests in parallel")
pytestmark = [pytest.mark.xdist_group("cpu"), pytest.mark.timeout(600)]


def m(**conditions: Any) -> Match:
    return Match.model_validate(conditions)


def f(**values: Any) -> Features:
    return Features(**{"endpoint": "/v1/chat/completions", "model": "m", **values})


MATCHES = [
    (m(), f(), True),
    (m(temperature={"max": 0.3}), f(temperature=0.3), True),
    (m(temperature={"max": 0.3}), f(temperature=0.31), False),
    (m(temperature={"min": 0.9}), f(), True),  # the default temperature is 1.0
    (m(context_tokens={"min": 16000}), f(prompt_tokens=16000), True),
    (m(max_tokens={"max": 512}), f(), False),  # no max_tokens: no match
    (m(max_tokens={"max": 512}), f(max_tokens=256), True),
    (m(response_format=["json_schema"]), f(response_format=ResponseFormat.JSON_SCHEMA), True),
    (m(response_format=["json_schema"]), f(), False),
    (m(tools="present"), f(tools=("a",)), True),
    (m(tools="present"), f(), False),
    (m(tools="absent"), f(), True),
    (m(tools={"names": ["b", "c"]}), f(tools=("a", "c")), True),
    (m(tools={"names": ["b"]}), f(tools=("a",)), False),
    (m(stream=True), f(stream=True), True),
    (m(stream=False), f(stream=True), False),
    (m(tenant=["acme"]), f(tenant="acme"), True),
    (m(endpoint=["search"]), f(), False),
    (m(endpoint=["chat", "messages"]), f(api="messages", endpoint="/v1/messages"), True),
    (m(endpoint=["messages"]), f(api="messages", endpoint="code"), True),  # the door counts
    (m(endpoint=["responses"]), f(api="chat"), False),
    (m(headers={"X-Team": "a"}), f(headers={"x-team": "a"}), True),
    (m(headers={"x-team": "a"}), f(headers={}), False),
    (m(model=[]), f(), False),
]


@pytest.mark.parametrize(("match", "features", "expected"), MATCHES)
def test_matches(match: Match, features: Features, expected: bool) -> None:
    assert matches(match, features) is expected
    assert Matcher([match, Match()]).first(features) == (0 if expected else 1)


def test_first_match_wins() -> None:
    rules = [m(tools="present"), m(temperature={"max": 0.3}), m()]
    matcher = Matcher(rules)
    assert matcher.first(f(tools=("a",), temperature=0.1)) == 0
    assert matcher.first(f(temperature=0.1)) == 1
    assert matcher.first(f()) == 2


def test_no_match_falls_back_to_the_last_rule() -> None:
    assert Matcher([m(stream=True), m(stream=True)]).first(f()) == 1


EDGES = [None, 0.0, 0.3, 0.5, 0.9, 1.0, 2.0, 4000.0, 16000.0]
NUMBERS = st.one_of(
    st.sampled_from([e for e in EDGES if e is not None]),
    st.floats(min_value=-1, max_value=20000, allow_nan=False),
    st.integers(min_value=0, max_value=20000),
    st.sampled_from([math.nan, math.inf, -math.inf]),
)
WORDS = ["a", "b", "c"]


def ranges() -> st.SearchStrategy[Range | None]:
    bound = st.sampled_from(EDGES)
    return st.one_of(st.none(), st.builds(Range, min=bound, max=bound))


def lists(values: list[Any]) -> st.SearchStrategy[list[Any] | None]:
    return st.one_of(st.none(), st.lists(st.sampled_from(values), max_size=3))


TOOLS = st.one_of(
    st.none(),
    st.sampled_from(["present", "absent"]),
    st.builds(ToolNames, names=st.lists(st.sampled_from(WORDS), min_size=1, max_size=2)),
)
HEADERS = st.one_of(
    st.none(),
    st.dictionaries(st.sampled_from(["x-team", "X-Team", "x-env"]), st.sampled_from(WORDS)),
)
MATCH = st.builds(
    Match,
    endpoint=lists(["/v1/chat/completions", "/v1/completions", "search", "chat", "messages"]),
    model=lists(["m", "n"]),
    tenant=lists(["", "t1", "t2"]),
    response_format=lists(list(ResponseFormat)),
    stream=st.one_of(st.none(), st.booleans()),
    temperature=ranges(),
    top_p=ranges(),
    context_tokens=ranges(),
    max_tokens=ranges(),
    tools=TOOLS,
    headers=HEADERS,
)
FEATURES = st.builds(
    Features,
    endpoint=st.sampled_from(["/v1/chat/completions", "/v1/completions", "search", "other"]),
    api=st.sampled_from(["", "chat", "completions", "messages"]),
    model=st.sampled_from(["m", "n", "unknown"]),
    temperature=NUMBERS,
    top_p=NUMBERS,
    tools=st.lists(st.sampled_from([*WORDS, "d"]), max_size=3, unique=True).map(tuple),
    response_format=st.sampled_from(list(ResponseFormat)),
    prompt_tokens=st.one_of(st.sampled_from([0, 3999, 4000, 4001, 16000]), st.integers(0, 10**6)),
    max_tokens=st.one_of(st.none(), st.integers(0, 20000)),
    stream=st.booleans(),
    tenant=st.sampled_from(["", "t1", "t2", "t3"]),
    routing_key=st.text(max_size=8),
    headers=st.dictionaries(st.sampled_from(["x-team", "x-env"]), st.sampled_from([*WORDS, "z"])),
)


@settings(max_examples=500, deadline=None)
@given(st.lists(MATCH, min_size=1, max_size=12), st.lists(FEATURES, min_size=1, max_size=5))
def test_matcher_first_equals_the_first_rule_that_matches(
    rules: list[Match], requests: list[Features]
) -> None:
    matcher = Matcher(rules)
    for features in requests:
        reference = next((i for i, r in enumerate(rules) if matches(r, features)), len(rules) - 1)
        assert matcher.first(features) == reference == matcher.first_linear(features)


POOLS: dict[str, dict[str, Any]] = {
    "spec-k7": {"kind": "speculative", "model": "m", "num_speculative_tokens": 7},
    "spec-k3": {"kind": "speculative", "model": "m", "num_speculative_tokens": 3},
    "standard": {"kind": "standard", "model": "m"},
    "n-spec": {"kind": "speculative", "model": "n", "num_speculative_tokens": 4},
    "n-std": {"kind": "standard", "model": "n"},
}
LADDERS = {"m": ["spec-k7", "spec-k3", "standard"], "n": ["n-spec", "n-std"]}
RULE = st.builds(
    Rule,
    name=st.sampled_from(["r1", "r2", "r3", "r4"]),
    match=MATCH,
    start=st.sampled_from([*POOLS, "standard", "shadow"]),
    shadow_fraction=st.sampled_from([0.0, 0.05, 1.0]),
    flag=st.sampled_from([None, "f1", "speculation"]),
    rollout=st.sampled_from([None, 0.0, 50.0, 100.0]),
)
FLAGS = st.dictionaries(
    st.sampled_from(["f1", "speculation"]),
    st.builds(FlagValue, enabled=st.booleans(), rollout=st.sampled_from([None, 0.0, 50.0])),
)
STATE = st.builds(
    SliceState,
    offset=st.integers(0, 4),
    phase=st.sampled_from(list(Phase)),
    since=st.floats(0, 100),
    version=st.integers(0, 3),
)


def policy_of(rules: list[Rule]) -> PolicyFile:
    pools = {name: {**spec, "endpoints": ["http://x:1"]} for name, spec in POOLS.items()}
    return PolicyFile.model_validate(
        {"version": 1, "pools": pools, "ladders": LADDERS, "rules": [r.model_dump() for r in rules]}
    )


@settings(max_examples=300, deadline=None)
@given(st.lists(RULE, min_size=1, max_size=6), FEATURES, FLAGS, STATE, st.floats(0, 1e6))
def test_decide_is_total_and_deterministic(
    rules: list[Rule],
    features: Features,
    flags: dict[str, FlagValue],
    state: SliceState,
    now: float,
) -> None:
    policy = compile_policy(policy_of(rules))
    plain = decide(features, policy, flags, {}, now)
    guards = {plain.slice: state}
    decision = decide(features, policy, flags, guards, now)
    assert decision == decide(features, policy, flags, guards, now)
    ladder = LADDERS.get(features.model)
    if ladder is None:
        assert decision.rungs == ()
        return
    assert decision.pool in ladder
    assert sorted(decision.rungs) == sorted(ladder)
    assert decision.rungs[0] == decision.pool
    assert decision.shadow_to is None or decision.shadow_to in POOLS


@settings(max_examples=300, deadline=None)
@given(MATCH, MATCH, st.lists(FEATURES, min_size=1, max_size=5))
def test_covers_is_sound(earlier: Match, later: Match, requests: list[Features]) -> None:
    """Lint calls a rule unreachable only if the earlier rule takes every request it would."""
    if covers(earlier, later):
        for features in requests:
            assert not matches(later, features) or matches(earlier, features)


@settings(max_examples=300, deadline=None)
@given(MATCH, st.sets(st.sampled_from(sorted(Match.model_fields))), st.lists(FEATURES, max_size=5))
def test_dropping_conditions_covers(
    later: Match, dropped: set[str], requests: list[Features]
) -> None:
    earlier = later.model_copy(update=dict.fromkeys(dropped))
    assert covers(earlier, later) or not satisfiable(later)
    for features in requests:
        assert not matches(later, features) or matches(earlier, features)
