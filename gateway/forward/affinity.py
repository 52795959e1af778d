"""Part of step 4 (decide): what places a request on the endpoint of a pool that holds its
prompt's prefix (``backends/placement.py``'s ``Affinity``), made from what the prefix map
answered for its prompt (``gateway/state/prefixes.py``) and what the pools' step times say.
The one construction the gateway (``gateway/pipeline.py``) and ``speclane replay``
(``gateway/replay/placing.py``) share. Pure.

An endpoint counts as holding the conversation (``Affinity.holders``) when it was sent
the conversation's opening, or blocks of the prompt beyond the opening: a system prompt
that other conversations share is no reason to go anywhere. Only then are the pools'
prices asked for (``costs``): whether its cached endpoint, over the load bound, keeps it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

from backends.placement import Affinity, Costs
from gateway.prompt.prints import BLOCK_BYTES, opening_blocks
from policies.features import Features

Prices = Callable[[], Mapping[str, Costs]]


def unplaced(features: Features, epsilon: float) -> Affinity | None:
    """The affinity of a prompt under one block (placed by its opening alone, nothing to
    look up), or None when there is a chain to look up."""
    prompt = features.prompt
    if prompt.chain:
        return None
    return Affinity(prompt.opening, epsilon=epsilon, tokens=features.prompt_tokens)


def affinity_of(
    features: Features,
    held: Mapping[str, int],
    opened: str | None,
    epsilon: float,
    costs: Prices,
) -> Affinity:
    """The request's affinity from the prefix map's answer: ``held``, endpoint -> blocks of
    the prompt's chain it holds; ``opened``, the endpoint that was sent the opening."""
    prompt = features.prompt
    past = opening_blocks(prompt)
    holders = {url for url, blocks in held.items() if blocks > past}
    if opened is not None:
        holders.add(opened)
    tokens = features.prompt_tokens
    block_tokens = tokens * BLOCK_BYTES / prompt.size if prompt.size > 0 else 0.0
    priced = costs() if holders and block_tokens > 0 else {}
    return Affinity(prompt.opening, held, frozenset(holders), epsilon, block_tokens, priced, tokens)


def prices(
    views: PlacementPrices, tokens_per_turn: float | None, slice_key: str, now: float
) -> Prices:
    """The pools' ``Costs`` for a request of ``slice_key``, asked only when needed; none
    while the slice's output tokens per turn are not learned yet."""
    if tokens_per_turn is None:
        return dict
    return lambda: views.placement_costs(slice_key, tokens_per_turn, now)


class PlacementPrices(Protocol):
    """What ``gateway/measure/views.py``'s ``Views`` answers of a slice's placement."""

    def placement_costs(
        self, key: str, tokens_per_turn: float, now: float
    ) -> Mapping[str, Costs]: ...
