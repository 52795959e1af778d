"""The load meter: requests in flight per endpoint, integrated exactly; other replicas' share
from the endpoints' own counts; prompts prefilled beside a request."""

from __future__ import annotations

import dataclasses

import pytest

from backends.pool import InFlight
from gateway.measure.acceptance import Labels, Outcome, Signal, Status
from gateway.measure.load import (
    KEPT_WEIGHT,
    MIN_BELIEVED,
    PREFILL_WINDOW_S,
    LoadMeter,
    loaded_outcome,
)

URL = "http://spec:8000"
LABELS = Labels(model="m", rule="r", slice="s", pool="spec", k=4, endpoint=URL)
DECODED = Outcome(  # a request of 200 prompt tokens, decoded from 0.5 s to 6 s
    labels=LABELS,
    status=Status.OK,
    started_at=0.0,
    duration_s=6.0,
    ttft_s=0.5,
    tpot_s=0.05,
    prompt_tokens=200,
    completion_tokens=101,
    chunks=41,
    signal=Signal.PER_REQUEST,
    steps=40,
    decode_s=5.5,
)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def meter(flight: InFlight, fresh_s: float = 15.0) -> LoadMeter:
    return LoadMeter(
        lambda: {"spec": [(URL, flight.count, flight.area())]},
        lambda: {"m": ["spec"]},
        gauge_fresh_s=fresh_s,
    )


def test_the_load_between_samples_is_integrated_exactly():
    clock = Clock()
    flight = InFlight(clock)
    load = meter(flight)
    load.sample(0.0)
    for at, count in ((0.1, 1), (0.2, 2), (0.3, 1), (0.35, 4)):  # moves between samples
        clock.now = at
        flight.move(count)
    clock.now = 1.0
    load.sample(1.0)
    exact = 0.1 * 0 + 0.1 * 1 + 0.1 * 2 + 0.05 * 1 + 0.65 * 4
    assert load.mean(URL, 0.0, 1.0) == pytest.approx(exact)
    # a count sampled at 0 and at 1 alone would say 0 for the first second


def test_a_gauge_adds_what_other_replicas_send_and_holds_no_moment_as_a_floor():
    clock = Clock()
    flight = InFlight(clock)
    load = meter(flight, fresh_s=10.0)
    flight.move(4)
    load.sample(0.0)
    load.scraped(URL, 4.0, own=4, now=0.0)  # the engine counts exactly ours
    clock.now = 1.0
    flight.move(1)  # three of ours finished
    load.sample(1.0)
    clock.now = 2.0
    load.sample(2.0)
    assert load.mean(URL, 1.0, 2.0) == pytest.approx(1.0)  # not 4 until the next reading
    load.scraped(URL, 7.0, own=1, now=2.0)  # six requests of other replicas
    clock.now = 3.0
    load.sample(3.0)
    assert 3.0 <= load.mean(URL, 2.0, 3.0) <= 7.0  # smoothed towards 1 + 6
    clock.now = 20.0
    load.sample(20.0)  # the reading went stale: ours alone again
    clock.now = 21.0
    load.sample(21.0)
    assert load.mean(URL, 20.0, 21.0) == pytest.approx(1.0)


def test_prompts_prefilled_while_a_request_decoded_are_counted_per_step():
    clock = Clock()
    flight = InFlight(clock)
    load = meter(flight)
    load.sample(0.0)
    load.prefill(URL, 200, 0.5)  # the request itself: prefilled before its first token
    load.prefill(URL, 5000, 2.0)
    load.prefill(URL, 1000, 3.0)
    load.prefill(URL, 9999, 7.0)  # after it ended
    assert load.prefilled(URL, 0.5, 6.0) == 6000
    clock.now = 6.0
    load.sample(6.0)
    assert loaded_outcome(load, DECODED).prefill == pytest.approx(6000 / 40)


def test_prefills_cost_one_entry_per_window_whatever_the_request_rate():
    """A thousand prefills a second for 100 s keep at most one entry per window, and what
    a window of time prefilled is still read to within a window at each end."""
    flight = InFlight(Clock())
    load = meter(flight)
    for i in range(100_000):
        load.prefill(URL, 10, i / 1000)
    kept = load._endpoints[URL].prefill_times
    assert len(kept) <= 100 / PREFILL_WINDOW_S + 1
    assert load.prefilled(URL, -1.0, 100.0) == 1_000_000
    read = load.prefilled(URL, 40.0, 60.0)
    assert abs(read - 200_000) <= 2 * PREFILL_WINDOW_S * 1000 * 10


def test_an_outcomes_own_prefill_stays_before_its_decode_span():
    """A long prompt prefilled at its first token, and a short one a moment later in the
    same window: what prefilled while the long one decoded never holds its own prompt."""
    load = meter(InFlight(Clock()))
    first = 10.001
    load.prefill(URL, 24_000, first)  # the outcome's own, told at its first token
    load.prefill(URL, 100, first + PREFILL_WINDOW_S / 2)
    assert load.prefilled(URL, first, 20.0) < 24_000


def test_the_cache_a_request_decoded_beside_is_what_the_others_held_meanwhile():
    """Prompts held from their prefill to their outcome: a request's decode span reads the
    mean cached tokens and the mean requests decoding (queued ones are in flight, not in
    the batch)."""
    clock = Clock()
    load = meter(InFlight(clock))
    load.prefill(URL, 1000, 0.0, "a")  # decodes 0-10
    load.prefill(URL, 9000, 2.0, "b")  # decodes 2-6
    load.release(URL, "b", 6.0)
    load.prefill(URL, 500, 6.0, "c")  # ... and 6-10
    load.release(URL, "missing", 7.0)  # never prefilled here: nothing changes
    load.release(URL, "c", 10.0)
    held = load.cached(URL, 0.0, 10.0)
    assert held is not None
    kv, batch = held
    assert kv == pytest.approx((1000 * 10 + 9000 * 4 + 500 * 4) / 10)
    assert batch == pytest.approx((10 + 4 + 4) / 10)
    assert load.cached(URL, 10.0, 12.0) == pytest.approx((1000.0, 1.0))
    load.release(URL, "a", 12.0)
    assert load.cached(URL, 12.0, 14.0) == pytest.approx((0.0, 0.0))


def test_an_outcome_carries_its_batch_and_cache_and_frees_its_prompt():
    clock = Clock()
    flight = InFlight(clock)
    load = meter(flight)
    load.sample(0.0)
    load.prefill(URL, 12000, 0.5, "long")
    load.prefill(URL, 200, 0.5, "own")
    outcome = dataclasses.replace(DECODED, labels=dataclasses.replace(LABELS, request_id="own"))
    clock.now = 6.0
    load.sample(6.0)
    loaded = loaded_outcome(load, outcome)
    assert loaded.kv == pytest.approx(12200) and loaded.batch == pytest.approx(2.0)
    assert load.cached(URL, 6.0, 7.0) == pytest.approx((12000.0, 1.0))  # its own freed


def test_a_caching_endpoints_prompts_count_what_it_was_expected_to_compute():
    """A conversation's turn whose history the endpoint holds computes only its new tokens;
    counted whole, an agent's turns read as many times the prefill they are. Until an answer
    says the endpoint's cache held something, every prompt counts whole."""
    clock = Clock()
    load = meter(InFlight(clock))
    load.sample(0.0)
    load.prefill(URL, 30_000, 1.0, "t1", computed=2_000)
    assert load.prefilled(URL, 0.0, 1.0) == 30_000  # not known to cache yet
    answer = dataclasses.replace(
        DECODED,
        labels=dataclasses.replace(LABELS, request_id="t1"),
        duration_s=2.5,  # ended at 2.5 s
        prompt_tokens=30_000,
        cached_tokens=28_000,  # all that the map believed it held
    )
    loaded_outcome(load, answer)
    load.prefill(URL, 32_000, 3.0, "t2", computed=2_000)
    load.prefill(URL, 900, 3.5, "other")  # nothing known of it: whole
    assert load.prefilled(URL, 2.9, 4.0) == 2_900
    load.sample(4.0)
    assert load.cached(URL, 3.6, 4.0) == pytest.approx((32_900.0, 2.0))  # all of it held


def test_an_endpoint_that_evicts_what_it_was_sent_is_believed_to_keep_less():
    """The map says what an endpoint was sent; its answers say what its cache still held.
    An engine short of memory evicts conversations between their turns: its prompts then
    count what it recomputes, and what it holds is weighed by what it keeps."""
    clock = Clock()
    load = meter(InFlight(clock))
    load.sample(0.0)
    assert load.kept(URL) == 1.0 and load.kept_shares() == {}  # nothing said yet
    for i in range(20):  # every answer finds a quarter of what the map believed held
        key = f"t{i}"
        load.prefill(URL, 40_000, 1.0 + i, key, computed=4_000)
        answer = dataclasses.replace(
            DECODED,
            labels=dataclasses.replace(LABELS, request_id=key),
            started_at=1.0 + i,
            duration_s=0.5,
            prompt_tokens=40_000,
            cached_tokens=9_000,
        )
        loaded_outcome(load, answer)
    assert load.kept(URL) == pytest.approx(0.25, abs=0.75 * (1 - KEPT_WEIGHT) ** 20 + 1e-9)
    assert load.kept_shares() == {URL.rstrip("/"): (load.kept(URL), 20)}
    load.prefill(URL, 40_000, 30.0, "next", computed=4_000)
    # the 4,000 it was expected to compute, and the ~three quarters of the rest it lost
    assert load.prefilled(URL, 29.9, 30.1) == 40_000 - round(load.kept(URL) * 36_000)
    # answers that say nothing, or of prompts hardly believed held, change nothing
    before = load.kept(URL)
    load.prefill(URL, 1_000, 31.0, "short", computed=1_000 - MIN_BELIEVED + 1)
    load.release(URL, "short", 31.5, cached_tokens=0)
    load.prefill(URL, 40_000, 32.0, "silent", computed=4_000)
    load.release(URL, "silent", 32.5, cached_tokens=None)
    assert load.kept(URL) == before
