"""Two replicas agree on a slice split by application through a real Redis: the replica
that sees the evidence proposes the split, the store places it once, the other replica
pulls it, and both route each application's requests to the same child."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from gateway.measure.livestats import LiveStats
from gateway.measure.telemetry import Telemetry
from gateway.state.flagstore import FlagStore
from gateway.state.redis_store import RedisState
from policies.decide import decide
from tests.gateway.measure.test_children import (
    REPORTS,
    REVIEW,
    alternate,
    features,
    opposite,
    policy,
    run,
)
from tests.redis_server import namespace, require_shared_redis

pytestmark = [pytest.mark.anyio, pytest.mark.redis]


def store(url: str, ns: str, stats: LiveStats) -> RedisState:
    compiled = policy()
    return RedisState(
        url,
        ns,
        FlagStore(compiled),
        stats.replica,
        lambda: compiled,
        Telemetry.build(),
        lambda: 1000.0,
    )


async def test_both_replicas_route_a_child_the_same_way() -> None:
    url, ns = require_shared_redis(), namespace()
    compiled = policy()
    a = LiveStats(lambda: compiled, load=lambda model, now: 1.0)
    b = LiveStats(lambda: compiled, load=lambda model, now: 1.0)
    a_store, b_store = store(url, ns, a), store(url, ns, b)
    try:
        await a_store.sync()
        await b_store.sync()
        for start in range(0, 120, 5):  # replica a serves; both sync every 5 s
            run(compiled, opposite, alternate, start + 5, stats=a, start=start)
            await a_store.sync()
            await b_store.sync()
        assert a.splits, [e.reason for e in a.events]
        assert dict(b.splits) == dict(a.splits)
        for template in (REVIEW, REPORTS):
            on_a = decide(features(template, 1), compiled, {}, a.guards, 0.0, a.splits)
            on_b = decide(features(template, 1), compiled, {}, b.guards, 0.0, b.splits)
            assert on_a.slice == on_b.slice != on_a.parent
            assert on_a.pool == on_b.pool
        client = aioredis.from_url(url)
        stored = await client.zrange(f"{ns}:splits", 0, -1)
        await client.aclose()
        assert len(stored) == 1
    finally:
        await a_store._redis.aclose()
        await b_store._redis.aclose()
        client = aioredis.from_url(url)
        keys = [k async for k in client.scan_iter(f"{ns}:*")]
        if keys:
            await client.delete(*keys)
        await client.aclose()
