"""Load as the economic guardrail needs it: requests in flight per endpoint, over time, and
the prompt tokens each endpoint prefilled.

Two views of the load, from the pools' own in-flight counts (``Endpoint.outstanding``, which
the gateway raises when it sends a request and lowers when the answer ends, shadow mirrors
included, and integrates exactly over time: ``Endpoint.load``), read every ``interval_s`` by
a background task:

- per endpoint, the time integral of in-flight requests (kept for ``history_s``), so an
  outcome's mean load over its life is (integral at its end - integral at its start) / its
  duration: the batch its step times were measured at;
- per model, a smoothed mean of in-flight requests per endpoint over the model's whole
  ladder: the load a slice is judged at. It does not depend on where the slice itself is
  routed (moving a slice between rungs moves load between pools, not over the ladder), so
  judging at it does not make slices flap.

An endpoint's own count of the requests it runs and queues (``vllm:num_requests_running``
plus ``..._waiting``, read by ``gateway/measure/loadscrape.py``) also counts other gateway
replicas' requests. What it counts beyond this replica's own requests at the moment of the
reading (smoothed over readings, never below 0) is added to the endpoint's load until the
reading goes stale: the others' share. A reading is a snapshot, taken every few seconds:
taking the larger of it and the replica's own count would hold a moment's peak as a floor
until the next reading, and a meter that reads load too high where it is low flattens the
step-time line it feeds (``policies/steptime.py``).

Prefills: the gateway tells the meter when an endpoint prefilled a prompt (a stream's first
event comes once its prompt is prefilled; a whole answer's when it arrives), how many
tokens it had, and how many of them the endpoint was expected to compute: what the prefix
map did not believe it held (``backends/placement.py``: ``Affinity.uncached``), once an
answer of the endpoint has said its prefix cache held some of a prompt. So an outcome can
say how many prompt tokens were computed in the steps it decoded in (``prefilled``):
engines schedule prefills into the steps of the sequences decoding beside them, and a
conversation's turn whose history is cached computes only its new tokens. Counted whole,
an agent's turns would read as many times the prefill they are, and a prompt token's
price, learned from them (``policies/stepcurve.py``), as many times too cheap. The
prefills of one ``PREFILL_WINDOW_S`` (about an engine step, the resolution at which a
prefill and a decode step meet) are kept as one entry, dated at the first of them, so the
history costs at most one entry per window whatever the request rate (one entry per
request grew the gateway by ~70 bytes a request, up to twice ``history_s`` of requests).
An outcome's own prefill, told at its first token, is then always before its decode span:
a window dated at its last prefill would move it inside, and a long prompt's own prefill
would read as the steps' shared cost.

What an endpoint kept (``kept``): the map says what the endpoint was sent, not what its
cache still holds; an engine short of memory evicts a conversation between its turns. Each
answer that says how many prompt tokens were cached, of a prompt the map believed at least
``MIN_BELIEVED`` tokens of held there, gives the share of that belief the engine kept, and
the endpoint's ``kept`` is their moving mean (1 until an answer says otherwise). A prompt
counts as computed what the map did not believe held plus the part of the belief the
endpoint did not keep, and the price of moving a conversation
(``gateway/forward/moving.py``) weighs what each pool holds by it.

Never awaits on the request path; ``sample`` is O(endpoints), a question O(log history).
"""

from __future__ import annotations

import asyncio
import math
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from gateway.measure.acceptance import Outcome

SAMPLE_EVERY_S = 0.25  # how often a running gateway samples its endpoints' loads
PREFILL_WINDOW_S = 0.02  # prefills kept as one entry per endpoint per window (module docstring)
MIN_BELIEVED = 256  # prompt tokens believed cached for an answer to say what was kept
KEPT_WEIGHT = 0.2  # of each answer in the moving mean of what an endpoint kept


@dataclass(slots=True)
class Smoothed:
    """An exponentially weighted mean over time of a piecewise-constant signal."""

    tau_s: float = 10.0
    value: float | None = None
    last: float = 0.0
    at: float = 0.0

    def observe(self, now: float, value: float) -> None:
        if self.value is None:
            self.value, self.last, self.at = value, value, now
            return
        if now > self.at:
            keep = math.exp(-(now - self.at) / self.tau_s)
            self.value = self.value * keep + self.last * (1.0 - keep)
            self.at = now
        self.last = value


def _doubles() -> array[float]:
    return array("d")


@dataclass(slots=True)
class _Endpoint:
    count: float = 0.0
    area: float = 0.0
    at: float = 0.0
    own_area: float = 0.0
    others: float | None = None
    others_area: float = 0.0
    scraped_at: float = -math.inf
    # histories as packed doubles: 8 bytes an entry, where a list of floats takes 32
    times: array[float] = field(default_factory=_doubles)
    areas: array[float] = field(default_factory=_doubles)
    prefill_times: array[float] = field(default_factory=_doubles)
    prefilled: array[float] = field(default_factory=_doubles)
    # prompt tokens held by requests prefilled and not yet ended, and its time integral
    cached: dict[str, tuple[float, float]] = field(default_factory=dict)
    kv: float = 0.0
    kv_area: float = 0.0
    seq_area: float = 0.0
    kv_at: float = 0.0
    kv_times: array[float] = field(default_factory=_doubles)
    kv_areas: array[float] = field(default_factory=_doubles)
    seq_areas: array[float] = field(default_factory=_doubles)
    caches: bool = False  # an answer of it said its prefix cache held prompt tokens
    believed: dict[str, float] = field(default_factory=dict)  # per key, tokens held by the map
    kept: float = 1.0  # the share of what the map believed held that its answers found cached
    kept_answers: int = 0  # the answers that said it

    def kv_move(self, now: float, delta: float, seqs: int) -> None:
        """The cached prompt tokens change by ``delta`` and the decoding requests by
        ``seqs`` at ``now`` (one history entry per ``PREFILL_WINDOW_S``: the window's entry
        moved to its newest change)."""
        now = max(now, self.kv_at)
        self.kv_area += self.kv * (now - self.kv_at)
        self.seq_area += len(self.cached) * (now - self.kv_at)
        self.kv_at = now
        self.kv = max(self.kv + delta, 0.0)
        times = self.kv_times
        if len(times) >= 2 and now - times[-2] < PREFILL_WINDOW_S:
            times[-1], self.kv_areas[-1], self.seq_areas[-1] = now, self.kv_area, self.seq_area
            return
        times.append(now)
        self.kv_areas.append(self.kv_area)
        self.seq_areas.append(self.seq_area)

    def cached_at(self, t: float) -> tuple[float, float]:
        """The integrals of cached prompt tokens and of decoding requests up to ``t``,
        interpolated between entries."""
        if t >= self.kv_at:
            dt = t - self.kv_at
            return self.kv_area + self.kv * dt, self.seq_area + len(self.cached) * dt
        i = bisect_left(self.kv_times, t)
        if i == 0:
            return (self.kv_areas[0], self.seq_areas[0]) if self.kv_areas else (0.0, 0.0)
        t0, t1 = self.kv_times[i - 1], self.kv_times[i]
        f = (t - t0) / (t1 - t0) if t1 > t0 else 1.0
        kv = self.kv_areas[i - 1] + (self.kv_areas[i] - self.kv_areas[i - 1]) * f
        seqs = self.seq_areas[i - 1] + (self.seq_areas[i] - self.seq_areas[i - 1]) * f
        return kv, seqs

    def area_at(self, t: float) -> float:
        """The integral up to ``t``, interpolated between samples."""
        if t >= self.at:
            return self.area + self.count * (t - self.at)
        i = bisect_left(self.times, t)
        if i == 0:
            return self.areas[0] if self.areas else 0.0
        t0, t1, a0, a1 = self.times[i - 1], self.times[i], self.areas[i - 1], self.areas[i]
        return a0 + (a1 - a0) * (t - t0) / (t1 - t0) if t1 > t0 else a1

    def prefilled_by(self, t: float) -> float:
        """Prompt tokens prefilled up to and including ``t``."""
        i = bisect_right(self.prefill_times, t)
        return self.prefilled[i - 1] if i else 0.0

    def forget(self, before: float) -> None:
        for times, values in (
            (self.times, self.areas),
            (self.prefill_times, self.prefilled),
        ):
            i = bisect_left(times, before)
            if i > len(times) // 2:  # in halves: amortised O(1) per sample
                del times[:i], values[:i]
        i = bisect_left(self.kv_times, before)
        if i > len(self.kv_times) // 2:
            del self.kv_times[:i], self.kv_areas[:i], self.seq_areas[:i]
        stale = [key for key, (_, at) in self.cached.items() if at < before]
        if len(stale) > len(self.cached) // 2:  # requests that never ended: let them go
            for key in stale:
                self.kv_move(self.kv_at, -self.cached[key][0], -1)
                del self.cached[key]
                self.believed.pop(key, None)


class LoadMeter:
    """In-flight requests per endpoint and per ladder, and prefills per endpoint (module
    docstring)."""

    def __init__(
        self,
        counts: Callable[[], Mapping[str, Sequence[tuple[str, int, float]]]],
        ladders: Callable[[], Mapping[str, Sequence[str]]],
        *,
        tau_s: float = 10.0,
        gauge_fresh_s: float = 15.0,
        history_s: float = 900.0,
    ) -> None:
        self._history_s = history_s
        self._counts = counts
        self._ladders = ladders
        self._tau_s = tau_s
        self._fresh_s = gauge_fresh_s
        self._endpoints: dict[str, _Endpoint] = {}
        self._models: dict[str, Smoothed] = {}

    def sample(self, now: float) -> None:
        """Read every endpoint's in-flight count and integral; smooth the ladders' loads."""
        per_pool: dict[str, list[float]] = {}
        for pool, endpoints in self._counts().items():
            loads = per_pool.setdefault(pool, [])
            for raw, outstanding, own_area in endpoints:
                e = self._endpoint(raw, now)
                loads.append(self._advance(e, now, outstanding, own_area))
        for model, pools in self._ladders().items():
            loads = [x for p in pools for x in per_pool.get(p, ())]
            if loads:
                smoothed = self._models.setdefault(model, Smoothed(self._tau_s))
                smoothed.observe(now, sum(loads) / len(loads))

    def _endpoint(self, url: str, now: float) -> _Endpoint:
        key = url.rstrip("/")
        e = self._endpoints.get(key)
        if e is None:
            e = self._endpoints[key] = _Endpoint(at=now)
        return e

    def _advance(self, e: _Endpoint, now: float, outstanding: int, own_area: float) -> float:
        """Integrate one endpoint up to ``now``: its own requests exactly (``own_area``, the
        pool's integral; a new endpoint object starts its integral again), the others' share
        as a step between readings."""
        dt = max(now - e.at, 0.0)
        own = own_area - e.own_area if own_area >= e.own_area else outstanding * dt
        e.own_area = own_area
        others = e.others if e.others is not None and now - e.scraped_at <= self._fresh_s else 0.0
        others = max(others, 0.0)
        e.area += own + others * dt
        e.at = now
        e.count = outstanding + others
        e.times.append(now)
        e.areas.append(e.area)
        e.forget(now - self._history_s)
        return e.count

    def scraped(self, url: str, running: float, own: int, now: float) -> None:
        """A fresh reading of the requests one endpoint runs and queues, by its own count,
        taken while this replica had ``own`` requests in flight there."""
        e = self._endpoint(url, now)
        beyond = running - own
        e.others = beyond if e.others is None else 0.5 * e.others + 0.5 * beyond
        e.scraped_at = now

    def prefill(
        self, url: str, tokens: int, now: float, key: str = "", computed: int | None = None
    ) -> None:
        """``url`` prefilled a prompt of ``tokens`` by ``now``, of which it computed
        ``computed`` (None: all of them; the rest its prefix cache held); with ``key`` (the
        request's), its cache holds all ``tokens`` until ``release`` with the same key."""
        e = self._endpoint(url, now)
        if key and key not in e.cached:
            e.kv_move(now, max(tokens, 0), 1)
            e.cached[key] = (float(max(tokens, 0)), now)
            if computed is not None:
                e.believed[key] = float(max(tokens - computed, 0))
        times, totals = e.prefill_times, e.prefilled
        work = tokens
        if computed is not None and e.caches:
            work = tokens - round(e.kept * max(tokens - computed, 0))
        total = (totals[-1] if totals else 0.0) + max(work, 0)
        if times and now < times[-1]:
            now = times[-1]  # the clock is monotonic; a tie keeps the order
        if times and now - times[-1] < PREFILL_WINDOW_S:
            totals[-1] = total  # the window's entry, dated at its first prefill
            return
        times.append(now)
        totals.append(total)

    def caching(self, url: str, now: float) -> None:
        """An answer of ``url`` said its prefix cache held prompt tokens: from now on, its
        prompts count what it was expected to compute (``prefill``)."""
        self._endpoint(url, now).caches = True

    def release(self, url: str, key: str, now: float, cached_tokens: int | None = None) -> None:
        """The request ``key`` prefilled on ``url`` ended by ``now``: its cache is freed;
        ``cached_tokens``: how many of its prompt tokens its answer said were cached (None:
        it did not say), against what the map believed (module docstring, ``kept``)."""
        e = self._endpoints.get(url.rstrip("/"))
        held = e.cached.get(key) if e is not None and key else None
        if e is None or held is None:
            return
        e.kv_move(now, -held[0], -1)
        del e.cached[key]
        believed = e.believed.pop(key, None)
        if cached_tokens is not None and believed is not None and believed >= MIN_BELIEVED:
            share = min(max(cached_tokens, 0) / believed, 1.0)
            e.kept += KEPT_WEIGHT * (share - e.kept)
            e.kept_answers += 1

    def kept(self, url: str) -> float:
        """The share of what the prefix map believes ``url`` holds that its answers found
        cached lately (module docstring); 1 until one said."""
        e = self._endpoints.get(url.rstrip("/"))
        return e.kept if e is not None else 1.0

    def kept_shares(self) -> dict[str, tuple[float, int]]:
        """Per endpoint whose answers said it: its ``kept`` share and how many answers said
        it (for ``/admin/stats`` and the metrics)."""
        return {
            url: (e.kept, e.kept_answers) for url, e in self._endpoints.items() if e.kept_answers
        }

    def cached(self, url: str, since: float, until: float) -> tuple[float, float] | None:
        """Mean prompt tokens held in ``url``'s cache, and mean requests decoding there
        (prefilled and not ended: the engine's batch, where the in-flight count also holds
        those still queued), between ``since`` and ``until``, from the requests prefilled
        with a key; None without any."""
        e = self._endpoints.get(url.rstrip("/"))
        if e is None or until <= since or not e.kv_times:
            return None
        kv0, seqs0 = e.cached_at(since)
        kv1, seqs1 = e.cached_at(until)
        return (kv1 - kv0) / (until - since), (seqs1 - seqs0) / (until - since)

    def prefilled(self, url: str, since: float, until: float) -> float:
        """Prompt tokens ``url`` prefilled after ``since`` and by ``until``."""
        e = self._endpoints.get(url.rstrip("/"))
        if e is None or until <= since:
            return 0.0
        return e.prefilled_by(until) - e.prefilled_by(since)

    def mean(self, url: str, since: float, now: float) -> float | None:
        """Mean in-flight requests on ``url`` between ``since`` and ``now`` (at least 1: the
        request itself)."""
        e = self._endpoints.get(url.rstrip("/"))
        if now - since <= 0 or e is None:
            return None
        return max((e.area_at(now) - e.area_at(since)) / (now - since), 1.0)

    def ladder(self, model: str, now: float) -> float | None:
        """The smoothed mean in-flight requests per endpoint over ``model``'s ladder."""
        smoothed = self._models.get(model)
        return None if smoothed is None else smoothed.value

    async def run(self, clock: Callable[[], float], interval_s: float) -> None:
        while True:
            self.sample(clock())
            await asyncio.sleep(interval_s)


def loaded_outcome(load: LoadMeter, outcome: Outcome, key: str = "") -> Outcome:
    """``outcome`` with the load it ran at: the mean requests in flight on its endpoint over
    its life, the prompt tokens its endpoint prefilled per step while it decoded, and the
    prompt tokens its endpoint's cache held meanwhile and the requests decoding beside it
    (``kv`` and ``batch``: what its steps read and ran, from the requests told with a
    key). ``key``: the request's key at ``prefill`` (default its request id), released
    here."""
    url, end = outcome.labels.endpoint, outcome.started_at + outcome.duration_s
    if outcome.cached_tokens:
        load.caching(url, end)
    load.release(url, key or outcome.labels.request_id, end, outcome.cached_tokens)
    mean = load.mean(url, outcome.started_at, end)
    prefill = kv = batch = None
    if outcome.ttft_s is not None and outcome.decode_s and outcome.steps:
        first = outcome.started_at + outcome.ttft_s
        prefill = load.prefilled(url, first, first + outcome.decode_s) / outcome.steps
        cached = load.cached(url, first, first + outcome.decode_s)
        if cached is not None and cached[1] >= 1.0:
            kv, batch = cached
    return replace(outcome, load=mean or outcome.load, prefill=prefill, kv=kv, batch=batch)
