"""Step 7's fan-out: one outcome reaches live stats, the metrics, the signal counts and the
outcome log at one wall time, with its mean load; the canary's verdict becomes an alarm."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from prometheus_client import generate_latest

from gateway.measure.acceptance import Labels, Outcome, Signal, Status
from gateway.measure.canary import CanaryCounts
from gateway.measure.feedback import Feedback
from gateway.measure.livestats import LiveStats
from gateway.measure.load import LoadMeter
from gateway.measure.outcomelog import OutcomeLog
from gateway.measure.signals import SignalsSeen
from gateway.measure.telemetry import Telemetry
from policies.compiled import load_policy

POLICY = load_policy(
    """
version: 1
pools:
  spec: {kind: speculative, model: m, num_speculative_tokens: 4, endpoints: ["http://a"],
         cost_per_hour: 3.0}
  standard: {kind: standard, model: m, endpoints: ["http://b"]}
ladder: [spec, standard]
rules: [{name: default, start: spec}]
"""
)
KEY = "default / slice"
WALL = 1_000.0


def _feedback() -> tuple[Feedback, LiveStats, Telemetry, LoadMeter]:
    def counts() -> dict[str, list[tuple[str, int, float]]]:
        # four requests in flight on the spec endpoint since 0: its integral is 4 t
        return {"spec": [("http://a", 4, 4.0 * now[0])], "standard": [("http://b", 0, 0.0)]}

    now = [0.0]
    load = LoadMeter(counts, lambda: {"m": ("spec", "standard")})
    load.sample = _at(now, load.sample)  # type: ignore[method-assign]
    stats = LiveStats(lambda: POLICY)
    telemetry = Telemetry.build()
    outcomes = OutcomeLog(POLICY.price)
    feedback = Feedback(stats, telemetry, SignalsSeen(), outcomes, load, lambda: WALL)
    return feedback, stats, telemetry, load


def _at(now: list[float], sample: Callable[[float], None]) -> Callable[[float], None]:
    """``sample`` with the endpoints' integrals read at the time sampled."""

    def at(t: float) -> None:
        now[0] = t
        sample(t)

    return at


def _outcome(started: float, duration: float) -> Outcome:
    return Outcome(
        labels=Labels("m", "default", KEY, "spec", 4, endpoint="http://a"),
        status=Status.OK,
        started_at=started,
        duration_s=duration,
        ttft_s=0.05,
        tpot_s=0.01,
        prompt_tokens=10,
        completion_tokens=40,
        chunks=20,
        signal=Signal.PER_REQUEST,
        drafted=60,
        accepted=30,
        steps=12,
    )


def test_one_outcome_reaches_every_sink_at_one_wall_time_with_its_load():
    feedback, stats, telemetry, load = _feedback()
    load.sample(0.0)
    load.sample(10.0)  # four requests in flight on the endpoint all along
    telemetry.opened("spec", shadow=False)
    feedback.record(_outcome(started=2.0, duration=5.0))

    (record,) = feedback.outcomes.recent()
    assert record["at"] == WALL and record["cost_per_hour"] == 3.0
    assert record["serving_s"] == pytest.approx(5.0 / 4)  # its share of a server at load 4
    assert stats.views.summary(WALL)[KEY]["pools"]["spec"]["requests"] == 1
    assert feedback.signals.of("spec") == {"last": "per_request", "counts": {"per_request": 1}}
    telemetry.push()
    exposed = generate_latest(telemetry.exposition).decode()
    counted = 'speclane_requests_total{endpoint="/v1/chat/completions",model="m",pool="spec"'
    assert counted + ',rule="default"' in exposed
    assert 'speclane_accepted_draft_tokens_total{pool="spec",rule="default"' in exposed


def test_an_outcome_off_any_measured_endpoint_keeps_no_load():
    feedback, _, _, _ = _feedback()
    feedback.record(_outcome(started=2.0, duration=5.0))  # the meter never sampled
    (record,) = feedback.outcomes.recent()
    assert record["serving_s"] is None


def test_a_failed_canary_drops_the_slice_one_rung_with_its_numbers():
    feedback, stats, _, _ = _feedback()
    feedback.record(_outcome(started=2.0, duration=5.0))
    feedback.canary_failed(KEY, CanaryCounts(compared=20, matched=15))
    (event,) = stats.events
    assert event.after.offset == 1 and event.at == WALL
    assert event.reason == "canary: greedy output differs on speculation (exact match 75.0%)"
    assert event.numbers == {"compared": 20.0, "exact_match_rate": 0.75}
