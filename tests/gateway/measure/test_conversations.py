"""What a slice's conversations are like: turns left learned from how far its
conversations went (recognised by their opening, one count per conversation however many
times a turn is seen), output tokens per turn from its answers; bounded."""

from __future__ import annotations

import pytest

from gateway.measure.conversations import MIN_CONVERSATIONS, Conversations


def test_turns_left_is_the_mean_of_how_far_conversations_went_past_a_turn():
    seen = Conversations()
    for opening, length in enumerate([2, 4, 4, 6, 10]):
        for turn in range(1, length + 1):
            seen.saw("s", opening, turn)
            seen.saw("s", opening, turn)  # a retry counts once
    assert seen.turns_left("s", 1) == pytest.approx((1 + 3 + 3 + 5 + 9) / 5)
    assert seen.turns_left("s", 3) is None  # only four went that far
    assert seen.turns_left("other", 1) is None


def test_a_conversation_counts_once_at_the_furthest_turn_seen():
    seen = Conversations()
    for opening in range(MIN_CONVERSATIONS):
        seen.saw("s", opening, 5)
        seen.saw("s", opening, 3)  # an older turn resent: no change
    assert seen.turns_left("s", 5) == 0.0
    assert seen.turns_left("s", 2) == 3.0


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
        seen.saw(f"s{opening % 5}", opening, 1)
    assert len(seen._seen) == 10 and len(seen._slices) == 3
