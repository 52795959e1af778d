"""Response pins: remembered for their TTL on the clock given, bounded, and in a real Redis
shared by every replica (with a replica's own memory when Redis fails)."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from gateway.state.pins import MemoryPins, RedisPins, pinned_endpoint, valid_id
from tests.redis_server import namespace, require_shared_redis

pytestmark = pytest.mark.anyio

A, B = "http://10.0.0.1:8000", "http://10.0.0.2:8000"
T = "acme"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_a_pin_lasts_its_ttl_on_the_clock_given():
    clock = Clock()
    pins = MemoryPins(60.0, clock=clock)
    await pins.remember(T, "resp_1", A)
    clock.now += 59.9
    assert await pins.where(T, "resp_1") == A
    clock.now += 0.1
    assert await pins.where(T, "resp_1") is None
    assert await pins.where(T, "resp_never") is None


async def test_keep_is_remember_without_waiting():
    pins = MemoryPins()
    pins.keep(T, "resp_1", A)
    assert await pins.where(T, "resp_1") == A


async def test_remembering_again_renews_and_moves_a_pin():
    clock = Clock()
    pins = MemoryPins(60.0, clock=clock)
    await pins.remember(T, "resp_1", A)
    clock.now += 50
    await pins.remember(T, "resp_1", B)
    clock.now += 50
    assert await pins.where(T, "resp_1") == B


async def test_pins_are_bounded_and_expired_ones_go_first():
    clock = Clock()
    pins = MemoryPins(60.0, clock=clock, per_tenant=3)
    for i in range(5):
        await pins.remember(T, f"resp_{i}", A)
    assert len(pins) == 3
    assert [await pins.where(T, f"resp_{i}") for i in range(5)] == [None, None, A, A, A]
    clock.now += 61
    await pins.remember(T, "resp_new", B)
    assert len(pins) == 1


async def test_a_body_continuing_a_response_finds_where_it_lives():
    pins = MemoryPins()
    await pins.remember(T, "resp_1", A)
    assert await pinned_endpoint(pins, T, {"previous_response_id": "resp_1"}) == A
    assert await pinned_endpoint(pins, T, {"previous_response_id": "resp_2"}) is None
    assert await pinned_endpoint(pins, T, {"previous_response_id": 7}) is None
    assert await pinned_endpoint(pins, T, {"input": "hi"}) is None


@pytest.mark.parametrize(
    ("value", "valid"),
    [("resp_1", True), ("", False), ("x" * 257, False), ("a\nb", False), (None, False)],
)
def test_only_short_printable_ids_are_looked_up(value, valid):
    assert valid_id(value) is valid


@pytest.mark.redis
async def test_replicas_share_pins_through_redis_with_its_ttl():
    url, ns = require_shared_redis(), namespace()
    one, other = RedisPins(url, ns, 120.0), RedisPins(url, ns, 120.0)
    raw = aioredis.from_url(url)
    try:
        await one.remember(T, "resp_1", A)
        assert await other.where(T, "resp_1") == A
        assert await other.where(T, "resp_2") is None
        assert 0 < await raw.ttl(f"{ns}:pin:{{acme}}:resp_1") <= 120
    finally:
        await raw.delete(f"{ns}:pin:{{acme}}:resp_1", f"{ns}:pins:{{acme}}")
        await raw.aclose()
        await one.close()
        await other.close()


@pytest.mark.redis
async def test_keep_knows_a_pin_at_once_and_shares_it_before_closing():
    url, ns = require_shared_redis(), namespace()
    one, other = RedisPins(url, ns, 120.0), RedisPins(url, ns, 120.0)
    raw = aioredis.from_url(url)
    try:
        one.keep(T, "resp_1", A)  # on the request path: nothing awaited
        assert await one.where(T, "resp_1") == A
        await one.close()  # the write under way finishes first
        assert await other.where(T, "resp_1") == A
    finally:
        await raw.delete(f"{ns}:pin:{{acme}}:resp_1", f"{ns}:pins:{{acme}}")
        await raw.aclose()
        await other.close()


@pytest.mark.redis
async def test_a_replica_remembers_its_own_pins_when_redis_fails():
    pins = RedisPins("redis://127.0.0.1:1/0", namespace(), 60.0)
    try:
        await pins.remember(T, "resp_1", A)
        pins.keep(T, "resp_2", B)
        assert await pins.where(T, "resp_1") == A
        assert await pins.where(T, "resp_2") == B
    finally:
        await pins.close()


async def test_a_pin_is_found_only_under_the_tenant_that_stored_it():
    pins = MemoryPins()
    await pins.remember("acme", "resp_1", A)
    assert await pins.where("acme", "resp_1") == A
    assert await pins.where("beta", "resp_1") is None
    assert await pins.where("anonymous", "resp_1") is None
    assert await pinned_endpoint(pins, "beta", {"previous_response_id": "resp_1"}) is None


async def test_one_tenants_flood_never_forgets_another_tenants_ids():
    pins = MemoryPins(per_tenant=100, max_entries=1000)
    await pins.remember("acme", "resp_acme", A)
    for i in range(5000):
        pins.keep("anonymous", f"resp_{i}", B)
    assert await pins.where("acme", "resp_acme") == A
    assert pins.held_by("anonymous") == 100
    assert await pins.where("anonymous", "resp_4999") == B
    assert await pins.where("anonymous", "resp_4899") is None  # its own oldest went


async def test_past_the_process_bound_the_tenant_holding_most_gives_way():
    pins = MemoryPins(per_tenant=10, max_entries=12)
    for tenant, n in (("a", 2), ("b", 3)):
        for i in range(n):
            await pins.remember(tenant, f"{tenant}{i}", A)
    for i in range(10):
        await pins.remember("big", f"big{i}", A)
    assert len(pins) == 12
    assert (pins.held_by("a"), pins.held_by("b"), pins.held_by("big")) == (2, 3, 7)
    await pins.remember("c", "c0", A)  # a fourth tenant: the biggest still gives way
    assert (pins.held_by("c"), pins.held_by("big"), len(pins)) == (1, 6, 12)
    assert await pins.where("big", "big3") is None and await pins.where("big", "big4") == A


async def test_expired_pins_leave_no_tenant_behind():
    clock = Clock()
    pins = MemoryPins(10.0, clock=clock)
    await pins.remember("a", "resp_1", A)
    clock.now += 11
    assert await pins.where("a", "resp_1") is None
    assert (len(pins), pins.held_by("a")) == (0, 0)
    await pins.remember("a", "resp_2", A)
    assert len(pins) == 1


class Dropped:
    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def __call__(self, reason: str, n: int) -> None:
        self.counts[reason] = self.counts.get(reason, 0) + n


async def _forget(url: str, ns: str) -> None:
    raw = aioredis.from_url(url)
    try:
        keys = [key async for key in raw.scan_iter(match=f"{ns}:*", count=1000)]
        for start in range(0, len(keys), 1000):
            await raw.delete(*keys[start : start + 1000])
    finally:
        await raw.aclose()


@pytest.mark.redis
async def test_in_redis_a_pin_is_scoped_to_its_tenant_and_bounded_per_tenant():
    url, ns = require_shared_redis(), namespace()
    one = RedisPins(url, ns, 120.0, per_tenant=50)
    other = RedisPins(url, ns, 120.0, per_tenant=50)  # another replica: nothing local
    raw = aioredis.from_url(url)
    try:
        await one.remember("acme", "resp_acme", A)
        for i in range(300):
            one.keep("anonymous", f"resp_{i}", B)
        await one.close()  # the queued writes are made first
        assert await other.where("acme", "resp_acme") == A
        assert await other.where("beta", "resp_acme") is None
        assert await other.where("anonymous", "resp_acme") is None
        assert await other.where("anonymous", "resp_299") == B
        assert await other.where("anonymous", "resp_249") is None  # its own oldest went
        flood = [key async for key in raw.scan_iter(match=f"{ns}:pin:{{anonymous}}:*")]
        assert len(flood) == 50
        assert await raw.zcard(f"{ns}:pins:{{anonymous}}") == 50
        assert 0 < await raw.ttl(f"{ns}:pins:{{anonymous}}") <= 120
    finally:
        await raw.aclose()
        await other.close()
        await _forget(url, ns)


@pytest.mark.redis
async def test_a_burst_of_32_writers_drops_no_pin():
    # 32 clients storing responses at once: every id reaches Redis (no "Too many
    # connections"), while as many readers look pins up
    url, ns = require_shared_redis(), namespace()
    dropped = Dropped()
    one = RedisPins(url, ns, 120.0, per_tenant=100_000, dropped=dropped)
    other = RedisPins(url, ns, 120.0)
    misses = 0

    async def writer(w: int) -> None:
        for i in range(200):
            one.keep("acme", f"resp_{w}_{i}", A)
            if i % 20 == 0:
                await asyncio.sleep(0)

    async def reader(w: int) -> None:
        nonlocal misses
        for i in range(20):
            misses += await other.where("acme", f"resp_{w}_none_{i}") is not None
            await asyncio.sleep(0)

    try:
        await asyncio.gather(*(writer(w) for w in range(32)), *(reader(w) for w in range(32)))
        await one.close()
        raw = aioredis.from_url(url)
        try:
            assert await raw.zcard(f"{ns}:pins:{{acme}}") == 32 * 200
        finally:
            await raw.aclose()
        assert await other.where("acme", "resp_31_199") == A
        assert dropped.counts == {} and misses == 0
    finally:
        await other.close()
        await _forget(url, ns)


async def test_writes_redis_does_not_take_are_counted_and_logged(caplog):
    dropped = Dropped()
    pins = RedisPins("redis://127.0.0.1:1/0", namespace(), 60.0, dropped=dropped, max_queued=3)
    for i in range(5):
        pins.keep(T, f"resp_{i}", A)
    await pins.remember(T, "resp_5", A)
    await pins.close()
    assert dropped.counts == {"queue_full": 2, "redis_error": 4}
    assert "not shared through Redis" in caplog.text
    assert "dropping new ones" in caplog.text
