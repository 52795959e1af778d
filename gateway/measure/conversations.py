"""What a slice's conversations are like, for the price of moving one between pools
(``policies/moves.py``): how many turns they have left, and how many output tokens a turn
takes. Each replica learns from the requests it sees. O(1) per request and per outcome
(``turns_left`` is O(``MAX_TURNS``), asked only of a request whose move is priced); never
awaits; time is an argument.

A conversation is its opening's hash (``PromptHashes.opening``: the system prompt and the
first user message, the same for each of its turns), and a request's turn is the model's
replies in its prompt plus one: no client cooperation. Output tokens per turn are the mean
of the slice's answers' completion tokens, decayed so that the mean follows the traffic.

Turns left are a survival estimate, because a conversation's end is never announced. Most
conversations are under way when a move is priced, and all that is known of one is the
turn it has reached: counted as if it ended there, every conversation would look as if it
were at its end, and none would ever be worth moving. So a conversation under way counts
as censored (Kaplan-Meier): at risk at every turn it reached, ended at none. It is presumed
ended once it has been idle for ``IDLE_GAPS`` times the slice's mean gap between a
conversation's turns (decayed), and comes back to life if it sends another turn. Per turn
``j`` the hazard that a conversation that reached it goes no further is

    h_j = (ended at j + lam) / (reached j or beyond + 1)

with ``lam`` the slice's pooled hazard, (ends + 1) / (turns at risk + 1), as the prior of
one pseudo-conversation at each turn: turns where many conversations are at risk follow
their own ends, and turns beyond any seen follow the pool (with no end seen yet, about as
many turns again as the slice's conversations have run in all). Then

    turns_left(t) = sum over k >= 1 of prod_{j=t}^{t+k-1} (1 - h_j)

the expected number of turns after ``t``, counted up to ``MAX_TURNS``. Bounded: at most
``max_conversations`` conversations under way and as many presumed ended remembered (over
the bound, the longest idle of the slice is presumed ended, and the oldest ended
forgotten; the histograms keep what they reached), and ``max_slices`` slices.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

MAX_TURNS = 256
MIN_CONVERSATIONS = 5  # fewer than this seen in the slice: no estimate
DECAY = 0.02  # each new value's weight in a decayed mean (output tokens, gaps)
IDLE_GAPS = 4.0  # idle this many mean gaps between turns: presumed ended
_NEGLIGIBLE = 1e-4  # a chance of going on this small ends the sum


@dataclass(slots=True)
class _Slice:
    reached: list[int] = field(default_factory=lambda: [0] * (MAX_TURNS + 1))
    ended: list[int] = field(default_factory=lambda: [0] * (MAX_TURNS + 1))
    active: OrderedDict[int, tuple[int, float]] = field(default_factory=OrderedDict)
    gone: OrderedDict[int, int] = field(default_factory=OrderedDict)
    gap_s: float | None = None
    tokens_per_turn: float | None = None


class Conversations:
    """Turns left per conversation and output tokens per turn, per slice."""

    def __init__(self, max_conversations: int = 50_000, max_slices: int = 1_000) -> None:
        self._max = max_conversations
        self._max_slices = max_slices
        self._active = 0  # conversations under way, over every slice
        self._gone = 0
        self._slices: OrderedDict[str, _Slice] = OrderedDict()

    def saw(self, slice_key: str, opening: int, turn: int, now: float) -> None:
        """A request of ``slice_key`` at ``turn`` of the conversation ``opening`` opens at
        ``now``."""
        turn = min(max(turn, 1), MAX_TURNS)
        entry = self._slice(slice_key)
        self._end_idle(entry, now)
        before, last = self._take(entry, opening)
        if turn > before:
            if before:
                entry.reached[before] -= 1
            entry.reached[turn] += 1
            if last is not None:
                entry.gap_s = _decayed(entry.gap_s, max(now - last, 0.0))
            last = now
        entry.active[opening] = (max(before, turn), now if last is None else last)
        self._active += 1
        self._bound(entry)

    def answered(self, slice_key: str, completion_tokens: int) -> None:
        """One of the slice's answers (a turn) took ``completion_tokens``."""
        entry = self._slice(slice_key)
        entry.tokens_per_turn = _decayed(entry.tokens_per_turn, float(completion_tokens))

    def turns_left(self, slice_key: str, turn: int) -> float | None:
        """The turns a conversation of the slice at ``turn`` has after it, expected."""
        entry = self._slices.get(slice_key)
        at_risk = _suffix_sums(entry.reached) if entry is not None else [0]
        if entry is None or at_risk[0] < MIN_CONVERSATIONS:
            return None
        turn = min(max(turn, 1), MAX_TURNS)
        pooled = (sum(entry.ended) + 1.0) / (sum(at_risk[1:]) + 1.0)
        left, going = 0.0, 1.0
        for j in range(turn, MAX_TURNS):
            going *= 1.0 - min((entry.ended[j] + pooled) / (at_risk[j] + 1.0), 1.0)
            left += going
            if going < _NEGLIGIBLE:
                break
        return left

    def tokens_per_turn(self, slice_key: str) -> float | None:
        entry = self._slices.get(slice_key)
        return None if entry is None else entry.tokens_per_turn

    def _take(self, entry: _Slice, opening: int) -> tuple[int, float | None]:
        """Forget ``opening`` where it is kept: the turn it reached (0: new) and when it
        was last seen at a new turn (None: not known)."""
        if opening in entry.active:
            self._active -= 1
            return entry.active.pop(opening)
        if opening in entry.gone:  # presumed ended, and back
            self._gone -= 1
            turn = entry.gone.pop(opening)
            entry.ended[turn] -= 1
            return turn, None
        return 0, None

    def _end_idle(self, entry: _Slice, now: float) -> None:
        """Presume ended the slice's conversations idle for ``IDLE_GAPS`` mean gaps."""
        if entry.gap_s is None:
            return
        idle = IDLE_GAPS * entry.gap_s
        while entry.active:
            opening, (turn, last) = next(iter(entry.active.items()))
            if now - last <= idle:
                return
            self._end(entry, opening, turn)

    def _end(self, entry: _Slice, opening: int, turn: int) -> None:
        del entry.active[opening]
        self._active -= 1
        entry.ended[turn] += 1
        entry.gone[opening] = turn
        self._gone += 1
        if self._gone > self._max:
            entry.gone.popitem(last=False)
            self._gone -= 1

    def _bound(self, entry: _Slice) -> None:
        """Over the bound, the longest idle conversation (of this slice where it has another)
        is presumed ended."""
        while self._active > self._max:
            others = (s for s in self._slices.values() if s.active)
            victim = entry if len(entry.active) > 1 else next(others)
            opening, (turn, _) = next(iter(victim.active.items()))
            self._end(victim, opening, turn)

    def _slice(self, slice_key: str) -> _Slice:
        entry = self._slices.pop(slice_key, None) or _Slice()
        self._slices[slice_key] = entry
        if len(self._slices) > self._max_slices:
            _, dropped = self._slices.popitem(last=False)
            self._active -= len(dropped.active)
            self._gone -= len(dropped.gone)
        return entry


def _decayed(mean: float | None, value: float) -> float:
    return value if mean is None else mean + DECAY * (value - mean)


def _suffix_sums(counts: list[int]) -> list[int]:
    """``out[j]``: the sum of ``counts[j:]`` (conversations that reached ``j`` or beyond)."""
    out = [0] * (len(counts) + 1)
    for j in range(len(counts) - 1, -1, -1):
        out[j] = out[j + 1] + counts[j]
    return out
