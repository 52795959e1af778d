"""The prefix map: a prompt's checkpoints remembered on the endpoint it was sent to, the
longest held prefix per endpoint found again by a later turn, bounded and expiring, and
shared between replicas through a real Redis (each replica's own map when Redis fails)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import redis.asyncio as aioredis

from gateway.state.prefixes import (
    CHECKPOINT_EVERY,
    LOOKUP_S,
    PAUSE_S,
    MemoryPrefixes,
    RedisPrefixes,
    blocks_of,
    checkpoints,
    probes,
)
from tests.redis_server import namespace, require_shared_redis

pytestmark = pytest.mark.anyio

A, B = "http://10.0.0.1:8000", "http://10.0.0.2:8000"


def chain(n: int, salt: int = 0) -> tuple[int, ...]:
    return tuple(i << 32 | (salt * 7919 + i) & 0xFFFFFFFF for i in range(n))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_prompt_remembers_every_eighth_block_and_its_last():
    kept = checkpoints(chain(20))
    assert [blocks_of(e) for e in kept] == [8, 16, 20]
    assert [blocks_of(e) for e in checkpoints(chain(16))] == [8, 16]
    assert checkpoints(()) == []
    assert [blocks_of(e) for e in probes(chain(5))] == [5, 4, 3, 2, 1]
    assert [blocks_of(e) for e in probes(chain(40))] == [40, 32, 24, 16, 8]


OPENING = 1234 << 32 | 99


async def test_the_next_turn_finds_how_much_of_it_each_endpoint_holds():
    prefixes = MemoryPrefixes()
    prefixes.keep(chain(5), OPENING, A)  # a short first turn: its last block is found
    assert await prefixes.held(chain(9), OPENING) == ({A: 5}, A)
    prefixes.keep(chain(30), OPENING, B)  # the conversation went on elsewhere
    assert await prefixes.held(chain(45), OPENING) == ({B: 24}, B)  # to within 8 blocks
    assert await prefixes.held(chain(30), OPENING) == ({B: 30}, B)
    assert await prefixes.held(chain(45, salt=1), OPENING + 1) == ({}, None)


async def test_the_map_is_bounded_and_forgets_what_was_sent_longest_ago():
    prefixes = MemoryPrefixes(max_entries=2 * 4)
    for salt in range(4):
        prefixes.keep(chain(3 * CHECKPOINT_EVERY, salt), salt, A)  # 3 checkpoints + opening
    assert len(prefixes) == 8
    assert await prefixes.held(chain(3 * CHECKPOINT_EVERY, 0), 0) == ({}, None)
    assert await prefixes.held(chain(3 * CHECKPOINT_EVERY, 3), 3) == ({A: 24}, A)


async def test_an_entry_lasts_its_ttl_and_is_renewed_by_use():
    clock = Clock()
    prefixes = MemoryPrefixes(60.0, clock=clock)
    prefixes.keep(chain(8), OPENING, A)
    clock.now += 40
    prefixes.keep(chain(8), OPENING, A)  # more than half its TTL old: renewed
    clock.now += 40
    assert await prefixes.held(chain(8), OPENING) == ({A: 8}, A)
    clock.now += 21
    assert await prefixes.held(chain(8), OPENING) == ({}, None)


@pytest.mark.redis
async def test_replicas_share_the_map_through_redis():
    url, ns = require_shared_redis(), namespace()
    one, other = RedisPrefixes(url, ns, 120.0), RedisPrefixes(url, ns, 120.0)
    raw = aioredis.from_url(url)
    try:
        one.keep(chain(20), OPENING, A)
        await one.close()  # the writes under way finish first
        assert await other.held(chain(27), OPENING) == ({A: 16}, A)
        other.keep(chain(27), OPENING, B)  # the next turn went elsewhere: every replica follows
        await other.close()
        one = RedisPrefixes(url, ns, 120.0)
        assert await one.held(chain(33), OPENING) == ({B: 24}, B)
        keys = await raw.keys(f"{ns}:px:*")
        assert len(keys) == 6  # 8, 16, 20, 24 and 27 blocks, and the opening: hashes only
        assert 0 < await raw.ttl(keys[0]) <= 120
        assert {await raw.get(k) for k in keys} <= {A.encode(), B.encode()}
    finally:
        for key in await raw.keys(f"{ns}:px:*"):
            await raw.delete(key)
        await raw.aclose()
        await one.close()


@pytest.mark.redis
async def test_a_replica_reads_its_own_map_when_redis_fails_and_leaves_redis_alone_awhile():
    clock = Clock()
    prefixes = RedisPrefixes("redis://127.0.0.1:1/0", namespace(), 60.0, clock=clock)
    try:
        prefixes.keep(chain(10), OPENING, A)
        assert await prefixes.held(chain(12), OPENING) == ({A: 10}, A)
        assert prefixes._paused_until == clock.now + PAUSE_S
        clock.now += PAUSE_S / 2
        assert await prefixes.held(chain(12), OPENING) == ({A: 10}, A)  # not tried
        assert prefixes._paused_until == clock.now + PAUSE_S / 2
    finally:
        await prefixes.close()


@asynccontextmanager
async def slow(url: str, delay_s: float) -> AsyncIterator[str]:
    """A proxy in front of the Redis at ``url`` that holds each of its replies ``delay_s``:
    a Redis that answers, slowly. Its URL."""
    host, port = url.removeprefix("redis://").split("/")[0].split(":")

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, wait: float) -> None:
        try:
            while data := await reader.read(65536):
                await asyncio.sleep(wait)
                writer.write(data)
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def serve(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        redis_r, redis_w = await asyncio.open_connection(host, int(port))
        await asyncio.gather(pipe(client_r, redis_w, 0.0), pipe(redis_r, client_w, delay_s))

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    async with server:
        yield f"redis://127.0.0.1:{server.sockets[0].getsockname()[1]}/0"
        server.close()


@pytest.mark.redis
async def test_a_slow_redis_costs_a_lookup_its_deadline_once_then_nothing_awhile():
    """A Redis that takes half a second a reply (under the socket timeout: no error) is
    waited for ``LOOKUP_S`` by one request, and not at all by the next for ``PAUSE_S``."""
    clock = Clock()
    async with slow(require_shared_redis(), 0.5) as url:
        prefixes = RedisPrefixes(url, namespace(), 60.0, clock=clock)
        try:
            prefixes.keep(chain(10), OPENING, A)
            started = time.monotonic()
            assert await prefixes.held(chain(12), OPENING) == ({A: 10}, A)
            waited = time.monotonic() - started
            assert prefixes._paused_until == clock.now + PAUSE_S
            clock.now += PAUSE_S / 2
            started = time.monotonic()
            assert await prefixes.held(chain(12), OPENING) == ({A: 10}, A)  # not tried
            again = time.monotonic() - started
        finally:
            await prefixes.close()
    assert LOOKUP_S <= waited < 0.45 and again < LOOKUP_S
