"""Live statistics: windows roll with injected time, epochs separate evidence, memory is
bounded, and shared-mode proposals wait for the store."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.measure.acceptance import Labels, Outcome, Signal, Status
from gateway.measure.livestats import LiveStats
from gateway.measure.windows import Counts, Window
from policies.compiled import load_policy

POLICY = load_policy(
    """
version: 1
pools:
  spec: {kind: speculative, model: m, num_speculative_tokens: 4, endpoints: ["http://a"]}
  standard: {kind: standard, model: m, endpoints: ["http://b"]}
ladder: [spec, standard]
guardrail:
  {mode: threshold, min_acceptance: 0.5, recover_above: 0.6, min_samples: 4, window_s: 60,
   cooldown_s: 10}
rules: [{name: default, start: spec}]
"""
)
KEY = "default / t>0.9 / ctx<4k"


def outcome(rate: float, *, epoch: int = 0, pool: str = "spec", status=Status.OK) -> Outcome:
    labels = Labels("m", "default", KEY, pool, 4 if pool == "spec" else None, epoch=epoch)
    return Outcome(
        labels,
        status,
        0.0,
        1.0,
        0.1,
        0.02,
        10,
        40,
        10,
        Signal.PER_REQUEST,
        drafted=40 if pool == "spec" else 0,
        accepted=int(40 * rate) if pool == "spec" else 0,
    )


def test_window_drops_old_buckets():
    w = Window(60)
    w.add(0.0, Counts(requests=1))
    w.add(30.0, Counts(requests=1, drafted=10))
    assert w.total(59.0).requests == 2
    assert w.total(62.5).requests == 1
    assert w.total(95.0).requests == 0
    assert w.since_start.requests == 2  # probe rounds see everything since the start


@given(st.lists(st.tuples(st.floats(0, 50), st.integers(1, 5)), max_size=40), st.floats(0, 80))
def test_window_total_equals_a_plain_sum(adds, extra):
    w = Window(60)
    now = 0.0
    kept = []
    for gap, n in adds:
        now += gap
        w.add(now, Counts(requests=n))
        kept.append((now - now % w.width, n))
    later = now + extra
    expected = sum(n for start, n in kept if start > later - 60)
    assert w.total(later).requests == expected


def test_restored_increments_land_in_their_own_bucket():
    w = Window(60)
    w.add(30.0, Counts(requests=1))
    w.add(10.0, Counts(requests=2))  # put back after a failed push
    assert [(start, c.requests) for start, c in w.drain()] == [(10.0, 2), (30.0, 1)]
    assert w.total(31.0).requests == 0


def test_falls_back_then_probes_then_recovers_with_a_fake_clock():
    stats = LiveStats(lambda: POLICY)
    for t in range(3):
        stats.record(outcome(0.2), float(t))
    assert not stats.guards
    stats.record(outcome(0.2), 3.0)
    assert stats.guards[KEY].offset == 1
    stats.tick(12.0)
    assert stats.guards[KEY].phase == "fallen_back"
    stats.tick(13.0)
    probing = stats.guards[KEY]
    assert probing.phase == "probing"
    for t in range(4):
        stats.record(outcome(0.9, epoch=probing.version), 14.0 + t)
    assert stats.guards[KEY].offset == 0 and stats.guards[KEY].phase == "on"
    assert [e.after.phase for e in stats.events] == ["fallen_back", "probing", "on"]


def test_outcomes_of_an_older_epoch_do_not_count():
    stats = LiveStats(lambda: POLICY)
    for t in range(4):
        stats.record(outcome(0.2), float(t))
    version = stats.guards[KEY].version
    for t in range(10):  # requests decided before the fall, finishing after it
        stats.record(outcome(0.2, epoch=0), 4.0 + t)
    assert stats.guards[KEY].version == version
    assert stats.views.summary(20.0)[KEY]["pools"] == {}


def test_cancelled_outcomes_are_not_evidence_and_errors_are_counted():
    stats = LiveStats(lambda: POLICY)
    for t in range(10):
        stats.record(outcome(0.1, status=Status.CANCELLED), float(t))
    stats.record(outcome(0.1, status=Status.ERROR), 10.0)
    assert not stats.guards
    assert stats.views.summary(11.0)[KEY]["pools"]["spec"]["errors"] == 1


def test_slices_are_capped_least_recently_used_first():
    stats = LiveStats(lambda: POLICY, max_slices=3)
    for i in range(5):
        labels = Labels("m", "default", f"slice-{i}", "spec", 4)
        stats.record(Outcome(labels, Status.OK, 0, 1, None, None, 1, 1, 1, Signal.NONE), 1.0)
    assert list(stats.views.summary(1.0)) == ["slice-2", "slice-3", "slice-4"]


def test_shared_mode_proposes_instead_of_applying():
    stats = LiveStats(lambda: POLICY)
    stats.replica.reachable(True)
    for t in range(4):
        stats.record(outcome(0.2), float(t))
    assert not stats.guards and list(stats.slices.proposals) == [KEY]
    for t in range(4):  # no second proposal while one is pending
        stats.record(outcome(0.2), 5.0 + t)
    proposals = stats.replica.take_proposals()
    assert list(proposals) == [KEY] and not stats.slices.proposals
    stats.replica.apply(KEY, proposals[KEY])
    assert stats.guards[KEY].offset == 1


def test_a_probe_round_at_low_traffic_counts_everything_since_it_began():
    stats = LiveStats(lambda: POLICY)
    for t in range(4):
        stats.record(outcome(0.2), float(t))
    stats.tick(20.0)
    probing = stats.guards[KEY]
    assert probing.phase == "probing"
    for i in range(4):  # one probe a minute: never 4 inside a 60 s window
        stats.record(outcome(0.9, epoch=probing.version), 30.0 + 70.0 * i)
    assert stats.guards[KEY].phase == "on"


def test_acceptance_comes_with_a_confidence_margin():
    stats = LiveStats(lambda: POLICY)
    for t, rate in enumerate([0.8, 0.9] * 10):
        stats.record(outcome(rate), float(t))
    window = stats.views.summary(30.0)[KEY]["pools"]["spec"]
    # per-request rates 0.8 / 0.9 (sd ~0.051 over 20): 1.96 * sd / sqrt(20) ~ 0.023
    assert window["acceptance"] == pytest.approx(0.85)
    assert window["acceptance_margin95"] == pytest.approx(0.0225, abs=0.0005)


def test_a_reload_that_shortens_the_ladder_clips_fallen_back_slices():
    three = load_policy(
        """
version: 1
pools:
  k7: {kind: speculative, model: m, num_speculative_tokens: 7, endpoints: ["http://a"]}
  k3: {kind: speculative, model: m, num_speculative_tokens: 3, endpoints: ["http://b"]}
  standard: {kind: standard, model: m, endpoints: ["http://c"]}
ladder: [k7, k3, standard]
guardrail:
  {mode: threshold, min_acceptance: 0.5, recover_above: 0.6, min_samples: 1, cooldown_s: 10}
rules: [{name: default, start: k7}]
"""
    )
    current = [three]
    stats = LiveStats(lambda: current[0])
    for pool, k, epoch in (("k7", 7, 0), ("k3", 3, 1)):
        labels = Labels("m", "default", KEY, pool, k, epoch=epoch)
        bad = Outcome(labels, Status.OK, 0, 1, 0.1, 0.1, 1, 9, 9, Signal.PER_REQUEST, 10, 1)
        stats.record(bad, 1.0)
    assert stats.guards[KEY].offset == 2
    current[0] = POLICY  # [spec, standard]: one rung below the start
    stats.policy_changed(POLICY)
    assert stats.guards[KEY].offset == 1 and stats.guards[KEY].version == 3


def test_summary_names_the_rungs_and_the_request_rate():
    stats = LiveStats(lambda: POLICY)
    for i in range(30):  # 2 requests a second for 15 s, healthy
        stats.record(outcome(0.9), 100.0 + i / 2)
    healthy = stats.views.summary(115.0)[KEY]
    assert (healthy["start"], healthy["rung"], healthy["probing"]) == ("spec", "spec", None)
    # the window has covered 15 s (plus at most one 2.5 s bucket): the rate is close to 2/s
    assert 30 / 17.5 <= healthy["requests_per_s"] <= 2.0
    assert healthy["window_s"] == 60.0
    for i in range(40):
        stats.record(outcome(0.1), 116.0 + i / 10)
    fallen = stats.views.summary(120.0)[KEY]
    assert (fallen["phase"], fallen["rung"], fallen["probing"]) == ("fallen_back", "standard", None)
    stats.tick(135.0)
    probing = stats.views.summary(135.0)[KEY]
    assert (probing["phase"], probing["rung"], probing["probing"]) == (
        "probing",
        "standard",
        "spec",
    )
    later = stats.views.summary(1000.0)[KEY]
    assert later["requests_per_s"] == 0.0


def test_an_alarm_moves_a_slice_one_rung_and_on_the_last_rung_is_only_logged():
    stats = LiveStats(lambda: POLICY)
    stats.alarm(KEY, "canary", {}, 1.0)  # a slice never seen: nothing to move
    assert not stats.events
    stats.record(outcome(0.9), 1.0)
    stats.alarm(KEY, "canary: greedy output differs", {"compared": 20.0}, 2.0)
    assert stats.guards[KEY].offset == 1 and stats.events[-1].reason.startswith("canary")
    stats.alarm(KEY, "canary again", {}, 3.0)  # on standard: nowhere to fall
    assert stats.guards[KEY].offset == 1
    assert stats.events[-1].before == stats.events[-1].after == stats.guards[KEY]


def test_a_replica_that_loses_its_store_applies_what_it_had_proposed():
    stats = LiveStats(lambda: POLICY)
    stats.replica.reachable(True)
    for t in range(4):
        stats.record(outcome(0.2), float(t))
    assert not stats.guards
    stats.replica.reachable(False)
    assert stats.guards[KEY].offset == 1 and not stats.slices.proposals
    (kept,) = stats.replica.states()
    assert (kept.slice, kept.model, kept.rule, kept.state) == (
        KEY,
        "m",
        "default",
        stats.guards[KEY],
    )


def test_increments_drained_for_the_store_are_restored_when_the_push_fails():
    stats = LiveStats(lambda: POLICY)
    for t in range(3):
        stats.record(outcome(0.9), float(t))
    increments = stats.replica.drain()
    assert sum(i.counts.requests for i in increments) == 3
    assert stats.views.summary(3.0)[KEY]["pools"]["spec"]["requests"] == 0
    stats.replica.restore(increments)
    assert stats.views.summary(3.0)[KEY]["pools"]["spec"]["requests"] == 3
    (active,) = stats.replica.active(0.0)
    assert (active.slice, active.epoch, active.pools) == (KEY, 0, ("spec",))


def test_a_slices_probes_teach_it_what_they_prefill_above_and_its_own_requests_at_home():
    stats = LiveStats(lambda: POLICY)
    for i in range(40):  # it falls back to standard
        stats.record(outcome(0.1), 100.0 + i / 10)
    assert stats.guards[KEY].offset == 1
    now = outcome(0.9, epoch=stats.guards[KEY].version)
    mirror = dataclasses.replace(
        now,
        labels=dataclasses.replace(now.labels, shadow=True, probe=True),
        prompt_tokens=30_000,
        cached_tokens=2_000,
    )
    stats.record(mirror, 105.0)
    assert stats.slices.records[KEY].probe_prefill == 28_000.0
    served = dataclasses.replace(
        outcome(0.9, pool="standard", epoch=stats.guards[KEY].version), prompt_tokens=30_000
    )
    stats.record(dataclasses.replace(served, cached_tokens=29_000), 106.0)  # not a probe
    assert stats.slices.records[KEY].probe_prefill == 28_000.0
    assert stats.slices.records[KEY].home_prefill == 1_000.0  # served at home, warm
    # a conversation's turn, its history cached at home: a live probe saves its home
    # nothing, since the next turn prefills there what this one brought
    assert stats.slices.records[KEY].home_saving() == pytest.approx(1_000 / 30)


def test_a_prompt_sent_once_saves_its_home_what_a_live_probe_prefills_elsewhere():
    stats = LiveStats(lambda: POLICY)
    assert stats.slices.records.get(KEY) is None
    summary = dataclasses.replace(outcome(0.9), prompt_tokens=12_000)  # served at home
    stats.record(summary, 1.0)  # the answer does not say what was cached
    assert stats.slices.records[KEY].home_saving() is None
    stats.record(dataclasses.replace(summary, cached_tokens=0), 2.0)
    assert stats.slices.records[KEY].home_saving() == 12_000.0
