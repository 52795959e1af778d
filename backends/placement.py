"""Which endpoint of a pool a request goes to first: the one most likely to hold the
longest prefix of its prompt in its cache, under a load bound. Pure; no I/O, no clock
(the caller passes each endpoint's slow-start weight).

The caller knows, from what the gateway sent where (``gateway/state/prefixes.py``), how
many blocks of the prompt's chain each endpoint is believed to hold (``Affinity.held``),
and which endpoints were sent this conversation (``Affinity.holders``: its opening, the
system prompt and first user message, exactly, or blocks of it beyond the opening).

1. **The load bound.** An endpoint may take the request only while its outstanding
   requests, this one included, stay within ``(1 + epsilon)`` times the pool's mean
   (this request included), rounded up and never below ``FLOOR`` (2), times its
   slow-start weight: so no endpoint goes above 1.25x its pool's mean with the default
   ``epsilon`` of 0.25 once the pool is busy (but for what step 3 keeps on its cache
   because moving it would cost more), while on a quiet pool a second request may
   join one in flight (a batch of two costs an engine little more than one, a re-prefill
   of the conversation much more). An endpoint that ramps up after an ejection takes a
   share of what it could.
2. **The cache.** Of the endpoints within the bound that were sent this conversation, the
   one that holds the most blocks of the prompt (``CACHE``). An endpoint that holds only
   a part of the opening (a system prompt the conversation shares with others: every
   endpoint that served the template holds it) is no reason to go anywhere.
3. **The price of leaving the cache.** When every endpoint that holds the conversation is
   over the bound, the one that holds the most of it keeps the request all the same
   (``LOADED``) if the time its load adds to the request is less than the time moving it
   adds, by its pool's measured step times (``Costs``, which the caller passes; without
   them the bound holds):

       wait      = steps x (step(n_held + 1) - step(n_other + 1))
                   + (queued_held - queued_other) x prefill seconds per token
       reprefill = (blocks held there - blocks held on the other) x tokens per block
                   x prefill seconds per token

   with ``step(n)`` the pool's decode step of ``n`` sequences, ``n_*`` the requests in
   flight on the cached endpoint and on the one the request would go to instead (step 4's
   choice), ``queued_*`` the prompt tokens sent to each that still await their first
   token (``Loaded.prefilling``: an engine prefills what came before first), and ``steps``
   the engine steps the request is expected to take (its output tokens over the tokens a
   step gives). An engine batches continuously: a request that joins a busy endpoint does
   not wait for the others to finish, only for the prefills queued ahead of it, and each
   of its steps is longer by what the others' sequences add to it, while the other
   endpoint must prefill the whole cached context again before its first token (and
   spends that GPU time). So a
   long conversation stays where its cache is at low loads, where a bound of a request or
   two would move it for less than the re-prefill costs, and leaves once its endpoint's
   batch makes every step of it slower by more. An endpoint slow-starting after an
   ejection is never kept over its bound.
4. **A new conversation** (or one whose endpoint is over the bound and not worth its wait,
   or gone): rendezvous hashing of its opening over the endpoints within the bound
   (``SPREAD``; ``BOUND`` when an endpoint that holds the conversation was passed over for
   its load). Every gateway replica computes the same winner with no shared state, so a
   conversation's first turn, and any turn a replica knows nothing of, lands where any
   other replica would send it; and conversations that share a template spread over the
   pool instead of piling onto the endpoint that served it first.

The rest of the pool follows in the order it came (least loaded first): failover is
unchanged.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol, TypeVar

FLOOR = 2  # the load bound never says fewer requests than this


class Placed(StrEnum):
    """How a request's first endpoint was chosen (a bounded metric label)."""

    CACHE = "cache"  # it holds the conversation
    SPREAD = "spread"  # a new conversation, placed by rendezvous hashing
    BOUND = "bound"  # the endpoint that holds it was over the load bound
    LOADED = "cache_loaded"  # it holds the conversation, over the bound but worth its wait
    LEAST = "least_loaded"  # nothing to place by (no prompt hashes)


@dataclass(frozen=True, slots=True)
class Costs:
    """One pool's prices for weighing a cached endpoint's load against re-prefilling the
    conversation elsewhere, for one request: ``prefill_s`` seconds of step time per prompt
    token prefilled; ``step_s(n)`` the seconds of a decode step of ``n`` sequences;
    ``steps`` the engine steps the request is expected to take (its output tokens over the
    tokens a step gives)."""

    prefill_s: float
    step_s: Callable[[float], float]
    steps: float


@dataclass(frozen=True, slots=True)
class Affinity:
    """What a request's prompt is known by, for placing it: ``opening``, the hash of the
    conversation's opening; ``held``, endpoint URL -> blocks of the prompt's chain it is
    believed to hold; ``holders``, the endpoints that were sent this conversation;
    ``epsilon``, the load bound's slack; ``block_tokens``, the prompt tokens a block of
    the chain stands for; ``costs``, pool name -> its ``Costs`` (a pool without is placed
    by the bound alone); ``tokens``, the prompt's tokens."""

    opening: int
    held: Mapping[str, int] = field(default_factory=dict)
    holders: frozenset[str] = frozenset()
    epsilon: float = 0.25
    block_tokens: float = 0.0
    costs: Mapping[str, Costs] = field(default_factory=dict)
    tokens: int = 0

    def uncached(self, url: str) -> int:
        """The prompt tokens endpoint ``url`` is expected to prefill: what it does not hold."""
        return max(self.tokens - round(self.held.get(url, 0) * self.block_tokens), 0)


class Loaded(Protocol):
    @property
    def url(self) -> str: ...

    @property
    def outstanding(self) -> int: ...

    @property
    def prefilling(self) -> int:
        """Prompt tokens sent to it that still await their first token."""
        ...


E = TypeVar("E", bound="Loaded")


def place(
    serving: Sequence[E],
    affinity: Affinity,
    weight: Callable[[E], float],
    pool: str = "",
) -> tuple[list[E], Placed]:
    """``serving`` (endpoints of ``pool`` in service, least loaded first) reordered with
    the endpoint the request should try first at its head, and how it was chosen."""
    if not serving:
        return [], Placed.LEAST
    total = sum(e.outstanding for e in serving)
    cap = max(math.ceil((1 + affinity.epsilon) * (total + 1) / len(serving)), FLOOR)
    within = [e for e in serving if e.outstanding + 1 <= cap * weight(e)]
    best = _holder(within, affinity)
    if best is not None:
        return _first(best, serving), Placed.CACHE
    spread = max(within, key=lambda e: _score(affinity.opening, e.url), default=serving[0])
    held = _holder([e for e in serving if weight(e) >= 1.0], affinity)
    if held is None:
        how = Placed.BOUND if any(e.url in affinity.holders for e in serving) else Placed.SPREAD
        return _first(spread, serving), how
    costs = affinity.costs.get(pool)
    if costs is not None and _worth_waiting(held, spread, affinity, costs):
        return _first(held, serving), Placed.LOADED
    return _first(spread, serving), Placed.BOUND


def _holder(endpoints: Sequence[E], affinity: Affinity) -> E | None:
    """Of ``endpoints``, the one that was sent the conversation and holds the most of it."""
    return max(
        (e for e in endpoints if e.url in affinity.holders),
        key=lambda e: (affinity.held.get(e.url, 0), _score(affinity.opening, e.url)),
        default=None,
    )


def _worth_waiting(held: Loaded, other: Loaded, affinity: Affinity, costs: Costs) -> bool:
    """Whether the request is done sooner on ``held``, loaded, than re-prefilled on
    ``other`` (the module docstring, step 3)."""
    blocks = affinity.held.get(held.url, 0) - affinity.held.get(other.url, 0)
    reprefill = blocks * affinity.block_tokens * costs.prefill_s
    slower = costs.step_s(held.outstanding + 1) - costs.step_s(other.outstanding + 1)
    queued = (held.prefilling - other.prefilling) * costs.prefill_s
    return costs.steps * slower + queued < reprefill


def _first(best: E, serving: Sequence[E]) -> list[E]:
    return [best, *(e for e in serving if e is not best)]


def _score(key: int, url: str) -> int:
    """Rendezvous (highest random weight) score of ``url`` for ``key``: a stable 64-bit
    mix of both (FNV-1a over the URL, then splitmix64 with the key), the same in every
    process."""
    h = 0xCBF29CE484222325
    for byte in url.encode():
        h = ((h ^ byte) * 0x100000001B3) & _MASK
    z = (h ^ key) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


_MASK = (1 << 64) - 1
