"""The guardrail state machine, with a fake clock: table cases and properties."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.guardrail import (
    NOTHING,
    ON_START,
    Evidence,
    Judged,
    Phase,
    SliceState,
    alarm,
    step,
)
from policies.model import Guardrail, GuardrailMode

# CPU-bound: one worker runs these one after another, at a lower priority, with time to
# spare (docs/development.md, "Tests in parallel")
pytestmark = [pytest.mark.xdist_group("cpu"), pytest.mark.timeout(600)]

CONFIG = Guardrail(
    mode=GuardrailMode.THRESHOLD,
    min_acceptance=0.5,
    recover_above=0.6,
    min_samples=10,
    cooldown_s=30,
)
LADDER_K = (7, 3, None)  # spec-k7, spec-k3, standard


def advance(
    state: SliceState,
    evidence: Evidence,
    now: float,
    config: Guardrail = CONFIG,
    serving_evidence: Evidence | None = None,
):
    """``evidence`` is about the rung being tested: the one served, or the one above it
    while probing (then ``serving_evidence`` is about the one served)."""
    serving = state.offset
    if state.phase is Phase.PROBING:
        above = Judged(evidence, LADDER_K[serving - 1])
        here = Judged(serving_evidence or Evidence(), LADDER_K[serving])
    else:
        above, here = NOTHING, Judged(evidence, LADDER_K[serving])
    return step("s", state, here, above, len(LADDER_K) - 1 - serving, config, now)


def test_falls_back_only_with_enough_samples():
    assert advance(ON_START, Evidence(9, 0.1), 1.0) == (ON_START, None)
    state, event = advance(ON_START, Evidence(10, 0.1), 1.0)
    assert (state.offset, state.phase, state.since, state.version) == (1, Phase.FALLEN_BACK, 1.0, 1)
    assert event is not None and "acceptance 0.100 < 0.5 over 10 requests" in event.reason
    assert event.numbers == {"samples": 10.0, "acceptance": 0.1}


def test_cooldown_then_probe_then_recover_or_stay_down():
    fallen = SliceState(1, Phase.FALLEN_BACK, 100.0, 1)
    assert advance(fallen, Evidence(), 129.9)[1] is None
    probing, event = advance(fallen, Evidence(), 130.0)
    assert probing.phase is Phase.PROBING and event is not None
    assert advance(probing, Evidence(50, 0.9), 131.0)[0] == SliceState(0, Phase.ON, 131.0, 3)
    down, event = advance(probing, Evidence(50, 0.55), 131.0)
    assert down == SliceState(1, Phase.FALLEN_BACK, 131.0, 3)
    assert event is not None and "staying down" in event.reason


def test_recovering_to_a_middle_rung_keeps_probing_upward():
    probing = SliceState(2, Phase.PROBING, 0.0, 4)
    state, _ = advance(probing, Evidence(10, 0.7), 5.0)
    assert state == SliceState(1, Phase.FALLEN_BACK, 5.0, 5)


def test_a_slice_fallen_back_to_a_speculative_rung_falls_further_when_it_fails_too():
    on_k3 = SliceState(1, Phase.FALLEN_BACK, 0.0, 1)
    state, event = advance(on_k3, Evidence(10, 0.2), 1.0)  # before any cooldown
    assert state == SliceState(2, Phase.FALLEN_BACK, 1.0, 2) and event is not None
    probing_k7 = SliceState(1, Phase.PROBING, 0.0, 2)
    state, _ = advance(probing_k7, Evidence(3, 0.9), 2.0, serving_evidence=Evidence(10, 0.1))
    assert state.offset == 2


def test_standard_rung_is_never_judged_and_bottom_never_falls():
    on_standard = SliceState(2, Phase.ON, 0.0, 3)
    assert advance(on_standard, Evidence(100, 0.0), 1.0)[1] is None


evidence = st.builds(
    Evidence,
    st.integers(min_value=0, max_value=40),
    st.one_of(st.none(), st.floats(min_value=0, max_value=1)),
)


@settings(max_examples=300)
@given(
    st.lists(st.tuples(st.floats(min_value=0, max_value=20), evidence, evidence), max_size=60),
    st.floats(min_value=0, max_value=60),
)
def test_never_leaves_the_ladder_and_never_flaps_faster_than_the_cooldown(steps, cooldown):
    config = CONFIG.model_copy(update={"cooldown_s": cooldown})
    state, now = ON_START, 0.0
    last_fall = None
    for gap, seen, serving in steps:
        now += gap
        before = state
        state, event = advance(state, seen, now, config, serving_evidence=serving)
        assert 0 <= state.offset <= len(LADDER_K) - 1
        if event is None:
            assert state == before
            continue
        assert state.version == before.version + 1 and event.at == now
        if state.offset > before.offset:
            last_fall = now
        if state.offset < before.offset:
            assert last_fall is not None and now - last_fall >= cooldown


def test_an_alarm_drops_one_rung_where_there_is_one_and_is_only_logged_on_the_last():
    fallen = SliceState(1, Phase.FALLEN_BACK, 5.0, 3)
    for state in (ON_START, fallen):
        after, event = alarm("s", state, 1, "canary", {"compared": 20.0}, 9.0)
        assert (after.offset, after.phase, after.since) == (state.offset + 1, "fallen_back", 9.0)
        assert after.version == state.version + 1
        assert (event.before, event.after, event.reason) == (state, after, "canary")
    after, event = alarm("s", fallen, 0, "canary", {}, 9.0)
    assert after is fallen and event.before == event.after == fallen
