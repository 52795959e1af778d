"""Outlier detection with time as an argument: ejection, its limits, and the way back."""

from __future__ import annotations

import random
from dataclasses import replace

from backends.outlier import Detector, Health, HealthState, OutlierRules

RULES = OutlierRules(
    consecutive_failures=3,
    interval_s=10,
    base_ejection_s=30,
    max_ejection_s=90,
    max_ejection_percent=50,
    failure_percentage=80,
    failure_min_requests=10,
    slow_start_s=20,
)


def group(n: int) -> list[Health]:
    return [Health() for _ in range(n)]


def test_consecutive_failures_eject_and_a_success_resets_the_count():
    d, hosts = Detector(RULES), group(2)
    d.failure(hosts[0], hosts, 0.0)
    d.failure(hosts[0], hosts, 0.1)
    d.success(hosts[0], 0.2)
    d.failure(hosts[0], hosts, 0.3)
    d.failure(hosts[0], hosts, 0.4)
    assert not hosts[0].ejected(0.5)
    d.failure(hosts[0], hosts, 0.5)
    assert hosts[0].ejected(0.6) and hosts[0].ejected_until == 30.5
    assert hosts[0].state(0.6, RULES) is HealthState.EJECTED
    assert hosts[0].reason == "3 failures in a row"


def test_never_more_than_the_maximum_share_is_ejected_but_always_one_may_be():
    d = Detector(RULES)
    alone = group(1)
    for t in range(3):
        d.failure(alone[0], alone, float(t))
    assert alone[0].ejected(3.0)  # a pool of one: its only endpoint may go

    hosts = group(3)  # 50% of 3 is one endpoint
    for host in hosts:
        for t in range(3):
            d.failure(host, hosts, float(t))
    assert [h.ejected(3.0) for h in hosts] == [True, False, False]


def test_ejections_grow_with_repeats_up_to_the_maximum_and_are_forgiven_over_time():
    d, hosts = Detector(RULES), group(2)
    h = hosts[0]
    lengths = []
    now = 0.0
    for _ in range(4):
        for _ in range(3):
            d.failure(h, hosts, now)
        lengths.append(h.ejected_until - now)
        now = h.ejected_until
        d.sweep(hosts, now)
    assert lengths == [30, 60, 90, 90]
    assert h.multiplier == 4
    for i in range(3):  # three clean intervals in service forgive three ejections
        d.sweep(hosts, now + 10 * (i + 1))
    assert h.multiplier == 1
    for _ in range(3):
        d.failure(h, hosts, now + 40)
    assert h.ejected_until - (now + 40) == 60


def test_an_ejected_endpoint_that_serves_is_back_and_ramps_up():
    d, hosts = Detector(RULES), group(2)
    for t in range(3):
        d.failure(hosts[0], hosts, float(t))
    assert hosts[0].ejected(5.0)
    d.success(hosts[0], 5.0)
    assert not hosts[0].ejected(5.0)
    assert hosts[0].state(6.0, RULES) is HealthState.RETURNING
    assert hosts[0].weight(5.0, RULES.slow_start_s) == 0.1
    assert hosts[0].weight(15.0, RULES.slow_start_s) == 0.5
    assert hosts[0].weight(25.0, RULES.slow_start_s) == 1.0
    assert hosts[0].state(25.0, RULES) is HealthState.SERVING


def test_returning_when_the_time_is_up_also_ramps_up():
    d, hosts = Detector(RULES), group(2)
    for t in range(3):
        d.failure(hosts[0], hosts, float(t))
    back = hosts[0].ejected_until
    assert not hosts[0].ejected(back)
    assert hosts[0].weight(back + 2, RULES.slow_start_s) == 0.1
    assert hosts[0].weight(back + 10, RULES.slow_start_s) == 0.5


def test_failure_share_ejects_at_the_sweep_given_enough_volume():
    d, hosts = Detector(replace(RULES, consecutive_failures=100)), group(2)
    bad, fine = hosts
    for i in range(20):  # 85% failures, a success every seventh request
        if i % 7 == 0:
            d.success(bad, 0.0)
        else:
            d.failure(bad, hosts, 0.0)
    d.success(fine, 0.0)
    assert not bad.ejected(0.0)
    d.sweep(hosts, 10.0)
    assert bad.ejected(10.0) and not fine.ejected(10.0)
    assert bad.reason == "most requests failed in the last interval"
    assert bad.interval_ok == bad.interval_failed == 0  # a new interval starts


def test_success_rate_outliers_are_ejected_in_large_pools_only():
    rules = OutlierRules(success_rate_min_hosts=5, success_rate_min_requests=100)
    d = Detector(rules)
    hosts = group(6)
    for i, host in enumerate(hosts):
        host.interval_ok = 60 if i == 0 else 99
        host.interval_failed = 40 if i == 0 else 1
    d.sweep(hosts, 10.0)
    assert [h.ejected(10.0) for h in hosts] == [True] + [False] * 5

    small = group(4)
    for i, host in enumerate(small):
        host.interval_ok = 60 if i == 0 else 99
        host.interval_failed = 40 if i == 0 else 1
    d.sweep(small, 10.0)
    assert not any(h.ejected(10.0) for h in small)


def test_uniform_partial_failure_ejects_nobody_by_share_or_rate():
    """30% errors on every endpoint: none is an outlier by failure share or success rate;
    runs of failures in a row may eject one for a while, never more than the maximum."""
    rng = random.Random(7)
    d = Detector(OutlierRules())
    hosts = group(6)
    now = 0.0
    most = 0
    for _ in range(3000):
        now += 0.01
        for host in hosts:
            if rng.random() < 0.3:
                d.failure(host, hosts, now)
            else:
                d.success(host, now)
        if now % 10 < 0.01:
            d.sweep(hosts, now)
        most = max(most, sum(h.ejected(now) for h in hosts))
    assert most <= 3
    assert all(h.reason in ("", "5 failures in a row") for h in hosts)


def test_one_body_failing_again_and_again_never_counts():
    """A failure the request may have caused: the same body failing on an endpoint is that
    body's, however often it comes."""
    d, hosts = Detector(RULES), group(2)
    counted = [d.suspect(hosts[0], hosts, 0.1 * i, body=7) for i in range(12)]
    assert counted == [False] * 12
    assert hosts[0].consecutive == 0 and not hosts[0].ejected(2.0)


def test_different_bodies_failing_in_a_row_count_and_a_success_forgives():
    d, hosts = Detector(RULES), group(2)
    assert not d.suspect(hosts[0], hosts, 0.0, body=1)
    d.success(hosts[0], 0.1)  # others are served in between: nothing against it
    assert not d.suspect(hosts[0], hosts, 0.2, body=2)
    assert d.suspect(hosts[0], hosts, 0.3, body=3)  # another body failed too, back to back
    assert d.suspect(hosts[0], hosts, 0.4, body=3)  # failing already: it counts
    assert d.suspect(hosts[0], hosts, 0.5, body=4)
    assert hosts[0].ejected(0.6)


def test_a_suspect_after_a_plain_failure_counts():
    d, hosts = Detector(RULES), group(2)
    d.failure(hosts[0], hosts, 0.0)  # a reset connection, say
    assert d.suspect(hosts[0], hosts, 0.1, body=1)
    assert hosts[0].consecutive == 2


def test_a_body_every_endpoint_fails_is_the_requests_own_while_they_serve_others():
    d, hosts = Detector(RULES), group(3)
    assert not d.own(hosts, 0.0)  # none has served anything: maybe all are broken
    d.success(hosts[0], 1.0)
    assert d.own(hosts, 2.0)
    assert d.own(hosts[:2], 2.0)
    assert not d.own(hosts[:1], 2.0)  # one endpoint alone tells nothing
    assert not d.own([hosts[0], hosts[0]], 2.0)
    assert not d.own(hosts, 1.0 + RULES.interval_s)  # served, but not lately
