"""Where each stored Responses API response lives: response id -> the base URL of the
upstream endpoint that answered it.

vLLM keeps a stored response (``store: true``, the default) in the memory of the server that
made it, and only that server knows it: a request that continues it (``previous_response_id``)
or reads, deletes or cancels it (``GET``/``DELETE /v1/responses/{id}``,
``POST /v1/responses/{id}/cancel``) must go there, whatever rung the request's slice is on.
The gateway remembers the endpoint of every response id it relays, for
``SPECLANE_RESPONSE_PIN_TTL_S``: in this process (``MemoryPins``, bounded, the oldest
forgotten first), or in Redis when replicas share state (``RedisPins``, ``SET`` with ``EX``
under ``<namespace>:pin:``), so that any replica sends a follow-up where the first answer
came from. Redis unreachable: a replica goes on with what it remembers itself.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from redis.exceptions import RedisError

from gateway.state.redisclient import connect

log = logging.getLogger(__name__)

MAX_ID_CHARS = 256


class ResponsePins(Protocol):
    """Response id -> the upstream base URL that answered it."""

    async def remember(self, response_id: str, endpoint: str) -> None: ...

    def keep(self, response_id: str, endpoint: str) -> None:
        """``remember`` without waiting, for the request path: known here at once, the
        write anywhere else scheduled."""
        ...

    async def where(self, response_id: str) -> str | None: ...

    async def close(self) -> None: ...


def valid_id(response_id: object) -> bool:
    """An id worth looking up: a short printable string."""
    return (
        isinstance(response_id, str)
        and 0 < len(response_id) <= MAX_ID_CHARS
        and response_id.isprintable()
    )


async def pinned_endpoint(pins: ResponsePins, body: Mapping[str, Any]) -> str | None:
    """Where a ``POST /v1/responses`` body's ``previous_response_id`` lives; None when it
    names none or one the gateway does not know."""
    previous = body.get("previous_response_id")
    if not valid_id(previous):
        return None
    assert isinstance(previous, str)
    return await pins.where(previous)


class MemoryPins:
    """Pins in this process: at most ``max_entries``, each for ``ttl_s`` of ``clock``."""

    def __init__(
        self,
        ttl_s: float = 86_400.0,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_entries: int = 100_000,
    ) -> None:
        self._ttl_s = ttl_s
        self._clock = clock
        self._max = max_entries
        self._pins: OrderedDict[str, tuple[str, float]] = OrderedDict()

    async def remember(self, response_id: str, endpoint: str) -> None:
        self.put(response_id, endpoint)

    def keep(self, response_id: str, endpoint: str) -> None:
        self.put(response_id, endpoint)

    async def where(self, response_id: str) -> str | None:
        return self.get(response_id)

    async def close(self) -> None:
        pass

    def put(self, response_id: str, endpoint: str) -> None:
        now = self._clock()
        self._pins.pop(response_id, None)
        self._pins[response_id] = (endpoint, now + self._ttl_s)
        while len(self._pins) > self._max:
            self._pins.popitem(last=False)
        self._expire(now)

    def get(self, response_id: str) -> str | None:
        found = self._pins.get(response_id)
        if found is None:
            return None
        endpoint, until = found
        if self._clock() >= until:
            del self._pins[response_id]
            return None
        return endpoint

    def __len__(self) -> int:
        return len(self._pins)

    def _expire(self, now: float) -> None:
        """Forget the expired pins at the old end (insertion order is expiry order)."""
        while self._pins:
            _, until = next(iter(self._pins.values()))
            if until > now:
                return
            self._pins.popitem(last=False)


class RedisPins:
    """Pins every replica sees: ``SET <namespace>:pin:<id> <endpoint> EX <ttl>``. Each
    replica keeps its own pins in memory too, and reads them when Redis fails."""

    def __init__(
        self,
        url: str,
        namespace: str,
        ttl_s: float,
        *,
        password: str | None = None,
        local: MemoryPins | None = None,
    ) -> None:
        self._redis = connect(url, password)
        self._prefix = f"{namespace}:pin:"
        self._ttl = max(1, math.ceil(ttl_s))
        self._local = local or MemoryPins(ttl_s)
        self._writes: set[asyncio.Task[None]] = set()

    async def remember(self, response_id: str, endpoint: str) -> None:
        self._local.put(response_id, endpoint)
        await self._share(response_id, endpoint)

    def keep(self, response_id: str, endpoint: str) -> None:
        self._local.put(response_id, endpoint)
        write = asyncio.get_running_loop().create_task(self._share(response_id, endpoint))
        self._writes.add(write)
        write.add_done_callback(self._writes.discard)

    async def _share(self, response_id: str, endpoint: str) -> None:
        try:
            await self._redis.set(self._prefix + response_id, endpoint.encode(), ex=self._ttl)
        except (RedisError, OSError) as exc:
            log.warning("could not share the pin of %s: %s", response_id, exc)

    async def where(self, response_id: str) -> str | None:
        try:
            found = await self._redis.get(self._prefix + response_id)
        except (RedisError, OSError) as exc:
            log.warning("could not read the pin of %s: %s", response_id, exc)
            return self._local.get(response_id)
        if isinstance(found, bytes):
            return found.decode(errors="replace")
        return self._local.get(response_id)  # a Redis that restarted empty

    async def close(self) -> None:
        """Finish the writes under way, then disconnect."""
        await asyncio.gather(*self._writes, return_exceptions=True)
        await self._redis.aclose()
