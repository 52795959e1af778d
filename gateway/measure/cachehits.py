"""How much of the prompts each pool and endpoint found in its prefix cache: prompt tokens
cached over prompt tokens, from the answers' usage (chat's and completions'
``usage.prompt_tokens_details.cached_tokens``, Responses'
``usage.input_tokens_details.cached_tokens``, Messages' ``usage.cache_read_input_tokens``;
``gateway/measure/messages.py``). Only answers that say how much was cached count: an
engine that does not report it (vLLM without ``--enable-prompt-tokens-details``) shows no
ratio rather than a false zero. Fed by ``Feedback.record``; read by ``/admin/stats``. O(1)
per outcome, bounded by the pools' endpoints."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from gateway.measure.acceptance import Outcome


class CacheHits:
    """Prompt and cached tokens per (pool, endpoint), since the gateway started."""

    __slots__ = ("_tokens",)

    def __init__(self) -> None:
        self._tokens: defaultdict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0, 0])

    def add(self, outcome: Outcome) -> None:
        if outcome.cached_tokens is None or outcome.prompt_tokens <= 0:
            return
        labels = outcome.labels
        tally = self._tokens[labels.pool, labels.endpoint]
        tally[0] += 1
        tally[1] += outcome.prompt_tokens
        tally[2] += min(outcome.cached_tokens, outcome.prompt_tokens)

    def summary(self) -> dict[str, dict[str, Any]]:
        """Per pool: requests, prompt and cached tokens, their ratio, and the same per
        endpoint."""
        pools: dict[str, dict[str, Any]] = {}
        for (pool, endpoint), (requests, prompt, cached) in sorted(self._tokens.items()):
            entry = pools.setdefault(pool, _figures(0, 0, 0) | {"endpoints": {}})
            entry.update(
                _figures(
                    entry["requests"] + requests,
                    entry["prompt_tokens"] + prompt,
                    entry["cached_tokens"] + cached,
                )
            )
            entry["endpoints"][endpoint] = _figures(requests, prompt, cached)
        return pools


def _figures(requests: int, prompt: int, cached: int) -> dict[str, Any]:
    return {
        "requests": requests,
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "hit_ratio": cached / prompt if prompt else None,
    }
