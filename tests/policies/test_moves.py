"""The price of moving a cached conversation to its slice's new rung: it moves when the
decode saving over its turns left (and the re-prefills spared where memory is short) pays
for re-prefilling its context there, is kept where its cache is otherwise, and follows the
rung while no price is known; the reason says the figures."""

from __future__ import annotations

import pytest

from policies.moves import Conversation, price_move

DECODE = {"spec": 0.010, "standard": 0.012}  # endpoint-seconds per output token
PREFILL = {"spec": 0.00008, "standard": 0.00007}  # seconds per prompt token prefilled


def agent(
    context: int, turns_left: float | None = 3.0, per_turn: float | None = 50.0
) -> Conversation:
    return Conversation("spec", context, 1.0, turns_left, per_turn)


def test_a_long_context_with_few_turns_left_stays_where_it_is_cached():
    price = price_move(agent(31_200), "standard", {"spec": 0.012, "standard": 0.010}, PREFILL)
    assert not price.move
    assert price.reprefill_tokens == 31_200
    assert price.reprefill_s == pytest.approx(31_200 * 0.00007)
    assert price.saving_s == pytest.approx(4 * 50 * 0.002)
    assert price.reason == (
        "kept on spec: moving would re-prefill 31,200 tokens (~2.2 s) for ~400 ms of decode saving"
    )


def test_it_moves_when_the_turns_left_pay_for_the_re_prefill():
    price = price_move(
        agent(2_000, turns_left=30, per_turn=400),
        "standard",
        {"spec": 0.05, "standard": 0.01},
        PREFILL,
    )
    assert price.move
    assert price.reason.startswith(
        "moved from spec: re-prefilling 2,000 tokens (~140 ms) is paid by"
    )


def test_only_the_cached_share_is_re_prefilled_for_the_move():
    cold = Conversation("spec", 40_000, 0.25, 3.0, 50.0)
    price = price_move(cold, "standard", DECODE, PREFILL)
    assert price.reprefill_tokens == 10_000


def test_no_saving_keeps_it():
    price = price_move(agent(5_000), "standard", DECODE, PREFILL)  # standard is dearer
    assert not price.move and price.saving_s is not None and price.saving_s < 0
    assert price.reason.endswith("for no decode saving")


def test_a_pool_that_keeps_little_of_what_it_is_sent_costs_its_later_turns_re_prefills():
    # standard decodes for less, but evicts half of what it is sent between turns: three
    # more turns there re-prefill half their 8,000 tokens each, where spec keeps them
    thrashing = Conversation("spec", 8_000, 1.0, 3.0, 100.0, {"standard": 0.5, "spec": 0.0})
    decode = {"spec": 0.012, "standard": 0.010}
    assert price_move(agent(8_000, per_turn=100.0), "standard", decode, PREFILL).move
    price = price_move(thrashing, "standard", decode, PREFILL)
    assert not price.move
    assert price.memory_s == pytest.approx(-3 * 8_000 * 0.5 * 0.00007)
    assert price.reason == (
        "kept on spec: moving would re-prefill 8,000 tokens (~560 ms) for ~800 ms of decode "
        "saving, less ~840 ms of re-prefills where memory is short"
    )
    # and the other way round: leaving a pool that evicts spares them
    leaving = Conversation("spec", 8_000, 1.0, 3.0, 100.0, {"spec": 0.5})
    price = price_move(leaving, "standard", {"spec": 0.01, "standard": 0.01}, PREFILL)
    assert price.move and price.memory_s == pytest.approx(3 * 8_000 * 0.5 * 0.00008)
    assert price.reason == (
        "moved from spec: re-prefilling 8,000 tokens (~560 ms) is paid by ~960 ms of "
        "re-prefills spared where memory is short"
    )


@pytest.mark.parametrize(
    "conversation, decode, prefill",
    [
        (agent(9_000, turns_left=None), DECODE, PREFILL),
        (agent(9_000, per_turn=None), DECODE, PREFILL),
        (agent(9_000), {"standard": 0.01}, PREFILL),
        (agent(9_000), DECODE, {"spec": 0.0001}),
    ],
)
def test_without_a_price_it_follows_the_rung(conversation, decode, prefill):
    price = price_move(conversation, "standard", decode, prefill)
    assert price.move and price.reprefill_s is None
    assert price.reason == "moved from spec: no price known for moving it yet"
