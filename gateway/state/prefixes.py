"""What the gateway sent where, by prompt prefix: block hash -> the base URL of the
endpoint last sent a prompt that holds that block (``gateway/prompt/prints.py``'s chain),
and conversation opening -> the endpoint last sent a turn of that conversation. Hashes and
URLs only, never prompt text.

Not every block of a prompt is remembered: its *checkpoints* are, every
``CHECKPOINT_EVERY``-th block (every 2 KiB of rendering, ~500 tokens) and its last, so a
request adds at most ~130 entries however long its prompt. A lookup (``held``) reads the
prompt's checkpoints, and every block of a short prompt (up to 2 x ``CHECKPOINT_EVERY``
blocks, so that a short conversation's last turn is found): for each endpoint, the most
blocks of the prompt it is believed to hold. A long prompt is matched to within 8 blocks,
which may fall short of where its conversation's opening ends (a long system prompt and a
short exchange since): the opening's own entry (its hash with the top bit set) says which
endpoint was sent the conversation whatever its length.

``MemoryPrefixes`` keeps at most ``max_entries`` (``SPECLANE_PREFIX_MAP_ENTRIES``, 100,000
by default: ~19 MiB, measured by ``bench/prefix_hash.py``; each entry stands for ~2 KiB of
distinct prompt, so 100,000 of them are ~200 MB of prompt text, more than the KV cache of
a pool of several GPUs holds), the least recently sent forgotten first, each for
``ttl_s`` (``SPECLANE_PREFIX_TTL_S``). ``RedisPrefixes`` shares the map between replicas
(``SET <namespace>:px:<hash> <url> EX <ttl>``, one ``MGET`` per lookup), so a turn that
reaches another replica goes where the turn before went: affinity does not depend on the
replica. It keeps its own map too and reads it when Redis fails or is slower to answer a
lookup than ``LOOKUP_S``, and for ``PAUSE_S`` after that, so that a Redis outage or a slow
Redis costs the request path one wait, not one per request; it writes a checkpoint again
only when its own copy is new, points elsewhere or is half its TTL old.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Protocol

from gateway.state.redisclient import FAILURES, connect

log = logging.getLogger(__name__)

CHECKPOINT_EVERY = 8
PAUSE_S = 5.0  # after a failed read, Redis is left alone this long
# the longest a request waits for the shared map: a lookup on the same network takes about
# a millisecond, and one slower than this tells of a Redis in trouble, not of a busy one
LOOKUP_S = 0.1
_INDEX = 32  # a chain entry's block index sits above its 32-bit CRC
_OPENING = 1 << 63


class PrefixMap(Protocol):
    """Block hash -> the endpoint last sent it."""

    async def held(self, chain: Sequence[int], opening: int) -> tuple[dict[str, int], str | None]:
        """Endpoint URL -> how many blocks of ``chain`` it is believed to hold; and the
        endpoint last sent a turn of the conversation ``opening`` opens."""
        ...

    def keep(self, chain: Sequence[int], opening: int, endpoint: str) -> None:
        """``endpoint`` was sent the prompt of ``chain`` that ``opening`` opens: known here
        at once, the write anywhere else scheduled."""
        ...

    async def close(self) -> None: ...


def checkpoints(chain: Sequence[int]) -> list[int]:
    """The chain's entries a request remembers: every ``CHECKPOINT_EVERY``-th and its last."""
    kept = list(chain[CHECKPOINT_EVERY - 1 :: CHECKPOINT_EVERY])
    if chain and (not kept or kept[-1] != chain[-1]):
        kept.append(chain[-1])
    return kept


def probes(chain: Sequence[int]) -> list[int]:
    """The chain's entries a lookup reads, longest first."""
    if len(chain) <= 2 * CHECKPOINT_EVERY:
        return list(reversed(chain))
    return list(reversed(checkpoints(chain)))


def opening_entry(opening: int) -> int:
    """The map's key of a conversation's opening: apart from every chain entry."""
    return _OPENING | opening


def blocks_of(entry: int) -> int:
    """How many blocks the prefix ending at chain entry ``entry`` covers."""
    return (entry >> _INDEX) + 1


class MemoryPrefixes:
    """The map in this process: at most ``max_entries``, each for ``ttl_s`` of ``clock``."""

    def __init__(
        self,
        ttl_s: float = 1800.0,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_entries: int = 100_000,
    ) -> None:
        self._ttl_s = ttl_s
        self._clock = clock
        self._max = max_entries
        self._map: OrderedDict[int, tuple[str, float]] = OrderedDict()

    async def held(self, chain: Sequence[int], opening: int) -> tuple[dict[str, int], str | None]:
        return self.lookup(probes(chain)), self.at(opening_entry(opening))

    def keep(self, chain: Sequence[int], opening: int, endpoint: str) -> None:
        self.put([*checkpoints(chain), opening_entry(opening)], endpoint)

    async def close(self) -> None:
        pass

    def lookup(self, entries: Sequence[int]) -> dict[str, int]:
        """Endpoint -> the most blocks it holds, of ``entries`` (longest first)."""
        found: dict[str, int] = {}
        now = self._clock()
        for entry in entries:
            value = self._map.get(entry)
            if value is not None and value[1] > now and value[0] not in found:
                found[value[0]] = blocks_of(entry)
        return found

    def at(self, entry: int) -> str | None:
        value = self._map.get(entry)
        return value[0] if value is not None and value[1] > self._clock() else None

    def put(self, entries: Sequence[int], endpoint: str) -> list[int]:
        """Remember ``entries`` on ``endpoint``; the ones that were not there already, or
        were half their TTL old (what a shared map should write again)."""
        now = self._clock()
        until = now + self._ttl_s
        fresh: list[int] = []
        for entry in entries:
            old = self._map.pop(entry, None)
            if old is None or old[0] != endpoint or old[1] - now < self._ttl_s / 2:
                fresh.append(entry)
                old = (endpoint, until)
            self._map[entry] = old
        while len(self._map) > self._max:
            self._map.popitem(last=False)
        return fresh

    def __len__(self) -> int:
        return len(self._map)


def _found(entries: Sequence[int], values: Sequence[object]) -> tuple[dict[str, int], str | None]:
    """What one ``MGET`` of a conversation's opening and then ``entries`` found, as
    ``PrefixMap.held`` says; a reply of another length raises ``ValueError``."""
    found: dict[str, int] = {}
    for entry, value in zip(entries, values[1:], strict=True):
        if isinstance(value, bytes):
            found.setdefault(value.decode(errors="replace"), blocks_of(entry))
    opened = values[0]
    return found, opened.decode(errors="replace") if isinstance(opened, bytes) else None


class RedisPrefixes:
    """The map every replica sees, with this replica's own as the fallback."""

    def __init__(
        self,
        url: str,
        namespace: str,
        ttl_s: float,
        *,
        password: str | None = None,
        local: MemoryPrefixes | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._redis = connect(url, password)
        self._clock = clock
        self._paused_until = -math.inf
        self._prefix = f"{namespace}:px:"
        self._ttl = max(1, math.ceil(ttl_s))
        self._local = local or MemoryPrefixes(ttl_s)
        self._writes: set[asyncio.Task[None]] = set()

    def _key(self, entry: int) -> str:
        return f"{self._prefix}{entry:x}"

    async def held(self, chain: Sequence[int], opening: int) -> tuple[dict[str, int], str | None]:
        entries = probes(chain)
        first = opening_entry(opening)
        if self._clock() < self._paused_until:
            return self._local.lookup(entries), self._local.at(first)
        try:
            keys = [self._key(e) for e in (first, *entries)]
            return _found(entries, await asyncio.wait_for(self._redis.mget(keys), LOOKUP_S))
        except FAILURES as exc:  # TimeoutError among them
            log.warning("could not read the prefix map (own map for %.0f s): %s", PAUSE_S, exc)
            self._paused_until = self._clock() + PAUSE_S
            return self._local.lookup(entries), self._local.at(first)

    def keep(self, chain: Sequence[int], opening: int, endpoint: str) -> None:
        fresh = self._local.put([*checkpoints(chain), opening_entry(opening)], endpoint)
        if not fresh:
            return
        write = asyncio.get_running_loop().create_task(self._share(fresh, endpoint))
        self._writes.add(write)
        write.add_done_callback(self._writes.discard)

    async def _share(self, entries: Sequence[int], endpoint: str) -> None:
        try:
            async with self._redis.pipeline(transaction=False) as pipe:
                for entry in entries:
                    pipe.set(self._key(entry), endpoint.encode(), ex=self._ttl)
                await pipe.execute()
        except FAILURES as exc:
            log.warning("could not share the prefix map: %s", exc)

    async def close(self) -> None:
        """Finish the writes under way, then disconnect."""
        await asyncio.gather(*self._writes, return_exceptions=True)
        await self._redis.aclose()
