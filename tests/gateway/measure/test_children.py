"""Slices split by application, through ``decide`` and ``LiveStats`` with injected time:
two templates with opposite economics in one slice split, each child on its own rung, from
its parent's state; templates with equal economics never split; the children merge back
once their economics agree; hundreds of templates keep the bounds."""

from __future__ import annotations

from collections.abc import Callable

from gateway.measure.acceptance import Labels, Outcome, Signal, Status
from gateway.measure.children import MAX_FAMILIES, tracked
from gateway.measure.livestats import LiveStats
from policies.compiled import CompiledPolicy, load_policy
from policies.decide import decide
from policies.features import Features, PromptHashes
from policies.speedup import expected_tokens_per_step

POLICY = """
version: 1
pools:
  spec: {kind: speculative, model: m, num_speculative_tokens: 4, endpoints: ["http://a"]}
  standard: {kind: standard, model: m, endpoints: ["http://b"]}
ladder: [spec, standard]
slices: {SLICES}
rules:
  - {name: default, start: spec}
"""
STEP_S = {"spec": 0.030, "standard": 0.025}
K = {"spec": 4, "standard": None}
TOKENS = 129
REVIEW, REPORTS = "1" * 16, "2" * 16


def policy(slices: str = "{}") -> CompiledPolicy:
    return load_policy(POLICY.replace("{SLICES}", slices))


def features(template: str, n: int) -> Features:
    return Features(
        "/v1/chat/completions",
        "m",
        api="chat",
        temperature=0.0,
        prompt_tokens=6000,
        request_id=f"r{n}",
        prompt=PromptHashes(template=template),
    )


def outcome(labels: Labels, a: float, load: float) -> Outcome:
    """128 decode tokens at per-token acceptance ``a`` on the labels' pool, with the step
    time of an affine engine at ``load``."""
    k = labels.k
    per_step = 1.0 if k is None else expected_tokens_per_step(a, k)
    steps = max(1, round((TOKENS - 1) / per_step))
    step_s = STEP_S[labels.pool] * (1 + 0.03 * (k or 0) * load)
    return Outcome(
        labels,
        Status.OK,
        0.0,
        steps * step_s,
        0.05,
        step_s,
        200,
        TOKENS,
        steps + 1,
        Signal.PER_REQUEST if k else Signal.NONE,
        drafted=(k or 0) * steps,
        accepted=TOKENS - 1 - steps if k else 0,
        steps=steps,
        decode_s=steps * step_s,
        load=load,
    )


def run(
    compiled: CompiledPolicy,
    acceptance: Callable[[str, float], float],
    templates: Callable[[int], str],
    until: float,
    stats: LiveStats | None = None,
    start: float = 0.0,
) -> tuple[LiveStats, dict[str, str]]:
    """Two requests a second through ``decide`` (and one a second of another slice on
    standard, so that its step time is known, at loads cycling 1-3); returns the stats and
    the slice each template was last decided into."""
    stats = stats or LiveStats(lambda: compiled, load=lambda model, now: 1.0)
    seen: dict[str, str] = {}
    t, n = start, int(start * 2)
    while t < until:
        template = templates(n)
        decision = decide(features(template, n), compiled, {}, stats.guards, t, stats.splits)
        seen[template] = decision.slice
        labels = Labels(
            "m",
            decision.rule,
            decision.slice,
            decision.pool,
            K[decision.pool],
            epoch=decision.epoch,
            probe=decision.probe,
            parent=decision.parent,
            candidates=decision.candidates,
        )
        load = 1.0 + n % 3
        stats.record(outcome(labels, acceptance(template, t), load), t + 0.2)
        if n % 2:
            other = Labels("m", "default", "other", "standard", None)
            stats.record(outcome(other, 0.0, load), t + 0.3)
        stats.tick(t + 0.4)
        t, n = t + 0.5, n + 1
    return stats, seen


def alternate(n: int) -> str:
    return REVIEW if n % 2 else REPORTS


def opposite(template: str, t: float) -> float:
    return 0.9 if template == REVIEW else 0.05


def test_opposite_economics_split_and_each_child_moves_alone() -> None:
    stats, seen = run(policy(), opposite, alternate, until=120)
    (split,) = stats.splits.values()
    assert split.key == "template" and "split by template" in split.why
    review, reports = seen[REVIEW], seen[REPORTS]
    assert review != reports and {review, reports} == set(split.children())
    assert review.startswith(split.parent + " / app:")
    assert stats.guards.get(reports) is not None and stats.guards[reports].offset == 1
    assert review not in stats.guards or stats.guards[review].offset == 0
    assert any("split by template" in e.reason for e in stats.events)


def test_a_child_starts_from_its_parents_state_and_evidence() -> None:
    stats, seen = run(policy(), opposite, alternate, until=120)
    child = stats.slices.records[seen[REVIEW]]
    assert child.windows and child.economic  # the evidence its template gathered pooled


def test_equal_economics_with_different_templates_never_split() -> None:
    stats, _ = run(policy(), lambda template, t: 0.9, alternate, until=300)
    assert not stats.splits and not stats.slices.split_versions


def test_a_template_gone_before_a_collapse_is_not_told_apart_by_it() -> None:
    """Two templates with equal economics, one served only in the first minute, the other
    on through a collapse at 60 s: their whole windows differ by the collapse, the minute
    both were served in does not (an agent's conversations, each a template of its own,
    come and go so)."""

    def first_minute(n: int) -> str:
        return alternate(n) if n < 120 else REPORTS

    def collapse(template: str, t: float) -> float:
        return 0.9 if t < 60 else 0.05

    stats, seen = run(policy(), collapse, first_minute, until=240)
    assert not stats.splits and not stats.slices.split_versions
    assert stats.guards[seen[REPORTS]].offset == 1  # it fell in the collapse all the same


def test_splitting_off_keeps_the_slice_whole() -> None:
    stats, seen = run(policy("{split: false}"), opposite, alternate, until=120)
    assert not stats.splits and seen[REVIEW] == seen[REPORTS]


def test_children_merge_back_once_their_economics_agree() -> None:
    compiled = policy("{merge_after_s: 60}")
    stats, _ = run(compiled, opposite, alternate, until=120)
    assert stats.splits

    def healed(template: str, t: float) -> float:
        return 0.9

    stats, seen = run(compiled, healed, alternate, until=1200, stats=stats, start=120)
    assert not stats.splits, [e.reason for e in stats.events]
    assert seen[REVIEW] == seen[REPORTS]
    assert any(e.reason.startswith("merged") for e in stats.events)


def test_a_pinned_split_needs_no_difference() -> None:
    stats, seen = run(policy("{pin: {default: template}}"), lambda t, _: 0.9, alternate, 30)
    (split,) = stats.splits.values()
    assert split.pinned and seen[REVIEW] != seen[REPORTS]


def test_hundreds_of_templates_keep_the_bounds() -> None:
    compiled = policy("{max_children: 3}")

    def many(n: int) -> str:
        return f"{n % 300:016x}"

    def mixed(template: str, t: float) -> float:
        return 0.9 if int(template, 16) % 2 else 0.05

    stats, _ = run(compiled, mixed, many, until=900)
    for family in stats.splitter.families.values():
        assert all(len(v) <= tracked(3) for v in family.values.values())
    assert len(stats.splitter.families) <= MAX_FAMILIES
    for split in stats.splits.values():
        assert len(split.values) <= 3
    labels = {key for key in stats.slices.records}
    assert all(key.rsplit(":", 1)[-1] in {"1", "2", "3"} for key in labels if "app:" in key)


def test_the_admin_view_shows_the_tree() -> None:
    stats, seen = run(policy(), opposite, alternate, until=120)
    ((parent, tree),) = stats.views.splits(120.0).items()
    assert tree["key"] == "template" and "split by template" in str(tree["why"])
    children = {c["slice"]: c for c in tree["children"]}  # type: ignore[attr-defined]
    assert set(children) == {seen[REVIEW], seen[REPORTS]}
    assert children[seen[REPORTS]]["rung"] == "standard"
    assert children[seen[REVIEW]]["rung"] == "spec"
    assert set(children[seen[REVIEW]]["seconds_per_token"]) == {"spec", "standard"}
    assert parent == split_parent(seen[REVIEW])


def split_parent(child: str) -> str:
    return child.rsplit(" / ", 1)[0]


def test_an_answer_decided_before_the_split_is_its_childs_evidence() -> None:
    compiled = policy()
    stats, seen = run(compiled, opposite, alternate, until=120)
    (split,) = stats.splits.values()
    reports = seen[REPORTS]
    decided = decide(features(REPORTS, 1), compiled, {}, {}, 0.0, {})  # before the split
    assert decided.slice == split.parent
    labels = Labels(
        "m",
        decided.rule,
        decided.slice,
        "spec",
        4,
        parent=decided.parent,
        candidates=decided.candidates,
    )
    child, parent = stats.slices.records[reports], stats.slices.records[split.parent]
    before = (child.requests(121.0), parent.requests(121.0))
    stats.record(outcome(labels, 0.05, 1.0), 121.0)
    assert (child.requests(121.0), parent.requests(121.0)) == (before[0] + 1, before[1])


def test_the_rest_of_a_split_slice_forgets_its_first_tokens_from_before() -> None:
    """The pooled rest is judged on its own first tokens: the times from before the split
    were mostly its children's (a long-prompt template's slow first tokens held a whole
    slice down until they left the window)."""
    compiled = policy()
    stats, _ = run(compiled, opposite, alternate, until=120)
    (split,) = stats.splits.values()
    parent = stats.slices.records[split.parent]
    assert any(at < split.since for kept in parent.ttft.values() for at, _ in kept)
    assert parent.ttft_p50("spec", 121.0, 1) is None


def test_a_split_child_is_judged_on_its_inherited_evidence_at_once() -> None:
    compiled = policy()
    stats, _ = run(compiled, opposite, alternate, until=120)
    at = next(e.at for e in stats.events if "split by template" in e.reason)
    stats, _ = run(compiled, opposite, alternate, until=at - 0.3)  # the tick that splits
    (split,) = stats.splits.values()
    for child in split.children():  # not at its first outcome after the split
        assert stats.slices.records[child].judged == split.since == at
