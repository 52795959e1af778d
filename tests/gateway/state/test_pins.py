"""Response pins: remembered for their TTL on the clock given, bounded, and in a real Redis
shared by every replica (with a replica's own memory when Redis fails)."""

from __future__ import annotations

import pytest
import redis.asyncio as aioredis

from gateway.state.pins import MemoryPins, RedisPins, pinned_endpoint, valid_id
from tests.redis_server import namespace, require_shared_redis

pytestmark = pytest.mark.anyio

A, B = "http://10.0.0.1:8000", "http://10.0.0.2:8000"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_a_pin_lasts_its_ttl_on_the_clock_given():
    clock = Clock()
    pins = MemoryPins(60.0, clock=clock)
    await pins.remember("resp_1", A)
    clock.now += 59.9
    assert await pins.where("resp_1") == A
    clock.now += 0.1
    assert await pins.where("resp_1") is None
    assert await pins.where("resp_never") is None


async def test_keep_is_remember_without_waiting():
    pins = MemoryPins()
    pins.keep("resp_1", A)
    assert await pins.where("resp_1") == A


async def test_remembering_again_renews_and_moves_a_pin():
    clock = Clock()
    pins = MemoryPins(60.0, clock=clock)
    await pins.remember("resp_1", A)
    clock.now += 50
    await pins.remember("resp_1", B)
    clock.now += 50
    assert await pins.where("resp_1") == B


async def test_pins_are_bounded_and_expired_ones_go_first():
    clock = Clock()
    pins = MemoryPins(60.0, clock=clock, max_entries=3)
    for i in range(5):
        await pins.remember(f"resp_{i}", A)
    assert len(pins) == 3
    assert [await pins.where(f"resp_{i}") for i in range(5)] == [None, None, A, A, A]
    clock.now += 61
    await pins.remember("resp_new", B)
    assert len(pins) == 1


async def test_a_body_continuing_a_response_finds_where_it_lives():
    pins = MemoryPins()
    await pins.remember("resp_1", A)
    assert await pinned_endpoint(pins, {"previous_response_id": "resp_1"}) == A
    assert await pinned_endpoint(pins, {"previous_response_id": "resp_2"}) is None
    assert await pinned_endpoint(pins, {"previous_response_id": 7}) is None
    assert await pinned_endpoint(pins, {"input": "hi"}) is None


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
        await one.remember("resp_1", A)
        assert await other.where("resp_1") == A
        assert await other.where("resp_2") is None
        assert 0 < await raw.ttl(f"{ns}:pin:resp_1") <= 120
    finally:
        await raw.delete(f"{ns}:pin:resp_1")
        await raw.aclose()
        await one.close()
        await other.close()


@pytest.mark.redis
async def test_keep_knows_a_pin_at_once_and_shares_it_before_closing():
    url, ns = require_shared_redis(), namespace()
    one, other = RedisPins(url, ns, 120.0), RedisPins(url, ns, 120.0)
    raw = aioredis.from_url(url)
    try:
        one.keep("resp_1", A)  # on the request path: nothing awaited
        assert await one.where("resp_1") == A
        await one.close()  # the write under way finishes first
        assert await other.where("resp_1") == A
    finally:
        await raw.delete(f"{ns}:pin:resp_1")
        await raw.aclose()
        await other.close()


@pytest.mark.redis
async def test_a_replica_remembers_its_own_pins_when_redis_fails():
    pins = RedisPins("redis://127.0.0.1:1/0", namespace(), 60.0)
    try:
        await pins.remember("resp_1", A)
        pins.keep("resp_2", B)
        assert await pins.where("resp_1") == A
        assert await pins.where("resp_2") == B
    finally:
        await pins.close()
