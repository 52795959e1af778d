"""Pools of endpoints: least-outstanding-requests choice (or, for a request whose prompt
is known, the endpoint that holds its prefix under a load bound: ``backends/placement.py``),
outlier ejection, and failover.

``Pools.open`` walks the rungs a decision gives (pool names, best first) and returns the
first stream that produced an event. Before that first event any failure moves on: to the
next endpoint of the pool, then to the next pool, then to ejected endpoints as a last
resort (``_plan``). A 4xx answer is the request's own fault and is raised at once.

``Pools.complete`` is the one way to a whole answer, with one of two readers: the body of a
request asked for non-streamed, or a stream folded into one answer by the caller's
``Assemble`` (the gateway's relay, which measures each try as it comes). Nothing of a whole
answer reaches the client before it is done, so one that broke part way starts a fresh plan
within a budget (``backends/retries.py``): breaks and re-planning live in ``_first``, for
both readers. A body has nothing to show before it is done, so one awaited from an endpoint
that gets ejected meanwhile (its streams timed out, its metrics page stopped answering) is
given up at once and tried elsewhere, instead of waiting out ``total_s`` on a hung server.

Every outcome feeds the endpoint's outlier record (``backends/outlier.py``): failures
before the first event at once, a stream's when it is closed, and a failure the request may
have caused itself (a 500 in the engine's error shape, ``Unavailable.suspect``) once the
tries are over, by whether another endpoint served the same request or the endpoint fails
other requests too (``_first``).

``Pools.exchange`` sends a request of any method down the rungs the same way and passes its
answer on as it came (the engine's other routes); ``pinned=`` sends a request to the one
endpoint that holds what it refers to (a stored response). Knows nothing of policies or the
gateway: pools are names here.

A request's tries share one deadline (``Pools.deadline``: the first rung's ``total_s`` from
when it came): no try starts after it, every wait and read of one ends there, and when it
has passed with no answer the request ends with ``UpstreamTimeout``. A try answered 200 with
no answer (``BadAnswer``: not JSON, too large) fails over like a 5xx; when every try did,
the request ends with ``BadAnswer``, when every try was told to wait (429), with a 429.
The ``Retry-After`` a client is told is ``RETRY_AFTER_S``, or the largest an upstream sent
when that is later: never sooner than an upstream asked, and otherwise short, since the
``openai`` and ``anthropic`` clients sleep on it before each of their retries, and a request
that comes while every endpoint is ejected is still tried on them.

Why one module past 600 lines: the walk down the rungs, its failover, the break budget, the
deadline and the outlier accounting share one piece of state per try (an endpoint's
outstanding count, raised by ``_try`` and lowered by whoever finishes the answer); split,
that count would be raised in one module and lowered in another. Endpoint choice by cache
(``placement.py``) and outlier rules (``outlier.py``) already live apart.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import orjson

from backends.errors import (
    AnswerTimeout,
    BackendError,
    BadAnswer,
    BreaksSpent,
    StreamBroken,
    Unavailable,
    UpstreamRejected,
    UpstreamTimeout,
)
from backends.outlier import Detector, Health, HealthState, OutlierRules
from backends.placement import Affinity, Placed, place
from backends.retries import BreakBudget
from backends.upstream import DATA, Opening, Reply, Timeouts, Upstream, UpstreamStream, past

T = TypeVar("T")

# Seconds a client is told to wait when every try failed and no upstream asked for longer.
RETRY_AFTER_S = 1.0


@dataclass(frozen=True, slots=True)
class PoolSpec:
    """What the backends need to know of one pool."""

    name: str
    model: str
    endpoints: tuple[str, ...]
    k: int | None = None
    timeouts: Timeouts = Timeouts()
    discover: bool = False
    engine: str = "vllm"

    @property
    def speculative(self) -> bool:
        return self.k is not None


@dataclass(slots=True)
class InFlight:
    """Requests in flight on one endpoint, and their exact integral over time (the load the
    endpoint carried: its mean over any span is the integral's growth over the span)."""

    clock: Callable[[], float]
    count: int = 0
    integral: float = 0.0
    at: float = 0.0

    def move(self, count: int) -> None:
        now = self.clock()
        self.integral += self.count * max(now - self.at, 0.0)
        self.at, self.count = now, count

    def area(self) -> float:
        """The integral up to now."""
        return self.integral + self.count * max(self.clock() - self.at, 0.0)


@dataclass(slots=True)
class Endpoint:
    """One server of a pool, with its live load and health."""

    url: str
    pool: str
    health: Health = field(default_factory=Health)
    last_pick: int = 0
    waiting: set[asyncio.Timeout] = field(default_factory=set)  # whole answers awaited
    load: InFlight = field(default_factory=lambda: InFlight(time.monotonic))
    prefilling: int = 0  # prompt tokens its tries await a first event (or a whole body) for

    @property
    def outstanding(self) -> int:
        """Requests sent to it and not yet answered."""
        return self.load.count

    @outstanding.setter
    def outstanding(self, count: int) -> None:
        self.load.move(count)


@dataclass(frozen=True, slots=True)
class Attempt:
    """A failed try before the one that served."""

    pool: str
    url: str
    error: str


@dataclass(frozen=True, slots=True)
class Completed:
    """A whole answer (its bytes and the JSON object they hold), read as a body or
    assembled from a stream, and where it came from."""

    spec: PoolSpec
    endpoint: Endpoint
    body: bytes
    answer: dict[str, Any]
    attempts: tuple[Attempt, ...]
    placed: Placed | None = None


@dataclass(frozen=True, slots=True)
class Exchanged:
    """An answer passed on as it came (``Pools.exchange``), and where it came from."""

    spec: PoolSpec
    endpoint: Endpoint
    reply: Reply
    attempts: tuple[Attempt, ...]


@dataclass(slots=True)
class Opened:
    """A stream that produced its first event, and where it came from; ``placed``: how
    its endpoint was chosen when it was the one placed first (``backends/placement.py``),
    None when failover took it elsewhere."""

    spec: PoolSpec
    endpoint: Endpoint
    stream: UpstreamStream
    attempts: tuple[Attempt, ...]
    _pools: Pools
    _closed: bool = False
    placed: Placed | None = None

    def close(self, *, failed: bool = False) -> None:
        """Release the stream; a failed one counts against its endpoint, a finished one for
        it, one the client abandoned neither way."""
        if self._closed:
            return
        self._closed = True
        self.endpoint.outstanding -= 1
        if failed:
            self._pools.failed(self.endpoint)
        elif self.stream.done:
            self._pools.succeeded(self.endpoint)
        self.stream.close()


# Folds an opened stream into one answer, and closes it (``Opened.close`` counts the
# outcome for its endpoint): ``StreamBroken`` when it broke, ``UpstreamRejected`` when it
# reported a client error late.
Assemble = Callable[[Opened], Awaitable[dict[str, Any]]]
_Read = tuple[bytes, dict[str, Any]] | UpstreamStream  # a try's answer, or its open stream


class Pools:
    """Every pool by name; owns endpoint state across policy reloads."""

    def __init__(
        self,
        specs: Iterable[PoolSpec],
        upstream: Upstream,
        clock: Callable[[], float],
        *,
        outlier: OutlierRules | None = None,
        tries_per_pool: int = 2,
    ) -> None:
        self._upstream = upstream
        self._clock = clock
        self._detector = Detector(outlier or OutlierRules())
        self._tries_per_pool = tries_per_pool
        self._next_sweep: dict[str, float] = {}
        self._picks = 0
        self.specs: dict[str, PoolSpec] = {}
        self.endpoints: dict[str, list[Endpoint]] = {}
        self._resolved: dict[str, tuple[str, ...]] = {}
        self.update(specs)

    def update(self, specs: Iterable[PoolSpec]) -> None:
        """Take a new set of pools; endpoints that stay keep their load and health."""
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
                known.get((s.name, url.rstrip("/")))
                or Endpoint(url.rstrip("/"), s.name, load=InFlight(self._clock))
                for url in self._urls(s)
            ]
            for s in self.specs.values()
        }

    def _urls(self, spec: PoolSpec) -> tuple[str, ...]:
        if spec.discover and spec.name in self._resolved:
            return self._resolved[spec.name]
        return spec.endpoints

    # --- health ----------------------------------------------------------------------------

    def candidates(self, pool: str) -> list[Endpoint]:
        """Endpoints in service, best first: least outstanding requests (a returning
        endpoint's count weighs more while it ramps up), then least recently picked."""
        now = self._clock()
        self._sweep(pool, now)
        slow_start_s = self._detector.rules.slow_start_s
        serving = [e for e in self.endpoints.get(pool, ()) if not e.health.ejected(now)]
        return sorted(
            serving,
            key=lambda e: ((e.outstanding + 1) / e.health.weight(now, slow_start_s), e.last_pick),
        )

    def _weight(self, endpoint: Endpoint) -> float:
        return endpoint.health.weight(self._clock(), self._detector.rules.slow_start_s)

    def ejected(self, pool: str) -> list[Endpoint]:
        """Endpoints out of service, the one due back soonest first."""
        now = self._clock()
        out = [e for e in self.endpoints.get(pool, ()) if e.health.ejected(now)]
        return sorted(out, key=lambda e: e.health.ejected_until)

    def healthy(self, pool: str) -> bool:
        """The one view of a pool's health: some endpoint of it is in service."""
        now = self._clock()
        self._sweep(pool, now)
        return any(not e.health.ejected(now) for e in self.endpoints.get(pool, ()))

    def endpoint(self, url: str) -> Endpoint | None:
        """The endpoint at ``url`` in any pool, in service or not; None when no pool has it
        (the policy or discovery dropped it)."""
        url = url.rstrip("/")
        return next((e for group in self.endpoints.values() for e in group if e.url == url), None)

    def urls(self, rungs: Sequence[str]) -> list[str]:
        """Every endpoint of the ladder, in service or not."""
        return [e.url for name in dict.fromkeys(rungs) for e in self.endpoints.get(name, ())]

    def state(self, endpoint: Endpoint) -> HealthState:
        return endpoint.health.state(self._clock(), self._detector.rules)

    def failed(self, endpoint: Endpoint) -> None:
        group = [e.health for e in self.endpoints.get(endpoint.pool, ())]
        now = self._clock()
        self._detector.failure(endpoint.health, group, now)
        _give_up_if_ejected(endpoint, now)

    def succeeded(self, endpoint: Endpoint) -> None:
        self._detector.success(endpoint.health, self._clock())

    def _suspected(self, endpoint: Endpoint, body: int) -> None:
        """``endpoint`` failed a request, whose body hashes to ``body``, that no endpoint
        served, in a way the request may have caused (``Detector.suspect``)."""
        group = [e.health for e in self.endpoints.get(endpoint.pool, ())]
        now = self._clock()
        if self._detector.suspect(endpoint.health, group, now, body):
            _give_up_if_ejected(endpoint, now)

    def _sweep(self, pool: str, now: float) -> None:
        due = self._next_sweep.setdefault(pool, now + self._detector.rules.interval_s)
        if now >= due:
            self._next_sweep[pool] = now + self._detector.rules.interval_s
            self._detector.sweep([e.health for e in self.endpoints.get(pool, ())], now)
            for endpoint in self.endpoints.get(pool, ()):
                _give_up_if_ejected(endpoint, now)

    # --- requests --------------------------------------------------------------------------

    def deadline(self, rungs: Sequence[str]) -> float:
        """When a request down ``rungs`` that comes now must be answered, in the event loop's
        time: its first rung's ``total_s`` from now, every try included."""
        first = next((self.specs[r] for r in rungs if r in self.specs), None)
        total_s = (first.timeouts if first is not None else Timeouts()).total_s
        return asyncio.get_running_loop().time() + total_s

    async def open(
        self,
        rungs: Sequence[str],
        path: str,
        body: bytes | Callable[[PoolSpec], bytes],
        headers: Mapping[str, str],
        deadline: float | None = None,
        avoid: Collection[str] = (),
        *,
        opening: Opening = DATA,
        pinned: str | None = None,
        affinity: Affinity | None = None,
    ) -> Opened:
        """The first stream, down ``rungs``, that yields an event by ``deadline`` (by default
        ``Pools.deadline``), whose reads end there too; ``body`` may depend on the pool (an
        engine that needs a field the others refuse). ``opening``: how its API's stream
        opens (``UpstreamStream``); ``pinned``: the one endpoint that may serve it
        (``_plan``); ``affinity``: what places it by cache within each pool
        (``backends/placement.py``)."""
        until = self.deadline(rungs) if deadline is None else deadline

        async def attempt(endpoint: Endpoint, spec: PoolSpec) -> UpstreamStream:
            sent = body(spec) if callable(body) else body
            url = endpoint.url + path
            return await self._upstream.open(url, sent, headers, spec.timeouts, until, opening)

        spec, endpoint, stream, attempts, placed = await self._first(
            rungs, attempt, avoid, until, pinned=pinned, body=body, affinity=affinity
        )
        return Opened(spec, endpoint, stream, attempts, self, placed=placed)

    async def complete(
        self,
        rungs: Sequence[str],
        path: str,
        body: bytes | Callable[[PoolSpec], bytes],
        headers: Mapping[str, str],
        deadline: float | None = None,
        avoid: Collection[str] = (),
        budget: BreakBudget | None = None,
        *,
        pinned: str | None = None,
        affinity: Affinity | None = None,
        assemble: Assemble | None = None,
    ) -> Completed:
        """The first whole answer, down ``rungs``, by ``deadline`` (by default
        ``Pools.deadline``), read one of two ways: a non-streamed request's body, or, with
        ``assemble``, a stream folded into one answer by it (``body`` then asks for a
        stream). An answer that broke part way is tried again on a fresh plan while
        ``budget`` allows (``_first``); when it no longer does, an assembled answer ends
        with ``BreaksSpent`` and a body with what every try failed with. ``pinned`` and
        ``affinity`` as for ``open``."""
        until = self.deadline(rungs) if deadline is None else deadline
        if assemble is None:
            attempt, then = self._body(path, body, headers, until), None
        else:
            attempt, then = self._stream(path, body, headers, until), _assembled(assemble, self)
        try:
            spec, endpoint, answer, attempts, placed = await self._first(
                rungs,
                attempt,
                avoid,
                until,
                budget,
                pinned=pinned,
                body=body,
                then=then,
                affinity=affinity,
            )
        except BackendError:
            if assemble is None or budget is None or not budget.ran_out:
                raise
            raise BreaksSpent(len(budget.broke)) from None
        assert not isinstance(answer, UpstreamStream)  # ``then`` read it whole
        if assemble is None:  # an assembled stream was counted when it closed
            endpoint.outstanding -= 1
            self.succeeded(endpoint)
        return Completed(spec, endpoint, *answer, attempts, placed)

    def _body(
        self,
        path: str,
        body: bytes | Callable[[PoolSpec], bytes],
        headers: Mapping[str, str],
        until: float,
    ) -> Callable[[Endpoint, PoolSpec], Awaitable[_Read]]:
        """A try that asks for the answer whole and reads its body: given up at once when
        its endpoint is ejected meanwhile (``_give_up_if_ejected``)."""

        async def attempt(endpoint: Endpoint, spec: PoolSpec) -> _Read:
            sent = body(spec) if callable(body) else body
            waiting = asyncio.timeout(None)
            try:
                async with waiting:
                    endpoint.waiting.add(waiting)
                    try:
                        url = endpoint.url + path
                        timeouts = spec.timeouts
                        return await self._upstream.complete(url, sent, headers, timeouts, until)
                    finally:
                        endpoint.waiting.discard(waiting)
            except TimeoutError:
                if not waiting.expired():
                    raise
                given_up = "its endpoint was ejected while the answer was awaited"
                raise Unavailable(given_up) from None

        return attempt

    def _stream(
        self,
        path: str,
        body: bytes | Callable[[PoolSpec], bytes],
        headers: Mapping[str, str],
        until: float,
    ) -> Callable[[Endpoint, PoolSpec], Awaitable[_Read]]:
        """A try that opens a stream, to be assembled (``_assembled``)."""

        async def attempt(endpoint: Endpoint, spec: PoolSpec) -> _Read:
            sent = body(spec) if callable(body) else body
            url = endpoint.url + path
            return await self._upstream.open(url, sent, headers, spec.timeouts, until)

        return attempt

    async def exchange(
        self,
        rungs: Sequence[str],
        method: str,
        path: str,
        body: bytes,
        headers: Mapping[str, str],
        *,
        pinned: str | None = None,
        json: bool = False,
    ) -> Exchanged:
        """The first answer, down ``rungs``, passed on as it came: a request to one of the
        engine's other routes. ``pinned`` as for ``open``; ``json``: the route answers a JSON
        object, and a success that is none fails over (``Upstream.exchange``)."""

        until = self.deadline(rungs)

        async def attempt(endpoint: Endpoint, spec: PoolSpec) -> Reply:
            url = endpoint.url + path
            timeouts = spec.timeouts
            return await self._upstream.exchange(
                method, url, body, headers, timeouts, until, json=json
            )

        spec, endpoint, reply, attempts, _ = await self._first(
            rungs, attempt, (), until, pinned=pinned, body=body
        )
        endpoint.outstanding -= 1
        self.succeeded(endpoint)
        return Exchanged(spec, endpoint, reply, attempts)

    def _plan(
        self,
        rungs: Sequence[str],
        avoid: Collection[str],
        pinned: str | None = None,
        affinity: Affinity | None = None,
        placed: dict[str, Placed] | None = None,
    ) -> list[tuple[PoolSpec, Endpoint]]:
        """Whom to try, in order: up to ``tries_per_pool`` endpoints in service per rung, down
        the ladder; then, as a last resort, ejected endpoints in place of those a pool lacks
        (so a request is never tried on fewer endpoints than without ejection, and a ladder
        that is all ejected is still tried); then one endpoint the caller asked to avoid.

        A ``pinned`` request (one whose state lives on one endpoint: a stored response) is
        tried there and nowhere else, whatever its rungs say; the rungs' pools are looked in
        first, then every pool. With an ``affinity``, each pool's endpoints in service are
        tried in the order ``place`` gives, and ``placed`` learns how each pool's first one
        was chosen."""
        if pinned is not None:
            names = [*dict.fromkeys(rungs), *self.endpoints]
            return [
                (self.specs[name], e)
                for name in dict.fromkeys(names)
                if name in self.specs
                for e in self.endpoints.get(name, ())
                if e.url == pinned.rstrip("/")
            ][:1]
        n = self._tries_per_pool
        first: list[tuple[PoolSpec, Endpoint]] = []
        last: list[tuple[PoolSpec, Endpoint]] = []
        avoided: list[tuple[PoolSpec, Endpoint]] = []
        for name in dict.fromkeys(rungs):
            spec = self.specs.get(name)
            if spec is None:
                continue
            serving = [e for e in self.candidates(name) if e.url not in avoid]
            if affinity is not None and serving:
                serving, how = place(serving, affinity, self._weight, name)
                if placed is not None:
                    placed[serving[0].url] = how
            ejected = [e for e in self.ejected(name) if e.url not in avoid]
            first += [(spec, e) for e in serving[:n]]
            last += [(spec, e) for e in ejected[: max(n - len(serving), 0)]]
            avoided += [(spec, e) for e in self.endpoints[name] if e.url in avoid]
        return first + last + avoided[:1]

    async def _first(
        self,
        rungs: Sequence[str],
        attempt: Callable[[Endpoint, PoolSpec], Awaitable[T]],
        avoid: Collection[str],
        deadline: float,
        budget: BreakBudget | None = None,
        *,
        pinned: str | None = None,
        body: bytes | Callable[[PoolSpec], bytes] = b"",
        affinity: Affinity | None = None,
        then: Callable[[PoolSpec, Endpoint, T], Awaitable[T]] | None = None,
    ) -> tuple[PoolSpec, Endpoint, T, tuple[Attempt, ...], Placed | None]:
        """Try endpoints down the rungs until one answers, none starting after ``deadline``;
        its ``outstanding`` stays raised. ``then``: what a try goes on to do once ``attempt``
        succeeded (assemble the stream it opened, whose close then counts its outcome and
        lowers ``outstanding``); what it raises is the try's failure, the same as what
        ``attempt`` raises. With a ``budget``, an answer that broke part
        way starts a fresh plan (the endpoints whose answers broke last) while the budget
        allows, and ends the tries when not; one that ran out of the request's time ends
        them by the deadline. Last: how the endpoint that answered was placed, when it was
        placed first in its pool.

        A failure the request may have caused (``Unavailable.suspect``) is judged once the
        tries are over: a failure of its endpoint when another endpoint then served the
        request; when none did, not at all if the endpoints that failed it alike serve
        others (``Detector.own``), else by whether the endpoint fails other bodies too
        (``Detector.suspect``, given the hash of the ``body`` it was sent); not at all when
        an endpoint refused the request with a 4xx."""
        attempts: list[Attempt] = []
        errors: list[BackendError] = []
        suspects: list[tuple[PoolSpec, Endpoint]] = []  # failures the request may have caused
        placed: dict[str, Placed] = {}
        plan = self._plan(rungs, avoid, pinned, affinity, placed)
        while plan and not past(deadline):
            spec, endpoint = plan.pop(0)
            try:
                prefill = affinity.uncached(endpoint.url) if affinity is not None else 0
                result = await self._try(endpoint, spec, attempt, prefill)
                if then is not None:
                    result = await then(spec, endpoint, result)
            except UpstreamRejected as exc:
                exc.pool = spec.name
                raise  # the request is wrong: the suspects' failures were its own
            except BackendError as exc:
                attempts.append(Attempt(spec.name, endpoint.url, str(exc)))
                # kept without its traceback, whose frames (this one among them) would make a
                # cycle holding what each try had read until a rare full collection
                errors.append(exc.with_traceback(None))
                if _suspect(exc):
                    suspects.append((spec, endpoint))
                if _broke(exc) and budget is not None:
                    again = budget.spend(endpoint.url, self._clock())
                    avoided = budget.avoid(self.urls(rungs))
                    plan = self._plan(rungs, avoided, pinned, affinity) if again else []
                continue
            for _, failed in suspects:  # they failed what another endpoint served
                self.failed(failed)
            return spec, endpoint, result, tuple(attempts), placed.get(endpoint.url)
        if suspects and not self._detector.own([e.health for _, e in suspects], self._clock()):
            for failed_spec, failed in suspects:
                sent = body(failed_spec) if callable(body) else body
                self._suspected(failed, hash(sent))
        error = _summary(errors, attempts, late=bool(plan) or past(deadline))
        told = [e.told_s for e in errors if isinstance(e, Unavailable) and e.told_s is not None]
        error.retry_after_s = max([RETRY_AFTER_S, *told])
        raise error

    async def _try(
        self,
        endpoint: Endpoint,
        spec: PoolSpec,
        attempt: Callable[[Endpoint, PoolSpec], Awaitable[T]],
        prefill: int = 0,
    ) -> T:
        """One try; ``prefill``: the prompt tokens the endpoint is expected to prefill for
        it, counted in ``Endpoint.prefilling`` until the try's first event (a stream opened)
        or its whole body (``backends/placement.py`` weighs the queue)."""
        self._picks += 1
        endpoint.last_pick = self._picks
        endpoint.outstanding += 1
        endpoint.prefilling += prefill
        try:
            return await attempt(endpoint, spec)
        except UpstreamRejected:
            endpoint.outstanding -= 1
            self.succeeded(endpoint)  # it answered; the request was wrong
            raise
        except BaseException as exc:
            endpoint.outstanding -= 1
            # a cancelled try says nothing about the endpoint, and a busy one is not broken
            if isinstance(exc, BackendError) and not _busy(exc) and not _suspect(exc):
                self.failed(endpoint)  # a suspect is judged by ``_first``
            raise
        finally:
            endpoint.prefilling -= prefill


def _give_up_if_ejected(endpoint: Endpoint, now: float) -> None:
    """An ejected endpoint's awaited whole bodies end now (``Pools.complete`` tries them
    elsewhere). One whose end has already fired is ending: it is left alone (its timeout
    can no longer be moved, and it is given up already)."""
    if endpoint.waiting and endpoint.health.ejected(now):
        at = asyncio.get_running_loop().time()
        for waiting in endpoint.waiting:
            if not waiting.expired():
                waiting.reschedule(at)


def _assembled(
    assemble: Assemble, pools: Pools
) -> Callable[[PoolSpec, Endpoint, _Read], Awaitable[_Read]]:
    """What follows a try whose stream opened: ``assemble`` folds it into one answer and
    closes it, which counts the outcome for its endpoint (``Opened.close``)."""

    async def then(spec: PoolSpec, endpoint: Endpoint, stream: _Read) -> _Read:
        assert isinstance(stream, UpstreamStream)  # what ``Pools._stream`` opened
        opened = Opened(spec, endpoint, stream, (), pools)
        try:
            answer = await assemble(opened)
        finally:
            opened.close()  # in case ``assemble`` failed before it could
        return orjson.dumps(answer), answer

    return then


def _broke(exc: BackendError) -> bool:
    """An answer that broke part way, with time left to try it again."""
    return isinstance(exc, StreamBroken) and not isinstance(exc, AnswerTimeout)


def _busy(exc: BackendError) -> bool:
    return isinstance(exc, Unavailable) and exc.status in (408, 429)


def _suspect(exc: BackendError) -> bool:
    return isinstance(exc, Unavailable) and exc.suspect


def _summary(errors: list[BackendError], attempts: list[Attempt], late: bool) -> BackendError:
    """The one error for a request every try failed; ``late`` when its time ran out."""
    tried = "; ".join(f"{a.pool} {a.url}: {a.error}" for a in attempts)
    if late:
        return UpstreamTimeout(f"the request's total_s ran out ({tried or 'nothing tried'})")
    if not errors:
        return Unavailable("no endpoint in any pool of the ladder")
    if all(isinstance(e, UpstreamTimeout) for e in errors):
        return UpstreamTimeout(f"every upstream timed out ({tried})")
    if all(isinstance(e, BadAnswer) for e in errors):
        return BadAnswer(f"no upstream answered with an answer ({tried})")
    if all(isinstance(e, Unavailable) and e.status == 429 for e in errors):
        return Unavailable(f"every upstream asked to wait ({tried})", 429)
    return Unavailable(f"no upstream could serve the request ({tried})")
