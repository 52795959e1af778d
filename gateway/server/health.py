"""What the gateway knows of its pools' health, in one shape for ``/readyz`` and the admin
API's ``GET /admin/pools``: each pool's endpoints with their load and health (serving,
ejected as an outlier, or returning), and (admin only) the acceptance scraped from the
pool's own counters. Reads the services; changes nothing."""

from __future__ import annotations

from typing import Any

from gateway.services import Services
from policies.engines import describe


def pool_health(services: Services) -> dict[str, dict[str, Any]]:
    """Every pool of the running policy: healthy (an endpoint takes requests), its engine and
    the acceptance signal speclane reads from it (best first, and what outcomes carried),
    and its endpoints."""
    pools = services.pools
    return {
        name: {
            "healthy": pools.healthy(name),
            **describe(pool, services.engines.of(pool.engine).shows),
            "signals_seen": services.signals.of(name),
            "speculation": services.scraper.speculation(name),
            "endpoints": [
                {
                    "url": e.url,
                    "outstanding": e.outstanding,
                    "health": pools.state(e).value,
                }
                for e in pools.endpoints.get(name, ())
            ],
        }
        for name, pool in services.policy.current.pools.items()
    }


def pools_detail(services: Services) -> dict[str, dict[str, Any]]:
    """``pool_health`` with each pool's kind, model, k and the last scraped difference of
    its counters (``scraped`` is None until two scrapes saw draft tokens; an engine's
    gauges as they are, ``Engine.gauged``), for endpoints read drained-on-read the
    iterations they dropped unread, and the prefix cache's hit ratio of the pool and of each
    endpoint (None until an answer said how much of its prompt was cached;
    ``gateway/measure/cachehits.py``) and each endpoint's kept share of what the prefix map
    believed it held (None until an answer said; ``LoadMeter.kept``)."""
    policy = services.policy.current
    health = pool_health(services)
    hits = services.feedback.cache.summary()
    kept = services.load.kept_shares()
    out = {}
    for name, pool in policy.pools.items():
        latest = services.scraper.latest.get(name)
        scraped: dict[str, float | None] | None = None
        if latest is not None and latest.draft_tokens:
            scraped = {
                "acceptance": latest.accepted_tokens / latest.draft_tokens,
                "draft_tokens": latest.draft_tokens,
                "accepted_tokens": latest.accepted_tokens,
                "drafts": latest.drafts,
            }
        gauges = services.scraper.gauges.get(name)
        if gauges is not None:  # an engine's own figures, not differences
            scraped = {
                "acceptance": gauges.rate,
                "tokens_per_step": gauges.length,
                "tokens_per_step_since_start": gauges.lifetime_length,
            }
        cached = hits.get(name, {})
        for endpoint in health[name]["endpoints"]:
            seen = cached.get("endpoints", {}).get(endpoint["url"], {})
            endpoint["prefix_cache_hit_ratio"] = seen.get("hit_ratio")
            endpoint["prefix_cache_kept"] = kept.get(endpoint["url"].rstrip("/"), (None,))[0]
        urls = [e["url"] for e in health[name]["endpoints"]]
        lost = {u: n for u, n in services.scraper.lost.items() if u in urls}
        out[name] = {
            "kind": pool.kind.value,
            "model": pool.model,
            "num_speculative_tokens": pool.num_speculative_tokens,
            **health[name],
            "scraped": scraped,
            "iterations_lost": lost or None,
            "prefix_cache_hit_ratio": cached.get("hit_ratio"),
        }
    return out
