"""The latency rule on both sides of a move: under a goal, a slice fallen from speculation for
its time to first token climbs back only where the rule would not fire again once it is up
there, so a
cheaper rung above does not pull it back while its first tokens there would still be slow;
and a slice that just climbed falls again on its own requests up there since, not on probes
taken while it was below nor on its requests there before it fell. Driven through ``Judge``
and ``LiveStats`` with injected time."""

from __future__ import annotations

from gateway.measure.acceptance import Labels, Outcome, Signal, Status
from gateway.measure.judging import Judge
from gateway.measure.livestats import LiveStats
from gateway.measure.slicerecord import SliceRecord
from gateway.measure.steptimes import StepTimes
from policies.compiled import load_policy
from policies.economics import Judgement
from policies.guardrail import Economics, Phase, SliceState, step_economic

POLICY = load_policy(
    """
version: 1
pools:
  spec: {kind: speculative, model: m, num_speculative_tokens: 4, endpoints: ["http://a"]}
  standard: {kind: standard, model: m, endpoints: ["http://b"]}
ladder: [spec, standard]
guardrail: {ttft_p50_s: 1.5}
rules: [{name: default, start: spec}]
"""
)
PLACE = POLICY.placement("default", "m")
CONFIG = PLACE.guardrail if PLACE is not None else None
KEY = "default / t<=0.3 / ctx4k-16k"
CHEAPER_ABOVE = Judgement(1, 0.75, -4.0, 30, "spec costs 0.75x standard")
FELL_AT = 100.0


def fallen_by_ttft() -> SliceRecord:
    """A slice that fell to standard at 100 s because its first tokens on spec came 2 s
    after its request where standard's came after 1 s; since then standard carries it, and
    takes 2.2 s, and its probes of spec, which carry a share of it, come back after 1 s."""
    entry = SliceRecord("m", "default", economic=True)
    entry.state = SliceState(1, Phase.PROBING, FELL_AT + 30.0, 2, probe_share=0.5)
    for i in range(10):
        entry.first_token("spec", 2.0, 80.0 + 2 * i, carried=True)
        entry.first_token("standard", 1.0, 60.0 + 4 * i, carried=False)
    for i in range(20):
        entry.first_token("standard", 2.2, FELL_AT + 2 * i, carried=True)
    for i in range(6):
        entry.first_token("spec", 1.0, FELL_AT + 30 + 2 * i, carried=False)
    return entry


def seen(entry: SliceRecord, now: float) -> Economics:
    assert PLACE is not None
    judged = Judge(lambda: POLICY, StepTimes()).seen(entry, PLACE, now).economics
    return Economics(above=CHEAPER_ABOVE, latency_above=judged.latency_above)


def test_a_slice_fallen_for_its_first_tokens_does_not_climb_on_cost_alone() -> None:
    assert CONFIG is not None
    entry = fallen_by_ttft()
    now = FELL_AT + 45.0
    economics = seen(entry, now)
    # spec as the slice would have it (2.0 s, carrying it) against standard without it
    # (1.0 s): the rule would fire again, although standard with it (2.2 s) is slower
    assert economics.latency_above is not None
    assert (economics.latency_above.upper, economics.latency_above.lower) == (2.0, 1.0)
    after, event = step_economic(KEY, entry.state, economics, CONFIG, now)
    assert after.offset == 1, event
    assert event is None or "cheaper above" not in event.reason


def test_it_climbs_once_what_bounds_its_first_tokens_up_there_says_they_are_fine() -> None:
    assert CONFIG is not None
    entry = fallen_by_ttft()
    # minutes on, the requests spec and standard served in either condition have left
    # the window; the newest probes of spec (at most the slice's load) and standard's own
    # requests (at least it) stand in, and they agree now
    later = FELL_AT + 400.0
    for i in range(6):
        entry.first_token("spec", 1.1, later - 20 + 2 * i, carried=False)
        entry.first_token("standard", 1.2, later - 20 + 2 * i, carried=True)
    economics = seen(entry, later)
    after, event = step_economic(KEY, entry.state, economics, CONFIG, later)
    assert after.offset == 0 and event is not None and "cheaper above" in event.reason


def test_probes_that_are_slow_even_without_its_whole_load_hold_the_climb() -> None:
    assert CONFIG is not None
    entry = fallen_by_ttft()
    later = FELL_AT + 400.0
    for i in range(6):
        entry.first_token("spec", 3.0, later - 20 + 2 * i, carried=False)
        entry.first_token("standard", 1.2, later - 20 + 2 * i, carried=True)
    after, _ = step_economic(KEY, entry.state, seen(entry, later), CONFIG, later)
    assert after.offset == 1


def outcome(pool: str, ttft: float, *, epoch: int, probe: bool = False) -> Outcome:
    labels = Labels("m", "default", KEY, pool, 4 if pool == "spec" else None)
    labels = Labels(
        labels.model, labels.rule, KEY, pool, labels.k, epoch=epoch, probe=probe, shadow=False
    )
    return Outcome(labels, Status.OK, 0.0, 2.0, ttft, 0.02, 5000, 64, 64, Signal.NONE)


def test_a_slice_that_just_climbed_falls_on_its_new_requests_not_on_older_times() -> None:
    stats = LiveStats(lambda: POLICY)
    entry = stats.slices.touch(KEY, "m", "default", 0.0)
    entry.economic = True
    for i in range(4):  # its own requests on spec before it fell, in the window still
        entry.first_token("spec", 3.0, 2.0 + i, carried=True)
    entry.state = SliceState(1, Phase.PROBING, 10.0, 3, probe_share=0.5)
    for i in range(8):  # probes of spec during a burst, and standard serving the slice
        stats.record(outcome("spec", 3.0, epoch=3, probe=True), 20.0 + i)
        stats.record(outcome("standard", 1.0, epoch=3), 20.5 + i)
    assert entry.ttft_p50("spec", 30.0, 3, carried=False) == (3.0, 8)
    assert entry.ttft_p50("spec", 30.0, 3, carried=True) == (3.0, 4)
    assert entry.ttft_p50("standard", 30.0, 3, carried=True) == (1.0, 8)
    entry.state = SliceState(0, Phase.ON, 30.0, 4)  # it climbed back
    stats.record(outcome("standard", 1.0, epoch=3), 30.5)  # decided before: carried it
    assert entry.ttft_p50("standard", 31.0, 9, carried=True) == (1.0, 9)
    assert PLACE is not None
    judged = Judge(lambda: POLICY, StepTimes()).seen(entry, PLACE, 31.0).economics
    assert judged.latency is None  # not yet a request of its own up there since
    for i in range(3):
        stats.record(outcome("spec", 1.1, epoch=4), 31.0 + i)
    judged = Judge(lambda: POLICY, StepTimes()).seen(entry, PLACE, 34.0).economics
    assert judged.latency is not None and judged.latency.upper == 1.1
    assert CONFIG is not None
    after, _ = step_economic(KEY, entry.state, judged, CONFIG, 34.0)
    assert after.offset == 0
