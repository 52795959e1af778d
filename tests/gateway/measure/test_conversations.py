"""What a slice's conversations are like: turns left as a survival estimate over how far
its conversations went (recognised by their opening, one count per conversation however
many times a turn is seen; one under way counts as censored, one idle for a few of the
slice's gaps as ended), output tokens per turn from its answers; bounded."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.measure.conversations import IDLE_GAPS, MAX_TURNS, MIN_CONVERSATIONS, Conversations


def _run(seen: Conversations, lengths: list[int], start: float = 0.0, gap: float = 1.0) -> float:
    """Conversations of ``lengths`` turns, one after another, ``gap`` seconds between
    turns; the clock after the last."""
    now = start
    for opening, length in enumerate(lengths):
        for turn in range(1, length + 1):
            seen.saw("s", opening, turn, now)
            seen.saw("s", opening, turn, now)  # a retry counts once
            now += gap
    return now


def test_ended_conversations_give_the_mean_of_how_far_they_went_past_a_turn():
    seen = Conversations()
    now = _run(seen, [2, 4, 4, 6, 10])
    seen.saw("s", 99, 1, now + 10 * IDLE_GAPS)  # long after: every one presumed ended
    # Ends at 2, 4, 4, 6, 10 (and 99 under way at 1): about 1 + 3 + 3 + 5 + 9 over five
    # from the first turn, a little more for the prior's pseudo-conversations.
    assert seen.turns_left("s", 1) == pytest.approx(21 / 5, rel=0.15)
    assert seen.turns_left("s", 7) == pytest.approx(3.0, rel=0.3)  # only the ten-turn one
    assert seen.turns_left("other", 1) is None


def test_conversations_under_way_are_not_taken_for_ended():
    """Five conversations at their fifth turn, none idle: a plain mean says none has a turn
    left; they have reached five turns and are going on."""
    seen = Conversations()
    for turn in range(1, 6):
        for opening in range(MIN_CONVERSATIONS):
            seen.saw("s", opening, turn, float(turn))
    assert seen.turns_left("s", 5) > 5.0
    for opening in range(MIN_CONVERSATIONS):  # the same five, ended: no turn left
        seen.saw("s", opening, 5, 5.0)
    seen.saw("s", 99, 1, 5.0 + 10 * IDLE_GAPS)
    assert seen.turns_left("s", 5) < 1.0


def test_a_conversation_presumed_ended_comes_back():
    seen = Conversations()
    now = _run(seen, [3] * MIN_CONVERSATIONS)
    later = now + 10 * IDLE_GAPS
    seen.saw("s", 99, 1, later)
    ended = seen.turns_left("s", 3)
    for opening in range(MIN_CONVERSATIONS):
        seen.saw("s", opening, 4, later)
    assert ended is not None and seen.turns_left("s", 3) > ended + 1.0


def test_a_conversation_counts_once_at_the_furthest_turn_seen():
    seen, once = Conversations(), Conversations()
    for opening in range(MIN_CONVERSATIONS):
        seen.saw("s", opening, 5, 0.0)
        seen.saw("s", opening, 3, 0.0)  # an older turn resent: no change
        once.saw("s", opening, 5, 0.0)
    assert seen.turns_left("s", 2) == once.turns_left("s", 2)


def test_output_tokens_per_turn_follow_the_answers():
    seen = Conversations()
    assert seen.tokens_per_turn("s") is None
    seen.answered("s", 100)
    assert seen.tokens_per_turn("s") == 100.0
    for _ in range(500):
        seen.answered("s", 300)
    assert seen.tokens_per_turn("s") == pytest.approx(300.0, rel=0.01)


def test_memory_is_bounded():
    seen = Conversations(max_conversations=10, max_slices=3)
    for opening in range(100):
        seen.saw(f"s{opening % 5}", opening, 1, float(opening))
        seen.saw(f"s{opening % 5}", opening, 2, float(opening) + 0.5)
    live = seen._slices.values()
    assert len(seen._slices) == 3
    assert sum(len(s.active) for s in live) <= 10 and sum(len(s.gone) for s in live) <= 10
    assert seen._active == sum(len(s.active) for s in live)


@settings(max_examples=60)
@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.integers(0, 20), st.integers(-2, 400), st.floats(0, 50)),
        max_size=60,
    )
)
def test_any_sequence_of_turns_gives_a_bounded_estimate(seen_turns):
    """Whatever order turns arrive in, and however far they claim to be: turns left stay
    between 0 and ``MAX_TURNS``, and what is kept stays within its bounds."""
    seen, now = Conversations(max_conversations=8, max_slices=2), 0.0
    for slice_no, opening, turn, gap in seen_turns:
        now += gap
        seen.saw(f"s{slice_no}", opening, turn, now)
        left = seen.turns_left(f"s{slice_no}", turn)
        assert left is None or 0.0 <= left <= MAX_TURNS
    live = seen._slices.values()
    assert seen._active == sum(len(s.active) for s in live) <= 8
    assert seen._gone == sum(len(s.gone) for s in live) <= 8
    assert all(min(s.reached) >= 0 and min(s.ended) >= 0 for s in live)
