"""The economic judge and its state machine: table cases with injected numbers."""

from __future__ import annotations

import math
import random

import pytest

from policies.compiled import load_policy
from policies.decide import decide
from policies.economics import Judgement, Rung, Tally, exploring, hinges, judge, leaning
from policies.features import Features
from policies.guardrail import ON_START, Economics, Phase, SliceState, step_economic
from policies.model import Guardrail
from policies.steptime import StepTime

SPEC_STEP = StepTime(0.052, 0.0004, 500)
STD_STEP = StepTime(0.028, 0.0004, 500)
CONFIG = Guardrail()


def tally(per_step: float, n: int, tokens: int = 100, noise: float = 0.0, seed: int = 0):
    rng = random.Random(seed)
    t = s = tt = ss = ts = 0.0
    for _ in range(n):
        steps = max(1.0, tokens / (per_step * (1 + rng.gauss(0, noise))))
        t, s = t + tokens, s + steps
        tt, ss, ts = tt + tokens * tokens, ss + steps * steps, ts + tokens * steps
    return Tally(n, t, s, tt, ss, ts)


def spans(per_step: float, *sizes: int, noise: float = 0.1):
    return tuple(tally(per_step, n, noise=noise, seed=n) for n in sizes)


def spec(per_step: float, *sizes: int, noise: float = 0.1) -> Rung:
    return Rung("spec", 4, 1.0, SPEC_STEP, spans(per_step, *sizes, noise=noise))


STANDARD = Rung("standard", None, 1.0, STD_STEP)


def decided(rung: Rung, lower: Rung = STANDARD, **kw):
    return judge(rung, lower, min_samples=3, confidence=0.999, **kw)


def test_three_requests_of_a_clearly_bad_quiet_slice_are_enough():
    judged = decided(spec(1.05, 3))
    assert judged is not None and judged.verdict == -1 and judged.n == 3
    assert judged.ratio == pytest.approx(0.052 / 1.05 / 0.028, rel=0.05)
    assert "spec costs" in judged.reason and "standard" in judged.reason


def test_fewer_than_min_samples_decide_nothing():
    assert decided(spec(1.05, 2)) is None
    assert decided(Rung("spec", 4, 1.0, None, spans(1.05, 3))) is None


def test_a_healthy_slice_near_the_line_stays_and_a_clear_winner_is_confident():
    near = decided(spec(2.0, 3, 12, 48, 200))  # break-even 1.86: 7% cheaper on spec
    assert near is not None and near.verdict in (0, 1) and near.ratio < 1
    clear = decided(spec(3.8, 3))
    assert clear is not None and clear.verdict == 1


def test_the_newest_confident_span_decides():
    # the newest 3 requests collapsed; the 48 before were healthy
    collapsed = Tally(3, 300, 290, 30000, 28100, 29000)
    healthy = tally(3.8, 45, noise=0.1)
    total = Tally(*(a + b for a, b in zip(vars_(collapsed), vars_(healthy), strict=True)))
    judged = decided(Rung("spec", 4, 1.0, SPEC_STEP, (collapsed, total)))
    assert judged is not None and judged.verdict == -1 and judged.n == 3


def vars_(t: Tally):
    return (t.n, t.tokens, t.steps, t.tok_sq, t.step_sq, t.tok_step)


def test_prices_weigh_in():
    dear_std = Rung("standard", None, 3.0, STD_STEP)
    assert decided(spec(1.05, 3), dear_std).verdict == 1  # 3x the price: spec is cheaper


def below(verdict: int, z: float = 5.0):
    return Judgement(verdict, math.exp(z / 10), z, 3, "why")


def test_falls_at_once_and_comes_back_after_the_cooldown_without_probes():
    fallen, event = step_economic("s", ON_START, Economics(below=below(-1)), CONFIG, 10.0)
    assert fallen.offset == 1 and fallen.phase is Phase.FALLEN_BACK and event is not None
    # the load dropped: the rung above is cheaper again on the evidence it still has
    cheaper_above = Economics(above=below(1, -5.0))
    assert step_economic("s", fallen, cheaper_above, CONFIG, 20.0)[1] is None  # cooldown
    back, event = step_economic("s", fallen, cheaper_above, CONFIG, 41.0)
    assert back.offset == 0 and back.phase is Phase.ON and event is not None


def test_probes_are_sized_by_the_loss_they_may_cost_and_by_time():
    fallen = SliceState(1, Phase.FALLEN_BACK, 0.0, 1)
    busy, barely, far = 5.0, Economics(above=below(-1, 0.5), rate=5.0), below(-1, 11.0)
    assert step_economic("s", fallen, barely, CONFIG, 10.0)[1] is None  # cooldown
    probing, event = step_economic("s", fallen, barely, CONFIG, 31.0)
    assert probing.phase is Phase.PROBING and event is not None
    # 1.05x dearer above: the 1% budget buys a fifth of the requests; 3x dearer: half a %
    assert probing.probe_share == pytest.approx(0.01 / (math.exp(0.05) - 1), rel=0.05)
    dear = step_economic("s", fallen, Economics(above=far, rate=busy), CONFIG, 31.0)[0]
    assert dear.probe_share == pytest.approx(0.01 / (math.exp(1.1) - 1), rel=0.05)
    # a quiet slice probes at least once every max_cooldown_s
    quiet = step_economic("s", fallen, Economics(above=far, rate=0.05), CONFIG, 31.0)[0]
    assert quiet.probe_share == pytest.approx(1 / (0.05 * CONFIG.max_cooldown_s), rel=0.05)
    # while probing, the share follows the evidence without an event
    later, event = step_economic("s", dear, Economics(above=below(-1, 0.5), rate=busy), CONFIG, 40)
    assert event is None and later.probe_share > dear.probe_share
    assert later.version == dear.version and later.phase is Phase.PROBING
    # the newest probes cheaper with confidence: back at once
    back, event = step_economic("s", dear, Economics(probes=below(1, -4.0), rate=busy), CONFIG, 32)
    assert back.offset == 0 and back.phase is Phase.ON and event is not None
    assert "cheaper above" in event.reason


POLICY = load_policy(
    """
version: 1
pools:
  spec: {kind: speculative, model: m, num_speculative_tokens: 4, endpoints: ["http://a"]}
  standard: {kind: standard, model: m, endpoints: ["http://b"]}
ladder: [spec, standard]
rules: [{name: default, start: spec}]
"""
)


@pytest.mark.parametrize("clients", [1, 10, 10_000])
def test_probe_share_is_a_share_of_requests_whoever_sends_them(clients):
    probing = SliceState(1, Phase.PROBING, 0.0, 2, probe_share=0.2)
    key = "default / t<=0.3 / ctx<4k"
    n = 4000
    probes = 0
    for i in range(n):
        client = f"key-{i % clients}"
        features = Features(
            "/v1/chat/completions",
            "m",
            temperature=0,
            tenant=client,
            routing_key=client,
            request_id=f"req-{i}",
        )
        probes += decide(features, POLICY, {}, {key: probing}, 0.0).probe
    assert abs(probes / n - 0.2) < 4 * math.sqrt(0.2 * 0.8 / n)


def test_tool_schemas_have_their_own_slices():
    a = Features("/v1/chat/completions", "m", tools=("f",), tools_fingerprint="00000001")
    b = Features("/v1/chat/completions", "m", tools=("f",), tools_fingerprint="00000002")
    keys = {POLICY.slicer.key("default", f) for f in (a, b)}
    assert len(keys) == 2 and all(k.endswith(("tools:01", "tools:02")) for k in keys)
    assert POLICY.slicer.key("default", Features("/v1/chat/completions", "m")).count("/") == 2


def test_exploring_a_pool_is_worth_it_only_where_its_doubt_could_change_a_decision():
    fresh, unlearned = StepTime(0.05, 0.026, 4.0), StepTime(0.05, 0.09, 0.0, learned=False)
    surge = Judgement(0, 1.55, 2.7, 140, "", log_var=0.028)  # the doubt is the standard pool's
    assert hinges(surge, fresh, rate=1.0, cost=4 / 60)
    assert hinges(None, unlearned, rate=1.0, cost=4 / 60)  # never seen: learn it
    at_the_line = Judgement(0, 1.01, 0.3, 90, "", log_var=0.0021)
    assert not hinges(at_the_line, StepTime(0.027, 0.0011, 9.0), rate=1.0, cost=4 / 60)
    own_doubt = Judgement(0, 1.3, 2.0, 3, "", log_var=0.04)  # three requests: their doubt
    assert not hinges(own_doubt, StepTime(0.027, 0.002, 9.0), rate=1.0, cost=4 / 60)
    cheaper_here = Judgement(0, 0.7, -2.0, 90, "", log_var=0.03)
    assert not hinges(cheaper_here, fresh, rate=1.0, cost=4 / 60)
    decided = Judgement(1, 0.5, -4.0, 9, "", log_var=0.03)
    assert not hinges(decided, fresh, rate=1.0, cost=4 / 60)


def test_a_quiet_slice_leaning_below_serves_its_lean_there_and_mirrors_nothing():
    # a long-context slice of one request every 5 s: the pool below looks 15% cheaper, its
    # step there (at the slice's context) the larger part of the doubt
    leans = Judgement(0, 1.15, 1.6, 50, "", log_var=0.008)
    below = StepTime(0.038, 0.006, 4.0)
    assert exploring(leans, below, rate=0.2, live=True, cost=4 / 60) == (False, 0.25)
    # mirrored, the same knowledge is not worth four whole requests a minute
    assert exploring(leans, below, rate=0.2, live=False, cost=4 / 60) == (False, 0.0)
    # a busy slice would pay for mirrors: the pool's budget
    assert exploring(leans, below, rate=5.0, live=False, cost=4 / 60) == (True, 0.0)
    at_the_line = Judgement(0, 1.0, 0.0, 90, "", log_var=0.0021)
    assert exploring(at_the_line, below, rate=5.0, live=True, cost=4 / 60) == (True, 0.0)
    assert exploring(at_the_line, below, rate=0.2, live=True, cost=4 / 60) == (False, 0.0)


@pytest.mark.parametrize("live", [True, False])
def test_an_explored_request_is_served_below_when_live_and_mirrored_otherwise(live):
    state = SliceState(explore=1.0, explore_live=live)
    key = "default / t<=0.3 / ctx<4k"
    features = Features("/v1/chat/completions", "m", temperature=0, request_id="r-1")
    decision = decide(features, POLICY, {}, {key: state}, 0.0)
    assert "learn its step time" in decision.reason
    if live:
        assert decision.pool == "standard" and decision.shadow_to is None
    else:
        assert decision.pool == "spec" and decision.shadow_to == "standard"
        assert decision.shadow_tokens == CONFIG.probe_tokens  # steps to time, no more


def test_a_slice_leaning_towards_a_pool_not_yet_learned_serves_half_there_where_it_pays():
    leans = Judgement(0, 1.25, 0.4, 3, "", log_var=0.3)  # the prior's doubt: one factor
    unseen = StepTime(0.05, 0.3, 1.0, learned=False)  # one observation: not yet learned
    # a summary, prefilled whole wherever it goes: half of it there
    assert exploring(leans, unseen, rate=0.4, live=True, cost=4 / 60, prefill=0.0) == (
        False,
        0.5,
    )
    # a conversation's turn, cached at home: re-prefilled there for more than a fifth of its
    # decode cost (1 - 1 / 1.25 is what the point estimate saves): the usual lean
    turn = exploring(leans, unseen, rate=0.4, live=True, cost=4 / 60, prefill=0.6)
    assert turn == (False, leaning(leans))
    assert 0 < turn[1] < 0.25
    assert exploring(leans, unseen, rate=0.4, live=True, cost=4 / 60)[1] == leaning(leans)
    # learned: the usual lean whatever the prefill
    learned = StepTime(0.05, 0.02, 6.0)
    assert exploring(leans, learned, rate=0.4, live=True, cost=4 / 60, prefill=0.0)[1] < 0.25
    # mirrors only: nothing served there
    assert exploring(leans, unseen, rate=0.4, live=False, cost=4 / 60, prefill=0.0) == (
        True,
        0.0,
    )
