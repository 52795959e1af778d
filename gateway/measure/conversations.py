"""What a slice's conversations are like, for the price of moving one between pools
(``policies/moves.py``): how many turns they run to, and how many output tokens a turn
takes. Each replica learns from the requests it sees. O(1) per request and per outcome;
never awaits.

A conversation is its opening's hash (``PromptHashes.opening``: the system prompt and the
first user message, the same for each of its turns), and a request's turn is the model's
replies in its prompt plus one: no client cooperation. Per slice, the furthest turn each
conversation was seen at is kept in a histogram (turns above ``MAX_TURNS`` in its last
bin); ``turns_left(t)`` is the mean, over the slice's conversations that reached turn
``t``, of the turns they went on after it (conversations still under way count with
what they reached so far). Output tokens per turn are the mean of the slice's answers'
completion tokens, decayed so that the mean follows the traffic. Bounded: at most
``max_conversations`` conversations remembered (the least recently seen forgotten; what
they reached stays in the histogram) and ``max_slices`` slices.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

MAX_TURNS = 256
MIN_CONVERSATIONS = 5  # fewer than this reached the turn: no estimate
DECAY = 0.02  # each answer's weight in the mean output tokens per turn


@dataclass(slots=True)
class _Slice:
    reached: list[int] = field(default_factory=lambda: [0] * (MAX_TURNS + 1))
    tokens_per_turn: float | None = None


class Conversations:
    """Turns per conversation and output tokens per turn, per slice."""

    def __init__(self, max_conversations: int = 50_000, max_slices: int = 1_000) -> None:
        self._max = max_conversations
        self._max_slices = max_slices
        self._seen: OrderedDict[tuple[str, int], int] = OrderedDict()
        self._slices: OrderedDict[str, _Slice] = OrderedDict()

    def saw(self, slice_key: str, opening: int, turn: int) -> None:
        """A request of ``slice_key`` at ``turn`` of the conversation ``opening`` opens."""
        turn = min(max(turn, 1), MAX_TURNS)
        key = (slice_key, opening)
        before = self._seen.pop(key, 0)
        self._seen[key] = max(before, turn)
        if len(self._seen) > self._max:
            self._seen.popitem(last=False)
        if turn <= before:
            return
        reached = self._slice(slice_key).reached
        if before:
            reached[before] -= 1
        reached[turn] += 1

    def answered(self, slice_key: str, completion_tokens: int) -> None:
        """One of the slice's answers (a turn) took ``completion_tokens``."""
        entry = self._slice(slice_key)
        was = entry.tokens_per_turn
        entry.tokens_per_turn = (
            float(completion_tokens) if was is None else was + DECAY * (completion_tokens - was)
        )

    def turns_left(self, slice_key: str, turn: int) -> float | None:
        """The turns a conversation of the slice at ``turn`` has left, on the mean."""
        entry = self._slices.get(slice_key)
        if entry is None:
            return None
        turn = min(max(turn, 1), MAX_TURNS)
        tail = entry.reached[turn:]
        count = sum(tail)
        if count < MIN_CONVERSATIONS:
            return None
        return sum(i * n for i, n in enumerate(tail)) / count

    def tokens_per_turn(self, slice_key: str) -> float | None:
        entry = self._slices.get(slice_key)
        return None if entry is None else entry.tokens_per_turn

    def _slice(self, slice_key: str) -> _Slice:
        entry = self._slices.pop(slice_key, None) or _Slice()
        self._slices[slice_key] = entry
        if len(self._slices) > self._max_slices:
            self._slices.popitem(last=False)
        return entry
