"""What brings a slice back, and what moves it, when evidence is thin: short mirrored probes
for quiet slices, a slice's own dispersion for its newest requests, the newest requests'
lean, and live exploration while the judge leans towards the rung below."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from policies.compiled import load_policy
from policies.decide import decide
from policies.economics import Judgement, Rung, Tally, dispersion, judge, leaning
from policies.features import Features
from policies.guardrail import (
    HEAR_WITHIN,
    Economics,
    Phase,
    SliceState,
    probe_share,
    recovery_share,
    short_probes,
    step_economic,
)
from policies.model import Guardrail, ProbeMode
from policies.steptime import StepTime

CONFIG = Guardrail()
SPEC_STEP = StepTime(0.052, 0.0004, 500)
STD_STEP = StepTime(0.028, 0.0004, 500)
STANDARD = Rung("standard", None, 1.0, STD_STEP)


def dear(ratio: float) -> Judgement:
    """The rung above judged ``ratio`` times as dear on the newest requests, undecided."""
    return Judgement(0, ratio, 1.0, 3, "why", newest_ratio=ratio)


def test_a_quiet_slice_mirrors_short_probes_a_busy_one_does_not():
    every_3s = Economics(above=dear(1.6), rate=1 / 3, tokens=192.0)
    share = recovery_share(every_3s, CONFIG, live=0.02)
    assert share == pytest.approx(1 / HEAR_WITHIN - 0.02, abs=0.005)  # one in ten, all told
    # the budget caps it: a probe of 16 tokens of 192 costs 16/192 x 1.6 of a request
    every_20s = Economics(above=dear(1.6), rate=0.05, tokens=48.0)
    capped = recovery_share(every_20s, CONFIG, live=0.0)
    assert capped == pytest.approx(CONFIG.recovery_budget / (16 / 48 * 1.6), rel=0.02)
    # a busy slice's live probes come every few seconds: no short ones
    busy = Economics(above=dear(1.6), rate=5.0, tokens=192.0)
    assert recovery_share(busy, CONFIG, live=0.01) == 0.0
    assert recovery_share(every_3s, Guardrail(recovery_budget=0), live=0.0) == 0.0


def test_a_long_conversations_short_probes_pay_their_prefill_from_the_recovery_budget():
    quiet = Economics(above=dear(1.6), rate=0.05, tokens=48.0)
    # its probes prefill 30,000 uncached tokens at 20 us each above (0.6 s), against a
    # request of 48 tokens at 25 ms a token here (1.2 s): half a request more per probe
    long = Economics(above=dear(1.6), rate=0.05, tokens=48.0, prefill=0.5)
    short = recovery_share(quiet, CONFIG, live=0.0)
    assert recovery_share(long, CONFIG, live=0.0) == pytest.approx(
        CONFIG.recovery_budget / (16 / 48 * 1.6 + 0.5), rel=0.02
    )
    assert recovery_share(long, CONFIG, live=0.0) < short
    busy, busy_long = (
        Economics(above=dear(1.6), rate=5.0),
        Economics(above=dear(1.6), rate=5.0, prefill=0.5),
    )
    # the live probes' share is priced on decode: they are where a healing is first seen
    assert probe_share(busy_long, CONFIG) == probe_share(busy, CONFIG)


def test_a_live_probe_pays_from_the_probe_budget_what_it_re_prefills_above():
    """A conversation's history is cached where its turns go, and a live probe of the rung
    above prefills it there again; a summary's probe prefills what it would at home."""
    unknown = Economics(above=dear(1.2), rate=5.0, prefill=5.0)
    summary = Economics(above=dear(1.2), rate=5.0, prefill=5.0, reprefill=0.0)
    talk = Economics(above=dear(1.2), rate=5.0, prefill=5.0, reprefill=4.0)
    assert probe_share(summary, CONFIG) == probe_share(unknown, CONFIG)
    assert probe_share(summary, CONFIG) == pytest.approx(CONFIG.probe_budget / 0.2)
    assert probe_share(talk, CONFIG) == pytest.approx(CONFIG.probe_budget / 4.2, rel=0.02)
    # a quiet conversation still probes at least once every max_cooldown_s
    quiet = Economics(above=dear(1.2), rate=0.01, prefill=5.0, reprefill=40.0)
    assert probe_share(quiet, CONFIG) == pytest.approx(1 / (0.01 * CONFIG.max_cooldown_s), rel=0.02)


def test_an_overdue_probe_is_owed_more_than_the_budget_only_where_it_is_cheap():
    """Past the gap of one probe in ten requests a short prompt's slice raises its share
    until a probe comes; a long conversation's probe is mostly a cold prefill, so its slice
    waits for the gap of what the budget buys (or a little more), not one of ten."""
    short = Economics(above=dear(1.6), rate=0.05, tokens=48.0, since_probe=300.0)
    assert recovery_share(short, CONFIG, live=0.0) == pytest.approx(0.15)  # 200 s overdue
    # a probe of 16 tokens of 48 at 1.6 (0.53 of a request) and 5 requests' prefill
    long = Economics(above=dear(1.6), rate=0.05, tokens=48.0, prefill=5.0, since_probe=300.0)
    budget = CONFIG.recovery_budget / (16 / 48 * 1.6 + 5.0)
    assert recovery_share(long, CONFIG, live=0.0) == pytest.approx(budget, rel=0.02)
    owed = 0.1 * (16 / 48 * 1.6) / (16 / 48 * 1.6 + 5.0)  # the wanted share's decode part
    late = Economics(
        above=dear(1.6), rate=0.05, tokens=48.0, prefill=5.0, since_probe=1.5 / (0.05 * owed)
    )
    assert recovery_share(late, CONFIG, live=0.0) == pytest.approx(1.5 * owed, rel=0.05)


def test_a_summary_probes_live_where_a_short_mirror_would_be_a_cold_prefill():
    """A summary's 12,000-token prompt is prefilled whole wherever it goes: a short mirror of
    it costs its prefill up there (5 requests here) for 16 tokens, where a live probe costs
    only the rung's dearer decode (r - 1). The recovery budget then buys live probes; a
    conversation's live probe re-prefills its history up there, and a chat request's short
    mirror costs a small part of one: those stay mirrored."""
    summary = Economics(above=dear(1.6), rate=0.05, tokens=192.0, prefill=5.0, reprefill=0.0)
    live, mirror = short_probes(summary, CONFIG)
    assert mirror == 0.0
    bought = CONFIG.recovery_budget / 0.6
    assert live == pytest.approx(probe_share(summary, CONFIG) + bought, rel=0.02)
    assert bought > recovery_share(summary, CONFIG, probe_share(summary, CONFIG))
    talk = replace(summary, reprefill=5.0)
    # a conversation's first turn looks like a prompt sent once, but its slice's prompts are
    # found cached at home: its live probe takes the history away for the next turn
    first = replace(summary, resent=True)
    chat = Economics(above=dear(1.6), rate=0.05, tokens=192.0, prefill=0.05, reprefill=0.0)
    for mirrored in (talk, first, chat):
        share = probe_share(mirrored, CONFIG)
        assert short_probes(mirrored, CONFIG) == (share, recovery_share(mirrored, CONFIG, share))
    # probes that are mirrors by the policy's choice stay mirrors
    shadow = Guardrail(probe=ProbeMode.SHADOW)
    assert short_probes(summary, shadow)[1] > 0.0
    # overdue, live probes are owed what the budgets buy, not one request in ten
    owed = probe_share(summary, CONFIG) + bought
    late = replace(summary, since_probe=1.5 / (summary.rate * owed))
    assert short_probes(late, CONFIG)[0] == pytest.approx(1.5 * owed, rel=0.05)


def test_probing_says_its_short_mirrors_and_a_short_probe_is_decided_as_such():
    fallen = SliceState(1, Phase.FALLEN_BACK, 0.0, 1)
    seen = Economics(above=dear(1.6), rate=1 / 3, tokens=192.0)
    probing, event = step_economic("s", fallen, seen, CONFIG, 31.0)
    assert probing.phase is Phase.PROBING and probing.mirror_share > 0
    assert event is not None and "mirrored there short" in event.reason
    policy = load_policy(
        """
version: 1
pools:
  spec: {kind: speculative, model: m, num_speculative_tokens: 4, endpoints: ["http://a"]}
  standard: {kind: standard, model: m, endpoints: ["http://b"]}
ladder: [spec, standard]
rules: [{name: default, start: spec}]
"""
    )
    key = "default / t<=0.3 / ctx<4k"
    state = SliceState(1, Phase.PROBING, 0.0, 2, probe_share=0.0001, mirror_share=0.9999)
    features = Features("/v1/chat/completions", "m", temperature=0, request_id="r-7")
    decision = decide(features, policy, {}, {key: state}, 40.0)
    assert decision.pool == "standard" and decision.shadow_to == "spec"
    assert decision.shadow_tokens == CONFIG.probe_tokens and decision.probe
    assert "short probe of spec" in decision.reason


def _tally(per_step: float, n: int, spread: float) -> Tally:
    """``n`` requests of 100 tokens, their tokens per step alternating about ``per_step``."""
    t = s = tt = ss = ts = 0.0
    for i in range(n):
        steps = 100 / (per_step * (1 + spread * (-1) ** i))
        t, s, tt, ss, ts = t + 100, s + steps, tt + 1e4, ss + steps * steps, ts + 100 * steps
    return Tally(n, t, s, tt, ss, ts)


def test_a_slice_whose_requests_agree_is_judged_on_fewer_of_them():
    one = _tally(3.3, 1, 0.0)
    steady = dispersion((one, _tally(3.3, 40, 0.03)))
    varied = dispersion((one, _tally(3.3, 40, 0.6)))
    assert steady is not None and steady < 0.01 and varied == pytest.approx(0.09)
    assert dispersion((one,)) is None  # too few to say
    generic = judge(
        Rung("spec", 4, 1.0, SPEC_STEP, (one,)), STANDARD, min_samples=1, confidence=0.999
    )
    own = judge(
        Rung("spec", 4, 1.0, SPEC_STEP, (one,), dispersion=steady),
        STANDARD,
        min_samples=1,
        confidence=0.999,
    )
    assert generic is not None and own is not None
    assert generic.verdict == 0 and own.verdict == 1  # one healed probe is enough


def test_a_short_probe_says_less_than_a_whole_request():
    """The slice's requests of 100 tokens agree closely; one probe of 16 tokens is a mean
    over five steps, and a lucky one must not bring the slice back alone."""
    whole = _tally(3.3, 40, 0.03)
    steady = dispersion((_tally(3.3, 1, 0.0), whole))
    short = Tally(1, 16, 16 / 3.3, 256, (16 / 3.3) ** 2, 16 * 16 / 3.3)
    probed = Rung("spec", 4, 1.0, SPEC_STEP, (short,), dispersion=steady, dispersion_tokens=100)
    judged = judge(probed, STANDARD, min_samples=1, confidence=0.999)
    assert judged is not None and judged.verdict == 0
    assert judged.ratio == pytest.approx(0.052 / 3.3 / 0.028)
    two = Tally(2, 200, 200 / 3.3, 2e4, 2 * (100 / 3.3) ** 2, 2 * 100 * 100 / 3.3)
    whole_probes = Rung("spec", 4, 1.0, SPEC_STEP, (two,), dispersion=steady, dispersion_tokens=100)
    judged = judge(whole_probes, STANDARD, min_samples=1, confidence=0.999)
    assert judged is not None and judged.verdict == 1


def test_older_requests_do_not_decide_against_the_newest():
    collapsed = _tally(1.6, 3, 0.3)  # a little dearer above, not surely
    healthy = _tally(3.8, 80, 0.05)
    total = Tally(*(getattr(collapsed, f) + getattr(healthy, f) for f in Tally.__slots__))
    above = judge(
        Rung("spec", 4, 1.0, SPEC_STEP, (collapsed, total)),
        STANDARD,
        min_samples=3,
        confidence=0.999,
    )
    assert above is not None and above.verdict == 0  # the newest three lean the other way
    assert above.ratio < 1  # though all of them together say the rung above is cheaper


def test_exploration_leans_with_an_unsure_judge():
    assert leaning(Judgement(0, 1.15, 1.6, 40, "")) == pytest.approx(0.25)  # capped
    assert leaning(Judgement(0, 1.02, 0.3, 40, "")) == pytest.approx(
        round(0.5 * math.erf(0.3 / math.sqrt(2)), 2)
    )
    assert leaning(Judgement(0, 0.9, -0.5, 40, "")) == 0.0  # leans the other way
    assert leaning(Judgement(-1, 1.5, 4.0, 40, "")) == 0.0  # sure: it moves instead


def test_a_slice_leaning_towards_a_pool_never_seen_sends_it_half():
    slight = Judgement(0, 1.2, 0.35, 3, "")  # the prior's doubt: most of it one factor
    assert leaning(slight, unseen=True) == pytest.approx(0.5)
    assert leaning(slight) < 0.25
    assert leaning(Judgement(0, 0.9, -0.4, 3, ""), unseen=True) == 0.0  # leans to stay
    assert leaning(Judgement(-1, 2.3, 4.9, 3, ""), unseen=True) == 0.0  # sure: it moves
