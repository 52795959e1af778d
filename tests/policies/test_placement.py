"""Where a rule puts its slices on their ladder, and what a pool costs: the compiled
policy's lookups."""

from __future__ import annotations

from policies.compiled import load_policy

POLICY = load_policy(
    """
version: 1
pools:
  k7: {kind: speculative, model: m, num_speculative_tokens: 7, endpoints: ["http://a"],
       cost_per_hour: 4.0}
  k3: {kind: speculative, model: m, num_speculative_tokens: 3, endpoints: ["http://b"]}
  standard: {kind: standard, model: m, endpoints: ["http://c"], cost_per_hour: 2.0}
ladder: [k7, k3, standard]
rules:
  - {name: json, match: {response_format: [json_object]}, start: k3}
  - {name: creative, match: {temperature: {min: 0.9}}, start: shadow}
  - {name: default, start: k7}
"""
)


def test_a_slice_is_served_offset_rungs_below_its_start_never_past_the_last():
    place = POLICY.placement("json", "m")
    assert place is not None and place.start == 1 and not place.shadowed
    assert [place.pool(offset) for offset in range(4)] == ["k3", "standard", "standard", "standard"]
    assert [place.below(offset) for offset in range(3)] == [1, 0, 0]
    top = POLICY.placement("default", "m")
    assert top is not None and (top.serving(0), top.below(0)) == (0, 2)


def test_a_shadow_rule_sits_on_the_last_rung_and_is_never_moved():
    place = POLICY.placement("creative", "m")
    assert place is not None and place.shadowed and place.pool(0) == "standard"


def test_a_gone_rule_or_model_has_no_place():
    assert POLICY.placement("gone", "m") is None
    assert POLICY.placement("json", "other-model") is None


def test_a_price_is_the_pools_cost_per_hour_where_it_says():
    assert (POLICY.price("k7"), POLICY.price("k3"), POLICY.price("nowhere")) == (4.0, None, None)
