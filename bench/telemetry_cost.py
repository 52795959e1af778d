"""What a request's metrics, spans and outcome record cost, in-process: the calls the pipeline
makes around one served request (steps' spans, the decision's attributes, the upstream trace
context, recording the outcome), timed alone with nothing exported. Run it in two trees to
compare a change with the commit before it:

    PYTHONPATH=/path/to/before .venv/bin/python bench/telemetry_cost.py
    PYTHONPATH=. .venv/bin/python bench/telemetry_cost.py

Trees before one trace per request (no ``Telemetry.tracing``) get their four step spans
and their records instead, so the two lines compare the same request.
"""

from __future__ import annotations

import argparse
import timeit
from collections.abc import Callable
from typing import Any

from starlette.datastructures import Headers

from gateway.measure.acceptance import Labels, Outcome, Signal, Status
from gateway.measure.telemetry import Telemetry

HEADERS = Headers(
    raw=[
        (b"content-type", b"application/json"),
        (b"accept", b"*/*"),
        (b"user-agent", b"bench"),
        (b"host", b"gateway"),
        (b"content-length", b"100"),
    ]
)
PAYLOAD = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 0.2}


def _outcome(telemetry: Telemetry) -> Outcome:
    extra: dict[str, Any] = {"drafted": 60, "accepted": 40, "steps": 20, "decode_s": 0.5}
    if hasattr(telemetry, "tracing"):
        extra |= {"admission_s": 0.0002, "queue_s": 0.001}
    labels = Labels("m", "default", "default / t<=0.3 / ctx<4k", "spec", 4, "http://x")
    return Outcome(
        labels, Status.OK, 0.0, 1.0, 0.05, 0.01, 10, 40, 20, Signal.PER_REQUEST, load=2.0, **extra
    )


def one_request(telemetry: Telemetry) -> Callable[[], None]:
    outcome = _outcome(telemetry)
    if not hasattr(telemetry, "tracing"):
        tracer: Any = telemetry.tracer  # type: ignore[attr-defined]

        def before() -> None:
            for step in ("parse", "classify", "decide", "forward"):
                with tracer.start_as_current_span(step):
                    pass
            telemetry.opened("spec", False)
            telemetry.observe(outcome)

        return before

    from gateway.measure.outcomelog import OutcomeLog
    from gateway.measure.validity import expect
    from policies.decision import Decision
    from policies.features import Features

    log = OutcomeLog(lambda pool: None)
    features = Features("/v1/chat/completions", "m")
    decision = Decision("default", "default / t<=0.3 / ctx<4k", "spec", ("spec",), 0, 0, "x")

    def after() -> None:
        trace = telemetry.tracing.begin(HEADERS, "chat")
        for step in ("parse", "classify", "decide"):
            with trace.step(step):
                pass
        trace.decided(features, decision)
        expect(PAYLOAD)
        forward: dict[str, str] = {}
        with trace.step("forward"):
            trace.inject(forward)
        trace.relaying()
        telemetry.opened("spec", False)
        telemetry.observe(outcome)
        log.add(outcome, 0.0)
        trace.finished(outcome)
        trace.end(200)

    return after


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=100_000)
    args = parser.parse_args()
    request = one_request(Telemetry.build())
    best = min(timeit.repeat(request, number=args.iterations, repeat=5)) / args.iterations
    print(f"telemetry around one request: {best * 1e6:.2f} us")


if __name__ == "__main__":
    main()
