"""Part of step 4 (decide): whether a conversation cached on one pool follows its slice's
rung to another (``policies/moves.py`` prices it). Reads the prefix map's answer for the
request (``Affinity.held``), the pools, the guardrail's step-time views and what the
slice's conversations are like; changes nothing but the decision it returns.

Only a request whose conversation an endpoint of another pool of its ladder was sent is
priced: a new conversation follows the rung at once, and so do a pinned request, a probe
sent up the ladder, an experiment's request and one whose cached pool has no endpoint in
service. A first turn is new even where its whole prompt was sent before (a template's
opening, a prompt sent again): prefilled once on the new pool, it is cached there for every
request that opens alike, where pricing each would keep them all on the old one. A request
that carries a mirrored probe of the rung above is priced like the rest: kept on the pool
the probe is for, it is the probe itself, served on its warm cache, and no mirror
re-prefills its conversation there.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from enum import StrEnum
from typing import Protocol

from backends.placement import Affinity
from gateway.measure.conversations import Conversations
from gateway.prompt.prints import BLOCK_BYTES
from policies.decision import Decision
from policies.features import Features
from policies.moves import Conversation, price_move


class Moved(StrEnum):
    """What became of a cached conversation whose slice is served elsewhere (a bounded
    metric label)."""

    MOVED = "moved"  # the saving pays for the re-prefill
    KEPT = "kept"  # it does not: served where its cache is
    UNPRICED = "unpriced"  # no price known yet: it followed the rung


class Member(Protocol):
    @property
    def pool(self) -> str: ...


class Pools(Protocol):
    """Where each endpoint is and whether a pool serves (``backends.pool.Pools``, or a
    replay's cluster)."""

    def endpoint(self, url: str) -> Member | None: ...

    def healthy(self, pool: str) -> bool: ...

    def urls(self, rungs: Sequence[str]) -> list[str]: ...


class Prices(Protocol):
    """The guardrail's per-pool prices of a slice (``gateway/measure/views.py``)."""

    def seconds_per_token(self, key: str, now: float) -> dict[str, float]: ...

    def prefill_seconds_per_token(self, key: str, now: float) -> dict[str, float]: ...


def keep_or_move(
    decision: Decision,
    features: Features,
    affinity: Affinity,
    pools: Pools,
    views: Prices,
    conversations: Conversations,
    now: float,
    kept: Callable[[str], float] = lambda _: 1.0,
) -> tuple[Decision, Moved | None, str]:
    """The decision, kept on the pool that holds the conversation when moving costs more
    than it saves; what happened (None: nothing to price) and the pool it was held on.
    ``kept``: the share of what the prefix map believes an endpoint holds that its answers
    lately found cached (``LoadMeter.kept``), which weighs each endpoint's blocks."""
    held = _held_by_pool(affinity, pools, kept)
    mirrored = decision.shadow_to is not None and decision.shadow_to != decision.pool
    if not held or features.prompt.turn <= 1 or (decision.probe and not mirrored) or decision.arm:
        return decision, None, ""
    old, blocks = max(held.items(), key=lambda item: item[1])
    if old == decision.pool or old not in decision.rungs or not pools.healthy(old):
        return decision, None, ""
    prompt = features.prompt
    cold = blocks - _held_on(affinity, pools, decision.pool, kept)
    if cold <= 0 or prompt.size <= 0:
        return decision, None, ""
    conversation = Conversation(
        held_on=old,
        context=features.prompt_tokens,
        cached_share=min(cold * BLOCK_BYTES / prompt.size, 1.0),
        turns_left=conversations.turns_left(decision.slice, prompt.turn),
        tokens_per_turn=conversations.tokens_per_turn(decision.slice),
        lost={pool: _lost(pools, pool, kept) for pool in (old, decision.pool)},
    )
    decode = views.seconds_per_token(decision.slice, now)
    prefill = views.prefill_seconds_per_token(decision.slice, now)
    price = price_move(conversation, decision.pool, decode, prefill)
    if price.move:
        how = Moved.MOVED if price.saving_s is not None else Moved.UNPRICED
        return dataclasses.replace(decision, reason=f"{decision.reason}; {price.reason}"), how, old
    rungs = (old, *(r for r in decision.rungs if r != old))
    stays = dataclasses.replace(decision, pool=old, rungs=rungs, reason=price.reason)
    if decision.probe and old == decision.shadow_to:  # served where the probe looks
        stays = dataclasses.replace(stays, shadow_to=None, shadow_tokens=None)
    return stays, Moved.KEPT, old


def _held_by_pool(
    affinity: Affinity, pools: Pools, kept: Callable[[str], float]
) -> dict[str, float]:
    """Pool -> the most blocks of the prompt an endpoint of it holds, as far as it keeps
    what it is sent, of the pools with an endpoint that was sent this conversation."""
    out: dict[str, float] = {}
    for url in affinity.holders:
        endpoint = pools.endpoint(url)
        if endpoint is not None:
            blocks = affinity.held.get(url, 0) * kept(url)
            out[endpoint.pool] = max(out.get(endpoint.pool, 0.0), blocks)
    return out


def _lost(pools: Pools, pool: str, kept: Callable[[str], float]) -> float:
    """The share of what ``pool``'s endpoints are sent that they do not keep, on average."""
    urls = pools.urls([pool])
    return 1.0 - sum(kept(url) for url in urls) / len(urls) if urls else 0.0


def _held_on(affinity: Affinity, pools: Pools, pool: str, kept: Callable[[str], float]) -> float:
    """The most blocks of the prompt an endpoint of ``pool`` holds (its system prompt, say),
    as far as it keeps what it is sent."""
    return max(
        (
            blocks * kept(url)
            for url, blocks in affinity.held.items()
            if (endpoint := pools.endpoint(url)) is not None and endpoint.pool == pool
        ),
        default=0.0,
    )
