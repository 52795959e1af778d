"""Speculative decoding arithmetic (Leviathan et al. 2023, "Fast Inference from Transformers
via Speculative Decoding"). Pure.

With per-token acceptance ``a`` (each draft token accepted independently with probability a,
drafting stops at the first rejection) and ``k`` draft tokens per step:

    expected tokens per target step   E = (1 - a^(k+1)) / (1 - a)

vLLM's *draft acceptance rate* is accepted / drafted = (E - 1) / k, not ``a``; solve for ``a``
with ``draft_rate_to_token_rate``. vLLM's *mean acceptance length* is E.
"""

from __future__ import annotations


def expected_tokens_per_step(a: float, k: int) -> float:
    if a >= 1.0:
        return float(k + 1)
    return (1.0 - a ** (k + 1)) / (1.0 - a)


def draft_rate_to_token_rate(rate: float, k: int) -> float:
    """The per-token acceptance ``a`` whose expected draft acceptance rate is ``rate``."""
    rate = min(max(rate, 0.0), 1.0)
    lo, hi = 0.0, 1.0
    for _ in range(50):  # bisection: the rate is increasing in a
        mid = (lo + hi) / 2
        if (expected_tokens_per_step(mid, k) - 1.0) / k < rate:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2
