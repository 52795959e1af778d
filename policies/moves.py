"""The price of moving a conversation between pools. Pure; no I/O, no clock.

A conversation resends its history every turn, and the engine that served the turns before
holds that history in its prefix cache. When its slice's rung changes, a new conversation
follows the rung at once (it has nothing cached anywhere), but moving one already cached on
another pool lands it on a cold cache: the new pool prefills its whole context again. It
moves only when what it saves over the turns it has left pays for that:

    saving    = (turns_left + 1) x tokens_per_turn x (decode_old - decode_new)
                + turns_left x context x (lost_old x prefill_old - lost_new x prefill_new)
    reprefill = context x cached_share x prefill_new

with ``decode_*`` each pool's endpoint-seconds per output token at its load (what the
economic guardrail compares, ``policies/economics.py``), ``prefill_new`` the new pool's
seconds per prompt token prefilled (the ``c`` of its step time, ``policies/steptime.py``),
``context`` the prompt's tokens and ``cached_share`` the part of it the old pool holds and
the new one does not;
``turns_left`` and ``tokens_per_turn`` are learned from the slice's conversations
(``gateway/measure/conversations.py``). The turn at hand counts: it is decoded on
whichever pool is chosen. ``lost_*`` is the share of what each pool is sent that it does
not keep until the next turn (``gateway/measure/load.py``, ``kept``): an engine short of
memory evicts conversations between their turns and re-prefills them, so every later turn
pays that much of its context again where it runs, and a conversation stays where memory
keeps it rather than join a pool that thrashes. Without a price for either side (no step
times yet, no turns seen) the conversation follows its rung, as it did before prices
existed.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Conversation:
    """One request's conversation, as the gateway sees it: ``context`` prompt tokens, of
    which ``cached_share`` is held on pool ``held_on`` and not on the pool it would move to;
    ``turns_left`` and ``tokens_per_turn`` as its slice's conversations go (None when not
    learned yet)."""

    held_on: str
    context: int
    cached_share: float
    turns_left: float | None
    tokens_per_turn: float | None
    lost: dict[str, float] = field(default_factory=dict)  # per pool; 0 where not given


@dataclass(frozen=True, slots=True)
class MovePrice:
    """Whether the conversation moves to ``to`` and the figures that decided it."""

    move: bool
    held_on: str
    to: str
    reprefill_tokens: int
    reprefill_s: float | None
    saving_s: float | None
    memory_s: float = 0.0  # of ``saving_s``, the later turns' re-prefills spared (< 0: added)

    @property
    def reason(self) -> str:
        if self.reprefill_s is None or self.saving_s is None:
            return f"moved from {self.held_on}: no price known for moving it yet"
        prefill = f"{self.reprefill_tokens:,} tokens (~{_seconds(self.reprefill_s)})"
        decode, memory = self.saving_s - self.memory_s, self.memory_s
        parts = [f"~{_seconds(decode)} of decode saving"] if decode > 0 else []
        if memory > 0:
            parts.append(f"~{_seconds(memory)} of re-prefills spared where memory is short")
        saving = " and ".join(parts) or "no decode saving"
        if memory < 0:
            saving += f", less ~{_seconds(-memory)} of re-prefills where memory is short"
        if self.move:
            return f"moved from {self.held_on}: re-prefilling {prefill} is paid by {saving}"
        return f"kept on {self.held_on}: moving would re-prefill {prefill} for {saving}"


def price_move(
    conversation: Conversation,
    to: str,
    decode_s_per_token: dict[str, float],
    prefill_s_per_token: dict[str, float],
) -> MovePrice:
    """Move ``conversation`` to pool ``to``, or keep it where its cache is."""
    held_on = conversation.held_on
    tokens = round(conversation.context * min(max(conversation.cached_share, 0.0), 1.0))
    old, new = decode_s_per_token.get(held_on), decode_s_per_token.get(to)
    prefill = prefill_s_per_token.get(to)
    turns, per_turn = conversation.turns_left, conversation.tokens_per_turn
    if old is None or new is None or prefill is None or turns is None or per_turn is None:
        return MovePrice(True, held_on, to, tokens, None, None)
    lost = conversation.lost
    before = lost.get(held_on, 0.0) * prefill_s_per_token.get(held_on, prefill)
    memory = turns * conversation.context * (before - lost.get(to, 0.0) * prefill)
    saving = (turns + 1.0) * per_turn * (old - new) + memory
    reprefill = tokens * prefill
    return MovePrice(saving > reprefill, held_on, to, tokens, reprefill, saving, memory)


def _seconds(value: float) -> str:
    size = abs(value)
    if size < 1.0:
        return f"{value * 1000:.0f} ms"
    return f"{value:.1f} s" if size < 10.0 else f"{value:,.0f} s"
