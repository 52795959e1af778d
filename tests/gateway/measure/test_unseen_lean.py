"""A slice leaning towards a pool below that no slice has been served on, driven through
``LiveStats`` with injected time: a long prompt prefilled whole wherever it goes serves half
its requests there until that pool is learned; a conversation's turn, cached at home, keeps
the usual lean, since below it would prefill its history again."""

from __future__ import annotations

import pytest

from gateway.measure.acceptance import Labels, Outcome, Signal, Status
from gateway.measure.livestats import LiveStats
from policies.compiled import load_policy
from policies.economics import LEAN_MAX, LEAN_UNSEEN
from policies.speedup import expected_tokens_per_step

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
KEY = "default / t<=0.3 / ctx>=16k"
PROMPT = 20_000
TOKENS = 97


def outcome(cached: int | None) -> Outcome:
    """A request of 96 decode tokens on the speculative pool at a per-token acceptance of
    0.15 (about 1.2 tokens a step), its step 60 ms, ``cached`` of its prompt's tokens held
    by the endpoint's cache (None: the answer did not say)."""
    per_step = expected_tokens_per_step(0.15, 4)
    steps = round((TOKENS - 1) / per_step)
    step_s = 0.06
    labels = Labels("m", "default", KEY, "spec", 4)
    return Outcome(
        labels,
        Status.OK,
        0.0,
        steps * step_s + 0.5,
        0.5,
        step_s,
        PROMPT,
        TOKENS,
        steps + 1,
        Signal.PER_REQUEST,
        drafted=4 * steps,
        accepted=TOKENS - 1 - steps,
        steps=steps,
        decode_s=steps * step_s,
        load=1.5,
        cached_tokens=cached,
    )


def explored(cached: int | None) -> tuple[float, bool]:
    stats = LiveStats(lambda: POLICY, load=lambda model, now: 1.5)
    for i in range(6):
        stats.record(outcome(cached), 10.0 + 4.0 * i)
    state = stats.guards[KEY]
    assert state.offset == 0  # the judge is not sure yet: the pool below is a prior
    return state.explore, state.explore_live


@pytest.mark.parametrize("cached", [0, None])
def test_a_long_prompt_prefilled_whole_serves_half_its_requests_below(cached):
    assert explored(cached) == (LEAN_UNSEEN, True)


def test_a_conversations_turns_cached_at_home_keep_the_usual_lean():
    share, live = explored(PROMPT - 500)  # below, it would prefill 19,500 tokens again
    assert live and 0.0 < share <= LEAN_MAX
