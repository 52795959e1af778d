"""Outlier detection per endpoint, after Envoy's. Pure state; time is an argument.

An endpoint is *ejected* (taken out of load balancing) when

- it failed ``consecutive_failures`` times in a row: refused or reset connections, 5xx
  answers, timeouts before the first event, and streams that broke after it all count;
- or, in one ``interval_s``, at least ``failure_percentage`` % of at least
  ``failure_min_requests`` requests failed;
- or, in a pool with at least ``success_rate_min_hosts`` endpoints that each served
  ``success_rate_min_requests`` in the interval, its success rate is below the pool's mean
  by more than ``success_rate_stdev_factor`` standard deviations.

Never more than ``max_ejection_percent`` of a pool is ejected (but always one may be). An
ejection lasts ``base_ejection_s`` times the number of ejections not yet forgiven, at most
``max_ejection_s``; every interval an endpoint stays in service forgives one. An endpoint
returns when its time is up, or at once when it serves a request (an ejected endpoint is
still tried when every endpoint in service failed: see ``backends/pool.py``). It returns
gradually: its share of the load grows from a tenth to all of it over ``slow_start_s``, so a
burst after recovery is spread, not refused. A 429 or 408 says the endpoint is busy, not
broken: it neither counts as a failure nor as a success.

A failure the request itself may have caused (an answer, in the engine's API shape, that
the request failed, which the same body may get from every endpoint) is judged by what else
the endpoints do, as ``backends/pool.py`` reports it once the request's tries are over. Served
by another endpoint, it was a plain failure. Failed alike by every endpoint tried (two or
more) while one of them has served other requests in the last ``interval_s``, it was the
request's own and counts nowhere (``own``). Otherwise it counts only when other requests
fail on the endpoint too: when it has failed a different body, or failed in another way,
since it last served a request (``suspect``). So one client's run of bad requests never
ejects endpoints that serve everyone else's, and endpoints that fail every request still
are.

Explained for operators, with its numbers, in docs/operations.md ("Upstream failures:
outlier ejection").
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

_NEVER = -math.inf
_MIN_WEIGHT = 0.1


@dataclass(frozen=True, slots=True)
class OutlierRules:
    """When endpoints are ejected, and for how long. Defaults follow Envoy's where a pool
    of a few large servers makes sense of them (Envoy ejects at most 10% of a cluster)."""

    consecutive_failures: int = 5
    interval_s: float = 10.0
    base_ejection_s: float = 30.0
    max_ejection_s: float = 300.0
    max_ejection_percent: float = 50.0
    failure_percentage: float = 85.0
    failure_min_requests: int = 20
    success_rate_min_hosts: int = 5
    success_rate_min_requests: int = 100
    success_rate_stdev_factor: float = 1.9
    slow_start_s: float = 30.0


class HealthState(StrEnum):
    SERVING = "serving"
    EJECTED = "ejected"
    RETURNING = "returning"  # back in service, still ramping up its share


@dataclass(slots=True)
class Health:
    """One endpoint's record: what the detector counts and decides."""

    consecutive: int = 0
    ejected_until: float = _NEVER
    returned_at: float = _NEVER
    multiplier: int = 0
    interval_ok: int = 0
    interval_failed: int = 0
    ejections_total: int = 0
    failures_total: int = 0
    reason: str = ""
    suspect: int | None = None  # the body of a suspect failure not counted, since a success
    served_at: float = _NEVER

    def ejected(self, now: float) -> bool:
        return now < self.ejected_until

    def weight(self, now: float, slow_start_s: float) -> float:
        """The endpoint's share of load, from 0.1 right after it returns to 1."""
        since = now - self.returned_at
        if since >= slow_start_s:
            return 1.0
        return max(_MIN_WEIGHT, since / slow_start_s)

    def state(self, now: float, rules: OutlierRules) -> HealthState:
        if self.ejected(now):
            return HealthState.EJECTED
        if now - self.returned_at < rules.slow_start_s:
            return HealthState.RETURNING
        return HealthState.SERVING


class Detector:
    """Applies ``OutlierRules`` to the endpoints of one pool (passed in as ``group``)."""

    def __init__(self, rules: OutlierRules) -> None:
        self.rules = rules

    def success(self, health: Health, now: float) -> None:
        health.consecutive = 0
        health.suspect = None
        health.served_at = now
        health.interval_ok += 1
        if health.ejected(now):  # it served while ejected: it is back
            health.ejected_until = health.returned_at = now
            health.reason = ""

    def failure(self, health: Health, group: Sequence[Health], now: float) -> None:
        health.consecutive += 1
        health.interval_failed += 1
        health.failures_total += 1
        limit = self.rules.consecutive_failures
        if health.consecutive >= limit and not health.ejected(now):
            self._eject(health, group, now, f"{limit} failures in a row")

    def own(self, failed: Sequence[Health], now: float) -> bool:
        """Whether a failure that every one of ``failed`` (the endpoints a request was
        tried on, each answering that it failed the request) gave alike was the request's
        own: two or more failed it, and one of them has served others lately."""
        distinct = list({id(h): h for h in failed}.values())
        recent = self.rules.interval_s
        return len(distinct) >= 2 and any(now - h.served_at < recent for h in distinct)

    def suspect(self, health: Health, group: Sequence[Health], now: float, body: int) -> bool:
        """A failure of the request whose body hashes to ``body`` that the request itself may
        have caused: a failure when the endpoint has failed another body, or failed in
        another way, since it last served a request; else only remembered. Whether it
        counted."""
        counts = health.consecutive > 0 or health.suspect not in (None, body)
        health.suspect = body
        if counts:
            self.failure(health, group, now)
        return counts

    def sweep(self, group: Sequence[Health], now: float) -> None:
        """The end of an interval: eject by failure share and success rate, forgive one
        ejection of every endpoint that stayed in service, start counting afresh."""
        for health in self._by_failure_percentage(group):
            self._eject(health, group, now, "most requests failed in the last interval")
        for health in self._by_success_rate(group):
            self._eject(health, group, now, "success rate far below the pool's")
        for health in group:
            if not health.ejected(now) and health.multiplier > 0 and not health.interval_failed:
                health.multiplier -= 1
            health.interval_ok = health.interval_failed = 0

    def _by_failure_percentage(self, group: Sequence[Health]) -> list[Health]:
        rules = self.rules
        out = []
        for health in group:
            total = health.interval_ok + health.interval_failed
            share = 100 * health.interval_failed / total if total else 0.0
            if total >= rules.failure_min_requests and share >= rules.failure_percentage:
                out.append(health)
        return out

    def _by_success_rate(self, group: Sequence[Health]) -> list[Health]:
        rules = self.rules
        volume = [
            h for h in group if h.interval_ok + h.interval_failed >= rules.success_rate_min_requests
        ]
        if len(volume) < rules.success_rate_min_hosts:
            return []
        rates = [h.interval_ok / (h.interval_ok + h.interval_failed) for h in volume]
        floor = statistics.fmean(rates) - rules.success_rate_stdev_factor * statistics.pstdev(rates)
        return [h for h, rate in zip(volume, rates, strict=True) if rate < floor]

    def _eject(self, health: Health, group: Sequence[Health], now: float, reason: str) -> None:
        if health.ejected(now) or not self._may_eject(group, now):
            return
        rules = self.rules
        health.multiplier += 1
        ceiling = max(rules.max_ejection_s, rules.base_ejection_s)
        duration = min(rules.base_ejection_s * health.multiplier, ceiling)
        health.ejected_until = health.returned_at = now + duration
        health.consecutive = 0
        health.ejections_total += 1
        health.reason = reason

    def _may_eject(self, group: Sequence[Health], now: float) -> bool:
        allowed = max(1, int(len(group) * self.rules.max_ejection_percent / 100))
        return sum(h.ejected(now) for h in group) < allowed
