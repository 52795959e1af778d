"""One measurement of an answer: streamed event by event or whole, it folds the same
figures, checks and records once, tells the trace, and hands the canary the text."""

from __future__ import annotations

import asyncio
from contextlib import AbstractContextManager, nullcontext

import orjson
import pytest

from gateway.measure.acceptance import Fold, Labels, Outcome, Signal, Status
from gateway.measure.answer import Measurement
from gateway.measure.checks import Checks
from gateway.measure.completions import COMPLETIONS
from gateway.measure.validity import expect
from tests.fakes import FIXTURES, events

SPEC = Labels("tiny", "r", "r / t<=0.3", "spec", k=4)


class _Told:
    """A trace that writes down what it is told (the ``Trace`` protocol)."""

    def __init__(self) -> None:
        self.said: list[tuple[str, object]] = []

    def step(self, name: str) -> AbstractContextManager[object]:
        return nullcontext()

    def decided(self, features: object, decision: object) -> None:
        self.said.append(("decided", None))

    def inject(self, headers: object) -> None:
        pass

    def relaying(self) -> None:
        self.said.append(("relaying", None))

    def finished(self, outcome: Outcome) -> None:
        self.said.append(("finished", outcome.status))

    def end(self, status: int, error: BaseException | None = None) -> None:
        self.said.append(("end", status))


def _measured(
    *, trace: _Told | None = None, ends_trace: bool = False, capture=None, payload=None
) -> tuple[Measurement, list[Outcome]]:
    recorded: list[Outcome] = []
    measurement = Measurement(
        Fold(SPEC, 0.0, 0.001),
        lambda: 1.0,
        Checks(recorded.append),
        expect=expect(payload or {}),
        trace=trace,
        ends_trace=ends_trace,
        capture=capture,
    )
    return measurement, recorded


def _stream(measurement: Measurement, name: str) -> None:
    for i, data in enumerate(events(name), start=1):
        if data != b"[DONE]":
            COMPLETIONS.event(measurement, orjson.loads(data), i * 0.01)


def _whole(name: str) -> dict[str, object]:
    return orjson.loads((FIXTURES / name).read_bytes())


def _answered(way: str, **given) -> Outcome:
    """The draft pool's answer, ``way`` "stream" (event by event) or "whole", measured."""
    measurement, recorded = _measured(**given)
    if way == "stream":
        _stream(measurement, "draft/chat-stream-include-usage.sse")
    else:
        COMPLETIONS.whole(measurement, _whole("draft/chat-nonstream.json"))
    measurement.finish(Status.OK)
    (outcome,) = recorded
    return outcome


@pytest.mark.anyio
async def test_a_stream_and_the_same_answer_whole_measure_the_same():
    texts = []
    outcomes = []
    for way in ("stream", "whole"):
        capture = asyncio.get_running_loop().create_future()
        outcomes.append(_answered(way, capture=capture))
        texts.append(await capture)
    streamed, whole = outcomes
    assert streamed.signal is whole.signal is Signal.PER_REQUEST
    figures = ("completion_tokens", "prompt_tokens", "drafted", "accepted", "steps")
    assert [getattr(streamed, f) for f in figures] == [getattr(whole, f) for f in figures]
    assert (streamed.drafted, streamed.accepted, streamed.steps) == (68, 14, 17)
    assert streamed.finish_reason == whole.finish_reason == "length"
    body = _whole("draft/chat-nonstream.json")
    assert texts[0] == texts[1] == body["choices"][0]["message"]["content"]
    metrics = body["metrics"]
    assert streamed.ttft_s == pytest.approx(0.02)  # the first content event's time
    engine = (metrics["time_to_first_token_ms"] + metrics["queue_time_ms"]) / 1000
    assert whole.ttft_s == pytest.approx(engine)  # no token times seen whole: the engine's


def test_a_whole_answer_takes_the_engines_timings_where_it_saw_none():
    measurement, recorded = _measured()
    body = _whole("draft/chat-nonstream.json")
    body["metrics"] = {"time_to_first_token_ms": 20.0, "queue_time_ms": 5.0, "mean_itl_ms": 4.0}
    COMPLETIONS.whole(measurement, body)
    measurement.finish(Status.OK)
    (outcome,) = recorded
    assert outcome.ttft_s == pytest.approx(0.025) and outcome.tpot_s == pytest.approx(0.004)
    assert outcome.queue_s == pytest.approx(0.005)


def test_the_answer_ends_once_and_tells_the_trace_and_ends_it_when_it_is_a_stream():
    for ends in (True, False):
        trace = _Told()
        measurement, recorded = _measured(trace=trace, ends_trace=ends)
        _stream(measurement, "draft/chat-stream-include-usage.sse")
        assert measurement.finish(Status.OK) is not None
        assert measurement.finish(Status.ERROR, "again") is None
        assert [o.status for o in recorded] == [Status.OK]
        told = [("relaying", None), ("finished", Status.OK)] + ([("end", 200)] if ends else [])
        assert trace.said == told


@pytest.mark.anyio
async def test_a_failed_answer_cancels_the_canary_and_counts_as_an_error():
    capture = asyncio.get_running_loop().create_future()
    measurement, recorded = _measured(capture=capture)
    _stream(measurement, "draft/chat-stream.sse")
    measurement.finish(Status.ERROR, "stream broke after it started")
    assert capture.cancelled()
    assert recorded[0].status is Status.ERROR and recorded[0].error


def test_the_answer_is_checked_against_what_was_asked_streamed_or_whole():
    asked = {"response_format": {"type": "json_object"}}
    for way in ("stream", "whole"):
        assert _answered(way, payload=asked).checks == (("json_object", "truncated"),), way


def test_whether_each_answer_said_its_speculation_is_reported_once_per_usage():
    seen: list[bool] = []
    measurement = Measurement(
        Fold(SPEC, 0.0), lambda: 1.0, Checks(lambda o: None), on_reported=seen.append
    )
    _stream(measurement, "draft/chat-stream-include-usage.sse")
    assert seen == [True]  # vLLM's metrics.speculative_decoding, on its usage chunk


@pytest.mark.parametrize(
    ("event", "failure"),
    [
        ({"error": {"message": "bad", "code": 400}}, ("upstream error: bad", 400)),
        ({"error": {"message": "oops", "code": "x"}}, ("upstream error: oops", None)),
        ({"error": "plain"}, ("upstream error: plain", None)),
        ({"choices": [{"delta": {"content": "a"}}], "error": None}, None),
        ({"usage": {"completion_tokens": 1}}, None),
    ],
)
def test_the_completions_dialect_knows_an_error_event(event, failure):
    measurement, _ = _measured()
    assert COMPLETIONS.event(measurement, event, 0.5) == failure
