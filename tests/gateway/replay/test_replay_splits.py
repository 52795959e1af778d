"""Replayed through the gateway's own decisions: two applications with opposite economics
in one policy slice split (each served where it is cheaper), two with the same economics
do not, and many small templates keep the bound on children. On the affine cost model,
which these timings were derived on (replay's default is the measured curve)."""

from __future__ import annotations

from pathlib import Path

from backends.sim.model import CostModel
from gateway.replay.run import replay as replay_on
from gateway.replay.scenario import load_scenario
from policies.compiled import load_policy

BENCH = Path(__file__).parents[3] / "bench"
BASELINE = (BENCH / "policies" / "baseline.yaml").read_text()
SLICE = "default / t<=0.3 / ctx4k-16k"


def replay(policy, scenario):
    return replay_on(policy, scenario, cost=CostModel())


def scenario(name: str, **changes: object):
    loaded = load_scenario((BENCH / "scenarios" / f"{name}.yaml").read_text())
    return loaded.model_copy(update=changes)


def test_opposite_economics_in_one_slice_split_by_template():
    done = replay(load_policy(BASELINE), scenario("two-apps-one-slice", duration_s=150))
    splits = [e for e in done.events if e.slice == SLICE and "split by template" in e.reason]
    assert splits, [e.reason for e in done.events]
    late = [r for r in done.rows if r.arrival > splits[0].at + 60 and not r.shadow]
    review = {r.slice for r in late if r.traffic == "review"}
    reports = {r.slice for r in late if r.traffic == "reports"}
    assert len(review) == len(reports) == 1 and review != reports
    assert all(key.startswith(SLICE + " / app:") for key in review | reports)
    assert sum(r.pool == "standard" for r in late if r.traffic == "reports") > 0.8 * sum(
        r.traffic == "reports" for r in late
    )
    assert all(r.pool == "spec" for r in late if r.traffic == "review")


def test_same_economics_with_different_templates_do_not_split():
    done = replay(load_policy(BASELINE), scenario("two-apps-alike", duration_s=300))
    assert not [e for e in done.events if "split by" in e.reason]
    assert {r.slice for r in done.rows if r.traffic in ("review", "refactor")} == {SLICE}


def test_splitting_off_in_the_policy_keeps_one_slice():
    policy = load_policy(BASELINE + "slices: {split: false}\n")
    done = replay(policy, scenario("two-apps-one-slice", duration_s=150))
    assert {r.slice for r in done.rows if r.traffic in ("review", "reports")} == {SLICE}


def test_two_gateway_replicas_agree_on_the_split():
    done = replay(load_policy(BASELINE), scenario("two-apps-one-slice", duration_s=150, gateways=2))
    splits = [e for e in done.events if "split by template" in e.reason]
    assert len(splits) == 1, [e.reason for e in done.events]  # placed once, by one replica
    late = [r for r in done.rows if r.arrival > splits[0].at + 10 and not r.shadow]
    for traffic in ("review", "reports"):
        by_replica = {(r.client % 2, r.slice) for r in late if r.traffic == traffic}
        assert {replica for replica, _ in by_replica} == {0, 1}
        assert len({key for _, key in by_replica}) == 1, by_replica
