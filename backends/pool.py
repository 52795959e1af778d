"""Pools of endpoints: least-outstanding-requests choice, circuit breakers, and failover.

``Pools.open`` walks the rungs a decision gives (pool names, best first) and returns the
first stream that produced an event. Before that first event any failure moves on: to the
next endpoint of the pool, then to the next pool. A 4xx answer is the request's own fault
and is raised at once. Knows nothing of policies or the gateway: pools are names here.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from backends.breaker import Breaker, BreakerState
from backends.errors import BackendError, Unavailable, UpstreamRejected, UpstreamTimeout
from backends.upstream import Timeouts, Upstream, UpstreamStream

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class PoolSpec:
    """What the backends need to know of one pool."""

    name: str
    model: str
    endpoints: tuple[str, ...]
    k: int | None = None
    timeouts: Timeouts = Timeouts()
    discover: bool = False

    @property
    def speculative(self) -> bool:
        return self.k is not None


@dataclass(slots=True)
class Endpoint:
    """One server of a pool, with its live load and health."""

    url: str
    pool: str
    breaker: Breaker = field(default_factory=Breaker)
    outstanding: int = 0
    picked: int = 0
    failures_total: int = 0


@dataclass(frozen=True, slots=True)
class Attempt:
    """A failed try before the one that served."""

    pool: str
    url: str
    error: str


@dataclass(frozen=True, slots=True)
class Completed:
    """A whole non-streamed answer, and where it came from."""

    spec: PoolSpec
    endpoint: Endpoint
    body: bytes
    attempts: tuple[Attempt, ...]


@dataclass(slots=True)
class Opened:
    """A stream that produced its first event, and where it came from."""

    spec: PoolSpec
    endpoint: Endpoint
    stream: UpstreamStream
    attempts: tuple[Attempt, ...]
    _pools: Pools
    _closed: bool = False

    def close(self, *, failed: bool = False) -> None:
        if self._closed:
            return
        self._closed = True
        self.endpoint.outstanding -= 1
        if failed:
            self._pools.failed(self.endpoint)
        self.stream.close()


class Pools:
    """Every pool by name; owns endpoint state across policy reloads."""

    def __init__(
        self,
        specs: Iterable[PoolSpec],
        upstream: Upstream,
        clock: Callable[[], float],
        *,
        breaker_failures: int = 3,
        breaker_reset_s: float = 5.0,
        tries_per_pool: int = 2,
    ) -> None:
        self._upstream = upstream
        self._clock = clock
        self._breaker = (breaker_failures, breaker_reset_s)
        self._tries_per_pool = tries_per_pool
        self.specs: dict[str, PoolSpec] = {}
        self.endpoints: dict[str, list[Endpoint]] = {}
        self._resolved: dict[str, tuple[str, ...]] = {}
        self.update(specs)

    def update(self, specs: Iterable[PoolSpec]) -> None:
        """Take a new set of pools; endpoints that stay keep their load and breaker."""
        self.specs = {s.name: s for s in specs}
        self._rebuild()

    def resolved(self, pool: str, urls: Iterable[str]) -> None:
        """The addresses discovery found for a pool; an empty answer keeps the last one."""
        found = tuple(urls)
        if found and found != self._resolved.get(pool):
            self._resolved[pool] = found
            self._rebuild()

    def _rebuild(self) -> None:
        known = {(e.pool, e.url): e for group in self.endpoints.values() for e in group}
        self.endpoints = {
            s.name: [
                known.get((s.name, url.rstrip("/"))) or self._endpoint(url, s.name)
                for url in self._urls(s)
            ]
            for s in self.specs.values()
        }

    def _urls(self, spec: PoolSpec) -> tuple[str, ...]:
        if spec.discover and spec.name in self._resolved:
            return self._resolved[spec.name]
        return spec.endpoints

    def _endpoint(self, url: str, pool: str) -> Endpoint:
        failures, reset_s = self._breaker
        return Endpoint(url.rstrip("/"), pool, Breaker(failures, reset_s))

    def candidates(self, pool: str) -> list[Endpoint]:
        """Endpoints whose breaker lets a request through, least outstanding first."""
        now = self._clock()
        ready = [e for e in self.endpoints.get(pool, ()) if e.breaker.allows(now)]
        return sorted(ready, key=lambda e: (e.outstanding, e.picked))

    def failed(self, endpoint: Endpoint) -> None:
        endpoint.failures_total += 1
        endpoint.breaker.failure(self._clock())

    def healthy(self, pool: str) -> bool:
        now = self._clock()
        return any(
            e.breaker.state(now) is not BreakerState.OPEN for e in self.endpoints.get(pool, ())
        )

    async def open(
        self, rungs: Sequence[str], path: str, body: bytes, headers: Mapping[str, str]
    ) -> Opened:
        """The first stream, down ``rungs``, that yields an event."""

        async def attempt(endpoint: Endpoint, spec: PoolSpec) -> UpstreamStream:
            return await self._upstream.open(endpoint.url + path, body, headers, spec.timeouts)

        spec, endpoint, stream, attempts = await self._first(rungs, attempt)
        return Opened(spec, endpoint, stream, attempts, self)

    async def complete(
        self, rungs: Sequence[str], path: str, body: bytes, headers: Mapping[str, str]
    ) -> Completed:
        """The first whole non-streamed answer, down ``rungs``."""

        async def attempt(endpoint: Endpoint, spec: PoolSpec) -> bytes:
            url = endpoint.url + path
            return await self._upstream.complete(url, body, headers, spec.timeouts)

        spec, endpoint, answer, attempts = await self._first(rungs, attempt)
        endpoint.outstanding -= 1
        return Completed(spec, endpoint, answer, attempts)

    async def _first(
        self, rungs: Sequence[str], attempt: Callable[[Endpoint, PoolSpec], Awaitable[T]]
    ) -> tuple[PoolSpec, Endpoint, T, tuple[Attempt, ...]]:
        """Try endpoints down the rungs until one answers; its ``outstanding`` stays raised."""
        attempts: list[Attempt] = []
        errors: list[BackendError] = []
        for name in rungs:
            spec = self.specs.get(name)
            if spec is None:
                continue
            for endpoint in self.candidates(name)[: self._tries_per_pool]:
                try:
                    result = await self._try(endpoint, spec, attempt)
                except UpstreamRejected:
                    raise
                except BackendError as exc:
                    attempts.append(Attempt(name, endpoint.url, str(exc)))
                    errors.append(exc)
                    continue
                return spec, endpoint, result, tuple(attempts)
        raise _summary(errors, attempts)

    async def _try(
        self,
        endpoint: Endpoint,
        spec: PoolSpec,
        attempt: Callable[[Endpoint, PoolSpec], Awaitable[T]],
    ) -> T:
        endpoint.breaker.begin(self._clock())
        endpoint.picked += 1
        endpoint.outstanding += 1
        try:
            result = await attempt(endpoint, spec)
        except UpstreamRejected:
            endpoint.outstanding -= 1
            endpoint.breaker.success()
            raise
        except BaseException as exc:
            endpoint.outstanding -= 1
            if isinstance(exc, BackendError):
                self.failed(endpoint)
            else:  # cancelled: the trial says nothing about the endpoint
                endpoint.breaker.abandon()
            raise
        endpoint.breaker.success()
        return result


def _summary(errors: list[BackendError], attempts: list[Attempt]) -> BackendError:
    tried = "; ".join(f"{a.pool} {a.url}: {a.error}" for a in attempts)
    if not errors:
        return Unavailable("no healthy endpoint in any pool of the ladder")
    if all(isinstance(e, UpstreamTimeout) for e in errors):
        return UpstreamTimeout(f"every upstream timed out ({tried})")
    return Unavailable(f"no upstream could serve the request ({tried})")
