"""The split and merge decisions of ``policies/splitting.py``: pure, time an argument."""

from __future__ import annotations

import math

from policies.economics import Tally, log_tokens_per_step
from policies.features import Features, PromptHashes
from policies.lint import lint
from policies.splitting import (
    Split,
    Verdict,
    agree,
    candidates,
    merge_due,
    merged,
    parent_of,
    pin,
    propose,
    route,
    valid_key,
    wants,
)

PARENT = "default / t<=0.3 / ctx4k-16k"


def measured(log_l: float, n: int = 50, spread: float = 0.36) -> Tally:
    """``n`` requests of 100 steps at ``exp(log_l)`` tokens a step, each off by
    +-``spread`` (alternately): log L known to about +-0.05 at 50 requests."""
    mean = math.exp(log_l) * 100
    tokens = [mean * (1 + spread * (-1) ** i) for i in range(n)]
    return Tally(
        n,
        sum(tokens),
        100.0 * n,
        sum(t * t for t in tokens),
        100.0**2 * n,
        sum(t * 100 for t in tokens),
    )


def verdict(
    value: str,
    direction: int | None,
    requests: int = 50,
    log_l: float | None = None,
    at: tuple[float, ...] = (0.0,),
) -> Verdict:
    """A value leaning ``direction`` (unsure: staying); its log tokens per step far from
    the other direction's unless given, known to about +-0.05, in the window's buckets
    ``at`` (its requests shared between them)."""
    leans = direction or 0
    if log_l is None:
        log_l = 0.1 if leans == -1 else 1.0
    ratio = 1.5 if leans == -1 else 0.5
    each = measured(log_l, requests // len(at))
    return Verdict(
        value, requests, direction, ratio, 4.0, leans, dict.fromkeys(at, each), reach=20.0
    )


def test_values_that_want_different_rungs_split_the_slice() -> None:
    verdicts = {"template": [verdict("a", -1), verdict("b", 0)]}
    split = propose(
        PARENT, verdicts, ["template"], max_children=8, min_samples=3, version=0, now=10.0
    )
    assert split is not None and split.key == "template" and split.version == 1
    assert set(split.values) == {"a", "b"} and split.since == 10.0
    assert split.children() == (f"{PARENT} / app:1", f"{PARENT} / app:2")
    assert "cheaper a rung down" in split.why and "cheapest where it is" in split.why
    assert "standard deviations apart" in split.why


def test_values_apart_by_the_guardrails_confidence_split() -> None:
    # 0.1 apart at a standard deviation of 0.05 * sqrt(2) = 0.071: z 1.4, not enough at
    # 0.999 (z 3.09); 0.25 apart: z 3.5
    near = [verdict("a", -1, log_l=0.50), verdict("b", 0, log_l=0.60)]
    far = [verdict("a", -1, log_l=0.50), verdict("b", 0, log_l=0.75)]
    kw = {"max_children": 8, "min_samples": 3, "version": 0, "now": 0.0, "z_needed": 3.09}
    assert propose(PARENT, {"template": near}, ["template"], **kw) is None
    assert propose(PARENT, {"template": far}, ["template"], **kw) is not None


def test_helper_measures_as_stated() -> None:
    log_l, var = log_tokens_per_step(measured(0.5)) or (0.0, 0.0)
    assert abs(log_l - 0.5) < 1e-9 and 0.045 < math.sqrt(var) < 0.055


def test_values_are_compared_only_over_the_time_both_were_served() -> None:
    # a value served before a collapse and another after it: their windows differ by
    # the collapse, over no time they share
    kw = {"max_children": 8, "min_samples": 3, "version": 0, "now": 0.0}
    before, after = verdict("a", 1, at=(0.0, 12.5)), verdict("b", 0, log_l=0.1, at=(37.5, 50.0))
    assert propose(PARENT, {"template": [before, after]}, ["template"], **kw) is None
    # the same values served in the same minutes, or one's requests ending while the
    # other's were being decoded (within the reach): told apart
    before = verdict("a", 1, at=(0.0, 12.5, 25.0))
    after = verdict("b", 0, log_l=0.1, at=(25.0, 37.5))
    assert propose(PARENT, {"template": [before, after]}, ["template"], **kw) is not None
    before, after = verdict("a", 1, at=(0.0,)), verdict("b", 0, log_l=0.1, at=(12.5,))
    assert propose(PARENT, {"template": [before, after]}, ["template"], **kw) is not None


def test_agreeing_or_unsure_values_do_not_split() -> None:
    for verdicts in (
        [verdict("a", -1), verdict("b", -1)],
        [verdict("a", 0), verdict("b", None)],
        [verdict("a", -1), verdict("b", 0, requests=2)],  # b has too few requests
        [verdict("a", -1, log_l=0.5), verdict("b", 0, log_l=0.6)],  # not apart enough
        [verdict("a", -1), Verdict("b", 50, None, 0.5, 0.0, 0)],  # b unmeasured
    ):
        got = propose(
            PARENT,
            {"template": verdicts},
            ["template"],
            max_children=8,
            min_samples=3,
            version=0,
            now=0.0,
        )
        assert got is None


def test_keys_are_tried_in_the_policys_order() -> None:
    verdicts = {
        "tenant": [verdict("t1", -1), verdict("t2", 0)],
        "template": [verdict("a", -1), verdict("b", 0)],
    }
    split = propose(
        PARENT,
        verdicts,
        ["template", "tenant"],
        max_children=8,
        min_samples=3,
        version=4,
        now=0.0,
    )
    assert split is not None and split.key == "template" and split.version == 5
    assert split.children()[0].endswith("/ app:1")


def test_children_are_bounded_busiest_first() -> None:
    verdicts = {"template": [verdict(f"v{i}", i % 2 - 1, requests=10 + i) for i in range(20)]}
    split = propose(
        PARENT, verdicts, ["template"], max_children=3, min_samples=3, version=0, now=0.0
    )
    assert split is not None and split.values == ("v19", "v18", "v17")
    assert [c.rsplit(":", 1)[1] for c in split.children()] == ["1", "2", "3"]


def test_a_request_goes_to_its_child_or_stays_pooled() -> None:
    split = Split(PARENT, "template", ("a", "b"), 0.0, 1)
    splits = {PARENT: split}
    assert route(PARENT, (("template", "b"),), splits) == f"{PARENT} / app:2"
    assert route(PARENT, (("template", "z"),), splits) == PARENT
    assert route(PARENT, (("tenant", "a"),), splits) == PARENT
    assert route("other", (("template", "a"),), splits) == "other"
    gone = merged(split, 5.0, "merged")
    assert not gone.live and gone.version == 2
    assert route(PARENT, (("template", "a"),), {PARENT: gone}) == PARENT


def test_wants_reads_the_confident_verdicts() -> None:
    assert wants(-1, None) == -1
    assert wants(0, 1) == 1
    assert wants(1, None) == 0
    assert wants(None, -1) == 0
    assert wants(0, 0) is None and wants(None, None) is None


def test_merge_needs_a_long_agreement() -> None:
    assert agree(1, [1, 1]) and not agree(0, [0, 1])
    assert not merge_due(None, 1000.0, 600.0)
    assert not merge_due(500.0, 1000.0, 600.0)
    assert merge_due(400.0, 1000.0, 600.0)


def test_a_pin_takes_the_busiest_values_with_enough_requests() -> None:
    split = pin(
        PARENT,
        "tenant",
        {"x": 2, "y": 30, "z": 9},
        max_children=8,
        min_samples=3,
        version=0,
        now=0.0,
    )
    assert split is not None and split.pinned and split.values == ("y", "z")
    assert split.children()[0] == f"{PARENT} / tenant:1"
    none = pin(PARENT, "tenant", {"x": 2}, max_children=8, min_samples=3, version=0, now=0.0)
    assert none is None


def test_candidates_are_hashes_names_and_words() -> None:
    features = Features(
        "/v1/messages",
        "m",
        api="messages",
        tenant="acme",
        tools_fingerprint="abcd",
        headers={"x-app": "billing"},
        prompt=PromptHashes(template="f00d"),
    )
    found = dict(candidates(features, ["template", "tenant", "tools", "api", "header:X-App"]))
    assert found["template"] == "f00d" and found["tenant"] == "acme"
    assert found["tools"] == "abcd" and found["api"] == "messages"
    assert len(found["header:X-App"]) == 16 and "billing" not in found["header:X-App"]
    assert dict(candidates(Features("/v1/chat/completions", "m"), ["template", "tools"])) == {}


def test_split_keys() -> None:
    assert valid_key("template") and valid_key("header:x-app")
    assert not valid_key("header:") and not valid_key("temperature")


LINTED = """version: 1
pools:
  spec: {kind: speculative, model: m, num_speculative_tokens: 4, endpoints: ["http://a"]}
  standard: {kind: standard, model: m, endpoints: ["http://b"]}
ladder: [spec, standard]
slices:
  split_by: [template, tenant, templte]
  pin: {defualt: template, plain: "header:x-app"}
rules:
  - {name: plain, start: standard}
  - {name: default, start: spec}
"""


def test_lint_places_what_splitting_cannot_do() -> None:
    lines = lint(LINTED, "p.yaml").lines()
    assert any(
        "p.yaml:7:" in line and "unknown split key 'templte'" in line and "template" in line
        for line in lines
    ), lines
    assert any("p.yaml:8:" in line and "no rule is named 'defualt'" in line for line in lines)
    assert any("warning" in line and "no rung to move" in line for line in lines), lines


def test_a_childs_key_names_its_parent() -> None:
    split = Split(PARENT, "tools", ("a",), 0.0, 1)
    assert parent_of(split.child(1)) == PARENT
    assert parent_of(f"{PARENT} / app:12") == PARENT
    assert parent_of("tools / t<=0.3 / ctx<4k / tools:0e") is None  # a tool-schema band
    assert parent_of(PARENT) is None
