"""Where each stored Responses API response lives, and whose it is: (tenant, response id) ->
the base URL of the upstream endpoint that answered it.

vLLM keeps a stored response (``store: true``, the default) in the memory of the server that
made it, and only that server knows it: a request that continues it (``previous_response_id``)
or reads, deletes or cancels it (``GET``/``DELETE /v1/responses/{id}``,
``POST /v1/responses/{id}/cancel``) must go there, whatever rung the request's slice is on.
vLLM gives a stored response to whoever names its id; the gateway gives it only to the
tenant that stored it (``gateway/identity.py``): a pin is kept under its tenant and looked
up under the caller's, so any other caller finds nothing and gets the same 404 as for an id
never seen. Keyless callers are all the tenant ``anonymous``, and share its pins.

The gateway remembers the endpoint of every response id it relays, for
``SPECLANE_RESPONSE_PIN_TTL_S``, at most ``SPECLANE_RESPONSE_PINS_PER_TENANT`` ids per tenant
(the tenant's oldest forgotten first, so one tenant's flood never forgets another's ids):

- in this process (``MemoryPins``), also at most ``MAX_PINS_IN_PROCESS`` in all, the
  oldest of the tenant holding the most forgotten first;
- in Redis when replicas share state (``RedisPins``): ``<namespace>:pin:{<tenant>}:<id>``,
  with the TTL, and the tenant's ids by age in ``<namespace>:pins:{<tenant>}``, one script
  writing both and trimming the oldest, so that any replica sends a follow-up where the
  first answer came from. Writes from the request path are queued and sent in pipelined
  batches on one connection, so a burst opens no more connections than a trickle; a write
  that cannot be made (queue full, Redis failing) is counted
  (``speclane_response_pin_writes_dropped_total``) and logged. Redis unreachable: a replica
  goes on with what it remembers itself.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from gateway.state.redisclient import FAILURES, connect

log = logging.getLogger(__name__)

MAX_ID_CHARS = 256
PER_TENANT = 10_000
MAX_PINS_IN_PROCESS = 100_000
MAX_QUEUED = 10_000  # pin writes waiting for Redis
BATCH = 256  # pin writes per pipeline


class ResponsePins(Protocol):
    """(tenant, response id) -> the upstream base URL that answered it."""

    async def remember(self, tenant: str, response_id: str, endpoint: str) -> None: ...

    def keep(self, tenant: str, response_id: str, endpoint: str) -> None:
        """``remember`` without waiting, for the request path: known here at once, the
        write anywhere else scheduled."""
        ...

    async def where(self, tenant: str, response_id: str) -> str | None:
        """Where ``tenant``'s response lives; None for an id that is not ``tenant``'s."""
        ...

    async def close(self) -> None: ...


def valid_id(response_id: object) -> bool:
    """An id worth looking up: a short printable string."""
    return (
        isinstance(response_id, str)
        and 0 < len(response_id) <= MAX_ID_CHARS
        and response_id.isprintable()
    )


async def pinned_endpoint(pins: ResponsePins, tenant: str, body: Mapping[str, Any]) -> str | None:
    """Where a ``POST /v1/responses`` body's ``previous_response_id`` lives; None when it
    names none, or one the gateway does not know as ``tenant``'s."""
    previous = body.get("previous_response_id")
    if not valid_id(previous):
        return None
    assert isinstance(previous, str)
    return await pins.where(tenant, previous)


class _Sizes:
    """How many pins each tenant holds, and a tenant that holds the most; O(1) a change
    (sizes move by one, so the largest is found again by stepping down)."""

    def __init__(self) -> None:
        self._of: dict[str, int] = {}
        self._with: dict[int, dict[str, None]] = {}
        self.largest = 0

    def grew(self, tenant: str) -> None:
        n = self._of.get(tenant, 0)
        self._move(tenant, n, n + 1)
        self.largest = max(self.largest, n + 1)

    def shrank(self, tenant: str) -> None:
        n = self._of[tenant]
        self._move(tenant, n, n - 1)
        if n == self.largest and n not in self._with:
            self.largest = n - 1

    def a_largest(self) -> str:
        return next(iter(self._with[self.largest]))

    def _move(self, tenant: str, old: int, new: int) -> None:
        if old:
            holders = self._with[old]
            del holders[tenant]
            if not holders:
                del self._with[old]
        if new:
            self._with.setdefault(new, {})[tenant] = None
            self._of[tenant] = new
        else:
            del self._of[tenant]


class MemoryPins:
    """Pins in this process: each for ``ttl_s`` of ``clock``, at most ``per_tenant`` a
    tenant and ``max_entries`` in all."""

    def __init__(
        self,
        ttl_s: float = 86_400.0,
        *,
        clock: Callable[[], float] = time.monotonic,
        per_tenant: int = PER_TENANT,
        max_entries: int = MAX_PINS_IN_PROCESS,
    ) -> None:
        self._ttl_s = ttl_s
        self._clock = clock
        self._per_tenant = per_tenant
        self._max = max_entries
        self._tenants: dict[str, OrderedDict[str, tuple[str, float]]] = {}
        self._sizes = _Sizes()
        self._total = 0

    async def remember(self, tenant: str, response_id: str, endpoint: str) -> None:
        self.put(tenant, response_id, endpoint)

    def keep(self, tenant: str, response_id: str, endpoint: str) -> None:
        self.put(tenant, response_id, endpoint)

    async def where(self, tenant: str, response_id: str) -> str | None:
        return self.get(tenant, response_id)

    async def close(self) -> None:
        pass

    def put(self, tenant: str, response_id: str, endpoint: str) -> None:
        now = self._clock()
        held = self._tenants.get(tenant)
        if held is not None:
            self._expire(tenant, held, now)
            if response_id in held:
                self._drop(tenant, held, response_id)
        pins = self._tenants.setdefault(tenant, OrderedDict())
        pins[response_id] = (endpoint, now + self._ttl_s)
        self._sizes.grew(tenant)
        self._total += 1
        while len(pins) > self._per_tenant:
            self._drop(tenant, pins, next(iter(pins)))
        while self._total > self._max:
            largest = self._sizes.a_largest()
            held = self._tenants[largest]
            self._drop(largest, held, next(iter(held)))

    def get(self, tenant: str, response_id: str) -> str | None:
        pins = self._tenants.get(tenant)
        found = pins.get(response_id) if pins is not None else None
        if found is None:
            return None
        assert pins is not None
        endpoint, until = found
        if self._clock() >= until:
            self._drop(tenant, pins, response_id)
            return None
        return endpoint

    def __len__(self) -> int:
        return self._total

    def held_by(self, tenant: str) -> int:
        return len(self._tenants.get(tenant, ()))

    def _drop(self, tenant: str, pins: OrderedDict[str, tuple[str, float]], key: str) -> None:
        del pins[key]
        self._sizes.shrank(tenant)
        self._total -= 1
        if not pins:
            del self._tenants[tenant]

    def _expire(self, tenant: str, pins: OrderedDict[str, tuple[str, float]], now: float) -> None:
        """Forget ``tenant``'s expired pins at the old end (insertion order is expiry order)."""
        while pins:
            oldest = next(iter(pins))
            if pins[oldest][1] > now:
                return
            self._drop(tenant, pins, oldest)


# Write one pin, index it among its tenant's by the time Redis gives, and forget the
# tenant's expired and oldest ids beyond the bound. KEYS: the pin, the tenant's index.
# ARGV: endpoint, ttl (s), id, bound, the prefix of the tenant's pin keys.
_PIN = """
if redis.replicate_commands then redis.replicate_commands() end
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
local ttl = tonumber(ARGV[2])
redis.call('SET', KEYS[1], ARGV[1], 'EX', ttl)
redis.call('ZADD', KEYS[2], now, ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - ttl)
local over = redis.call('ZCARD', KEYS[2]) - tonumber(ARGV[4])
if over > 0 then
  local oldest = redis.call('ZRANGE', KEYS[2], 0, over - 1)
  redis.call('ZREMRANGEBYRANK', KEYS[2], 0, over - 1)
  for _, id in ipairs(oldest) do redis.call('DEL', ARGV[5] .. id) end
end
redis.call('EXPIRE', KEYS[2], ttl)
return math.max(over, 0)
"""


class RedisPins:
    """Pins every replica sees, under their tenant. Each replica keeps its own pins in
    memory too, and reads them when Redis fails. ``dropped`` is told how many writes could
    not be made, and why (``queue_full``, ``redis_error``)."""

    def __init__(
        self,
        url: str,
        namespace: str,
        ttl_s: float,
        *,
        password: str | None = None,
        per_tenant: int = PER_TENANT,
        local: MemoryPins | None = None,
        dropped: Callable[[str, int], None] | None = None,
        max_queued: int = MAX_QUEUED,
    ) -> None:
        self._redis = connect(url, password, blocking=True)
        self._namespace = namespace
        self._ttl = max(1, math.ceil(ttl_s))
        self._per_tenant = per_tenant
        self._local = local or MemoryPins(ttl_s, per_tenant=per_tenant)
        self._dropped = dropped or (lambda reason, n: None)
        self._script = self._redis.register_script(_PIN)
        self._queue: collections.deque[tuple[str, str, str]] = collections.deque()
        self._max_queued = max_queued
        self._wake = asyncio.Event()
        self._writer: asyncio.Task[None] | None = None
        self._closing = False
        self._full_logged = False

    def _pin_key(self, tenant: str, response_id: str) -> str:
        return f"{self._namespace}:pin:{{{tenant}}}:{response_id}"

    async def remember(self, tenant: str, response_id: str, endpoint: str) -> None:
        self._local.put(tenant, response_id, endpoint)
        try:
            await self._write(self._redis, tenant, response_id, endpoint)
        except FAILURES as exc:
            self._lost("redis_error", 1, exc)

    def keep(self, tenant: str, response_id: str, endpoint: str) -> None:
        self._local.put(tenant, response_id, endpoint)
        if len(self._queue) >= self._max_queued:
            self._dropped("queue_full", 1)
            if not self._full_logged:
                self._full_logged = True
                log.warning(
                    "response pins: %d writes already wait for Redis; dropping new ones",
                    len(self._queue),
                )
            return
        self._queue.append((tenant, response_id, endpoint))
        self._wake.set()
        if self._writer is None or self._writer.done():
            self._writer = asyncio.get_running_loop().create_task(
                self._write_queued(), name="response-pins"
            )

    async def where(self, tenant: str, response_id: str) -> str | None:
        try:
            found = await self._redis.get(self._pin_key(tenant, response_id))
        except FAILURES as exc:
            log.warning("could not read the pin of %s: %s", response_id, exc)
            return self._local.get(tenant, response_id)
        if isinstance(found, bytes):
            return found.decode(errors="replace")
        return self._local.get(tenant, response_id)  # a Redis that restarted empty

    async def close(self) -> None:
        """Finish the queued writes, then disconnect."""
        self._closing = True
        self._wake.set()
        if self._writer is not None:
            await asyncio.gather(self._writer, return_exceptions=True)
        await self._redis.aclose()

    async def _write(self, client: Any, tenant: str, response_id: str, endpoint: str) -> Any:
        keys = [self._pin_key(tenant, response_id), f"{self._namespace}:pins:{{{tenant}}}"]
        prefix = self._pin_key(tenant, "")
        args: list[bytes | str | int] = [endpoint, self._ttl, response_id, self._per_tenant, prefix]
        return await self._script(keys=keys, args=args, client=client)

    async def _write_queued(self) -> None:
        """Send the queued writes, up to ``BATCH`` a pipeline, until closed and emptied."""
        while True:
            if not self._queue:
                if self._closing:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            batch = [self._queue.popleft() for _ in range(min(BATCH, len(self._queue)))]
            if not await self._send(batch) and self._closing:
                # shutting down with Redis failing: the rest would fail as slowly
                self._lost("redis_error", len(self._queue), "not tried: closing")
                self._queue.clear()

    async def _send(self, batch: list[tuple[str, str, str]]) -> bool:
        """Write ``batch`` in one pipeline; False when Redis failed it whole."""
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for tenant, response_id, endpoint in batch:
                    await self._write(pipe, tenant, response_id, endpoint)
                results = list(await pipe.execute(raise_on_error=False))
        except FAILURES as exc:
            self._lost("redis_error", len(batch), exc)
            return False
        failed = [r for r in results if isinstance(r, Exception)]
        if failed:
            self._lost("redis_error", len(failed), failed[0])
        else:
            self._full_logged = False
        return True

    def _lost(self, reason: str, n: int, why: object) -> None:
        if n:
            self._dropped(reason, n)
            log.warning("response pins: %d write(s) not shared through Redis: %s", n, why)
